// PERK's kernels on the device (csrc/perk.h), float32 with float64 accumulation across tiles, for the nvcc
// library. The feature function and the checks are csrc/include/blochsim/perk.hpp's, shared with the host.
//
// A block of 256 threads owns a tile of 64 rows (voxels or samples) and runs over 64-feature tiles; a
// thread holds 4 x 4 entries of a tile (rows ty + 16 i, features tx + 16 j). u = x W^T + b is formed 16
// input columns at a time through shared memory, then
//   map       z = cos u, and each voxel's heads sum z H^T over the tile's features (a shuffle over the 16
//             threads of a row), added in float64 per voxel;
//   VJP       q = -sin(u) * (G H), stored transposed in shared memory, and dX = q W for one 64-column tile of
//             the inputs (a third grid axis over the input columns; u is formed again for each);
//   fit       Z = cos u into the caller's scratch [n, F]; then one block per upper pair of 64-feature tiles
//             sums Z^T Z over the samples (float over 256 samples, float64 beyond) and writes both halves;
//             one thread per feature sums Z^T Y and Z in float64.
// When the voxel tiles alone would not fill the card (fewer than 4 blocks per multiprocessor), a second grid
// axis splits the features: each split writes float64 partial sums to scratch, and a second kernel adds them
// in split order. No atomics: every output element has one writer, so runs are bitwise reproducible.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "blochsim/abi_guard.hpp"
#include "blochsim/perk.hpp"
#include "perk.h"

namespace bs {
namespace perk_device {

constexpr int kTile = static_cast<int>(perk::kFeatureTile);  // rows and features of a block's tile
constexpr int kStep = 16;     // input columns per shared-memory step
constexpr int kThreads = 256; // 16 x 16
constexpr int kBlocksPerSm = 4;

struct Problem {
  int64_t V, D, F, T;       // rows, input columns, features, heads (or targets)
  const float* X;           // [V, D]
  const float* W;           // [F, D]
  const float* Wt;          // [D, F]
  const float* b;           // [F]
  int64_t per_split;        // features per split (a multiple of kTile)
  int32_t splits;
};

struct Staging {  // the shared tiles of one product step
  float a[kStep][kTile + 1];  // rows' inputs, column-major (padded: the loads' stores spread over banks)
  float b[kStep][kTile];      // W^T tile
};

// u[i][j] = x_{v0 + ty + 16 i} . W_{f0 + tx + 16 j} + b: zero for rows or features past the end.
__device__ __forceinline__ void argument_tile(const Problem& p, int64_t v0, int64_t f0, Staging& s,
                                              float (&u)[4][4]) {
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) u[i][j] = 0.f;
  for (int64_t k0 = 0; k0 < p.D; k0 += kStep) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int e = tid + kThreads * q;
      const int r = e / kStep, k = e % kStep;  // 16 threads read 16 consecutive inputs of a row
      const int64_t v = v0 + r, j = k0 + k;
      s.a[k][r] = (v < p.V && j < p.D) ? p.X[v * p.D + j] : 0.f;
      const int kk = e / kTile, c = e % kTile;  // 64 threads read 64 consecutive features
      const int64_t jj = k0 + kk, f = f0 + c;
      s.b[kk][c] = (jj < p.D && f < p.F) ? p.Wt[jj * p.F + f] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kStep; ++k) {
      float a[4], w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = s.a[k][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = s.b[k][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) u[i][j] += a[i] * w[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t f = f0 + tx + 16 * j;
    const float bias = f < p.F ? p.b[f] : 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) u[i][j] += bias;
  }
}

// Features [start, stop) of blockIdx's split.
__device__ __forceinline__ void split_range(const Problem& p, int split, int64_t& start, int64_t& stop) {
  start = split * p.per_split;
  stop = min(p.F, start + p.per_split);
}

// ---- map ----------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) perk_map_kernel(Problem p, const float* H, const float* offset, float* out,
                                                       double* partial) {
  __shared__ Staging s;
  __shared__ float head[perk::kMaxOutputs][kTile];
  __shared__ double acc[kTile][perk::kMaxOutputs];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int e = tid; e < kTile * perk::kMaxOutputs; e += kThreads) (&acc[0][0])[e] = 0.0;
  int64_t start, stop;
  split_range(p, blockIdx.y, start, stop);
  for (int64_t f0 = start; f0 < stop; f0 += kTile) {
    for (int e = tid; e < p.T * kTile; e += kThreads) {
      const int t = e / kTile, c = e % kTile;
      head[t][c] = f0 + c < p.F ? H[t * p.F + f0 + c] : 0.f;
    }
    float u[4][4];
    argument_tile(p, v0, f0, s, u);  // its syncs also publish `head`
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) u[i][j] = perk::feature_cos<float>(u[i][j]);
    for (int t = 0; t < p.T; ++t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) sum += u[i][j] * head[t][tx + 16 * j];
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);  // the row's 16 threads
        if (tx == 0) acc[ty + 16 * i][t] += static_cast<double>(sum);
      }
    }
    __syncthreads();  // `head` is rewritten next tile
  }
  __syncthreads();
  for (int e = tid; e < kTile * p.T; e += kThreads) {
    const int r = e / p.T, t = e % p.T;
    const int64_t v = v0 + r;
    if (v >= p.V) continue;
    if (p.splits == 1)
      out[v * p.T + t] = static_cast<float>(offset[t] + acc[r][t]);
    else
      partial[(blockIdx.y * p.V + v) * p.T + t] = acc[r][t];
  }
}

// out[i] = base[i % width] + sum over splits of partial[s, i], in split order (one thread per element).
__global__ void perk_join_kernel(const double* partial, int64_t count, int32_t splits, const float* base,
                                   int64_t width, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  double total = base ? base[i % width] : 0.0;
  for (int s = 0; s < splits; ++s) total += partial[s * count + i];
  out[i] = static_cast<float>(total);
}

// ---- VJP ----------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) perk_vjp_kernel(Problem p, const float* H, const float* G, float* grad,
                                                       double* partial) {
  __shared__ union {
    Staging s;                // while u is formed
    float w[kTile][kTile];    // then the W tile [features][input columns]
  } shared;
  __shared__ float head[perk::kMaxOutputs][kTile];
  __shared__ float cot[kTile][perk::kMaxOutputs];
  __shared__ float q[kTile][kTile + 1];  // [features][voxels]
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int e = tid; e < kTile * p.T; e += kThreads) {
    const int r = e / p.T, t = e % p.T;
    cot[r][t] = v0 + r < p.V ? G[(v0 + r) * p.T + t] : 0.f;
  }
  double dx[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) dx[i][j] = 0.0;
  int64_t start, stop;
  split_range(p, blockIdx.z, start, stop);
  for (int64_t f0 = start; f0 < stop; f0 += kTile) {
    for (int e = tid; e < p.T * kTile; e += kThreads) {
      const int t = e / kTile, c = e % kTile;
      head[t][c] = f0 + c < p.F ? H[t * p.F + f0 + c] : 0.f;
    }
    float u[4][4];
    argument_tile(p, v0, f0, shared.s, u);  // its syncs also publish `head` and `cot`
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float gh = 0.f;  // (G H)[voxel][feature]; zero past F, where the head tile is zero
        for (int t = 0; t < p.T; ++t) gh += cot[ty + 16 * i][t] * head[t][tx + 16 * j];
        q[tx + 16 * j][ty + 16 * i] = perk::feature_slope<float>(u[i][j]) * gh;
      }
    for (int e = tid; e < kTile * kTile; e += kThreads) {
      const int f = e / kTile, c = e % kTile;
      shared.w[f][c] = (f0 + f < p.F && c0 + c < p.D) ? p.W[(f0 + f) * p.D + c0 + c] : 0.f;
    }
    __syncthreads();
    float d[4][4] = {};
#pragma unroll 8
    for (int f = 0; f < kTile; ++f) {
      float a[4], w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = q[f][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = shared.w[f][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) d[i][j] += a[i] * w[j];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) dx[i][j] += static_cast<double>(d[i][j]);
    __syncthreads();  // q, the W tile and `head` are rewritten next tile
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t v = v0 + ty + 16 * i, c = c0 + tx + 16 * j;
      if (v >= p.V || c >= p.D) continue;
      if (p.splits == 1)
        grad[v * p.D + c] = static_cast<float>(dx[i][j]);
      else
        partial[(blockIdx.z * p.V + v) * p.D + c] = dx[i][j];
    }
}

// ---- the streaming fit's sums --------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) perk_features_kernel(Problem p, float* Z) {
  __shared__ Staging s;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * kTile, f0 = static_cast<int64_t>(blockIdx.y) * kTile;
  float u[4][4];
  argument_tile(p, v0, f0, s, u);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t v = v0 + ty + 16 * i, f = f0 + tx + 16 * j;
      if (v < p.V && f < p.F) Z[v * p.F + f] = perk::feature_cos<float>(u[i][j]);
    }
}

// gram[I-tile, J-tile] (and its mirror) += sum_k Z[k, I] Z[k, J] for the upper pairs I <= J.
__global__ void __launch_bounds__(kThreads) perk_gram_kernel(const float* Z, int64_t n, int64_t F, double* gram) {
  if (blockIdx.y < blockIdx.x) return;  // the lower pairs are the upper ones' mirror
  __shared__ float a[kStep][kTile + 1], b[kStep][kTile + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t f1 = static_cast<int64_t>(blockIdx.x) * kTile, f2 = static_cast<int64_t>(blockIdx.y) * kTile;
  double acc[4][4];
  float part[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0, part[i][j] = 0.f;
  int steps = 0;
  for (int64_t k0 = 0; k0 < n; k0 += kStep) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int e = tid + kThreads * q;
      const int k = e / kTile, c = e % kTile;
      const int64_t row = k0 + k;
      a[k][c] = (row < n && f1 + c < F) ? Z[row * F + f1 + c] : 0.f;
      b[k][c] = (row < n && f2 + c < F) ? Z[row * F + f2 + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kStep; ++k) {
      float x[4], y[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = a[k][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) y[j] = b[k][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) part[i][j] += x[i] * y[j];
    }
    __syncthreads();
    if (++steps == 16) {  // 256 samples in float, then into float64
      steps = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += static_cast<double>(part[i][j]), part[i][j] = 0.f;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const double total = acc[i][j] + static_cast<double>(part[i][j]);
      const int64_t r = f1 + ty + 16 * i, c = f2 + tx + 16 * j;
      if (r >= F || c >= F) continue;
      gram[r * F + c] += total;
      if (blockIdx.x != blockIdx.y) gram[c * F + r] += total;
    }
}

// sums[f] += sum_k Z[k, f]; cross[f, t] += sum_k Z[k, f] Y[k, t] (one thread per feature, float64).
__global__ void perk_cross_kernel(const float* Z, int64_t n, int64_t F, const float* Y, int64_t T, double* sums,
                             double* cross) {
  const int64_t f = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= F) return;
  if (sums) {
    double total = 0.0;
    for (int64_t k = 0; k < n; ++k) total += static_cast<double>(Z[k * F + f]);
    sums[f] += total;
  }
  if (cross)
    for (int64_t t = 0; t < T; ++t) {
      double total = 0.0;
      for (int64_t k = 0; k < n; ++k) total += static_cast<double>(Z[k * F + f]) * static_cast<double>(Y[k * T + t]);
      cross[f * T + t] += total;
    }
}

// ---- launches ----------------------------------------------------------------------------------------
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

int multiprocessors() {
  int device = 0, count = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
  return count > 0 ? count : 1;
}

// The problem with its feature splits: as many as bring `row_blocks` blocks to kBlocksPerSm per multiprocessor,
// at most one per feature tile.
Problem problem_of(const bs_perk_features& features, int64_t V, int64_t T, const void* X, int64_t row_blocks) {
  Problem p;
  p.V = V;
  p.D = features.num_inputs;
  p.F = features.num_features;
  p.T = T;
  p.X = static_cast<const float*>(X);
  p.W = static_cast<const float*>(features.frequency);
  p.Wt = static_cast<const float*>(features.frequency_t);
  p.b = static_cast<const float*>(features.phase);
  const int64_t tiles = (p.F + kTile - 1) / kTile;
  const int64_t target = static_cast<int64_t>(multiprocessors()) * kBlocksPerSm;
  int64_t splits = row_blocks >= target ? 1 : std::min(tiles, (target + row_blocks - 1) / row_blocks);
  const int64_t tiles_per_split = (tiles + splits - 1) / splits;
  p.per_split = tiles_per_split * kTile;
  p.splits = static_cast<int32_t>((tiles + tiles_per_split - 1) / tiles_per_split);
  return p;
}

int64_t row_tiles(int64_t V) { return (V + kTile - 1) / kTile; }
int64_t column_tiles(const bs_perk_features& f) { return (f.num_inputs + kTile - 1) / kTile; }

Problem map_problem(const bs_perk_map_args& a) {
  return problem_of(a.features, a.num_voxels, a.num_outputs, a.input, row_tiles(a.num_voxels));
}
Problem vjp_problem(const bs_perk_vjp_args& a) {
  return problem_of(a.features, a.num_voxels, a.num_outputs, a.input,
                    row_tiles(a.num_voxels) * column_tiles(a.features));
}

template <class Args>
const Args& float32_args(const Args* a) {
  if (!a) throw std::invalid_argument("args must not be null");
  if (a->dtype != BS_FLOAT32)
    throw std::invalid_argument("the CUDA kernels take float32 (dtype 0); float64 runs on the host build");
  return *a;
}

void require_scratch(const void* scratch, int64_t have, int64_t need) {
  if (need > 0 && (!scratch || have < need))
    throw std::invalid_argument("scratch must hold " + std::to_string(need) + " bytes (bs_perk_scratch_bytes), got " +
                                std::to_string(scratch ? have : 0));
}

unsigned blocks_of(int64_t count, int per_block) { return static_cast<unsigned>((count + per_block - 1) / per_block); }

}  // namespace perk_device
}  // namespace bs

extern "C" {

int32_t bs_perk_map(const bs_perk_map_args* args) {
  using namespace bs::perk_device;
  return bs::guarded([&] {
    const auto& a = float32_args(args);
    bs::perk::check(a);
    if (a.num_voxels == 0) return;
    const Problem p = map_problem(a);
    const int64_t need = p.splits > 1 ? p.splits * p.V * p.T * 8 : 0;
    require_scratch(a.scratch, a.scratch_bytes, need);
    auto stream = static_cast<cudaStream_t>(a.stream);
    double* partial = static_cast<double*>(a.scratch);
    perk_map_kernel<<<dim3(static_cast<unsigned>(row_tiles(p.V)), p.splits), kThreads, 0, stream>>>(
        p, static_cast<const float*>(a.head), static_cast<const float*>(a.offset), static_cast<float*>(a.output),
        partial);
    check_cuda(cudaGetLastError(), "PERK map kernel launch");
    if (p.splits > 1) {
      perk_join_kernel<<<blocks_of(p.V * p.T, 256), 256, 0, stream>>>(
          partial, p.V * p.T, p.splits, static_cast<const float*>(a.offset), p.T, static_cast<float*>(a.output));
      check_cuda(cudaGetLastError(), "PERK split joining launch");
    }
  });
}

int32_t bs_perk_vjp(const bs_perk_vjp_args* args) {
  using namespace bs::perk_device;
  return bs::guarded([&] {
    const auto& a = float32_args(args);
    bs::perk::check(a);
    if (a.num_voxels == 0) return;
    const Problem p = vjp_problem(a);
    const int64_t need = p.splits > 1 ? p.splits * p.V * p.D * 8 : 0;
    require_scratch(a.scratch, a.scratch_bytes, need);
    auto stream = static_cast<cudaStream_t>(a.stream);
    double* partial = static_cast<double*>(a.scratch);
    const dim3 grid(static_cast<unsigned>(row_tiles(p.V)), static_cast<unsigned>(column_tiles(a.features)), p.splits);
    perk_vjp_kernel<<<grid, kThreads, 0, stream>>>(p, static_cast<const float*>(a.head),
                                              static_cast<const float*>(a.cotangent),
                                              static_cast<float*>(a.input_grad), partial);
    check_cuda(cudaGetLastError(), "PERK VJP kernel launch");
    if (p.splits > 1) {
      perk_join_kernel<<<blocks_of(p.V * p.D, 256), 256, 0, stream>>>(partial, p.V * p.D, p.splits, nullptr, 1,
                                                                        static_cast<float*>(a.input_grad));
      check_cuda(cudaGetLastError(), "PERK split joining launch");
    }
  });
}

int32_t bs_perk_accumulate(const bs_perk_accumulate_args* args) {
  using namespace bs::perk_device;
  return bs::guarded([&] {
    const auto& a = float32_args(args);
    bs::perk::check<float>(a);
    if (a.num_samples == 0) return;
    Problem p = problem_of(a.features, a.num_samples, a.num_targets, a.input, 1 << 30);  // no splits
    auto stream = static_cast<cudaStream_t>(a.stream);
    float* Z = static_cast<float*>(a.scratch);
    const unsigned feature_tiles = static_cast<unsigned>((p.F + kTile - 1) / kTile);
    perk_features_kernel<<<dim3(static_cast<unsigned>(row_tiles(p.V)), feature_tiles), kThreads, 0, stream>>>(p, Z);
    check_cuda(cudaGetLastError(), "PERK features kernel launch");
    if (a.feature_gram) {
      perk_gram_kernel<<<dim3(feature_tiles, feature_tiles), kThreads, 0, stream>>>(Z, p.V, p.F, a.feature_gram);
      check_cuda(cudaGetLastError(), "PERK Gram kernel launch");
    }
    const bool cross = a.feature_target && a.num_targets > 0;
    if (cross || a.feature_sum) {
      perk_cross_kernel<<<blocks_of(p.F, 128), 128, 0, stream>>>(Z, p.V, p.F, static_cast<const float*>(a.target),
                                                             a.num_targets, a.feature_sum,
                                                             cross ? a.feature_target : nullptr);
      check_cuda(cudaGetLastError(), "PERK cross kernel launch");
    }
  });
}

int64_t bs_perk_scratch_bytes(int32_t pass, const void* args) {
  using namespace bs::perk_device;
  int64_t bytes = -1;
  const int32_t status = bs::guarded([&] {
    switch (pass) {
      case 0: {
        const auto& a = float32_args(static_cast<const bs_perk_map_args*>(args));
        bs::perk::check(a);
        const Problem p = map_problem(a);
        bytes = a.num_voxels && p.splits > 1 ? p.splits * p.V * p.T * 8 : 0;
        break;
      }
      case 1: {
        const auto& a = float32_args(static_cast<const bs_perk_vjp_args*>(args));
        bs::perk::check(a);
        const Problem p = vjp_problem(a);
        bytes = a.num_voxels && p.splits > 1 ? p.splits * p.V * p.D * 8 : 0;
        break;
      }
      case 2: {
        const auto& a = float32_args(static_cast<const bs_perk_accumulate_args*>(args));
        bs::perk::check_features(a.features);
        bytes = bs::perk::accumulate_scratch_bytes<float>(a);
        break;
      }
      default:
        throw std::invalid_argument("pass must be 0 (map), 1 (VJP) or 2 (accumulate), got " + std::to_string(pass));
    }
  });
  return status == 0 ? bytes : -1;
}
}
