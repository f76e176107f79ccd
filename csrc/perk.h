/* blochsim C ABI, PERK part: the kernels of parameter estimation via regression with kernels
 * (Nataraj et al., IEEE TMI 2018), loaded by blochsim/estimators/perk_kernels.py with ctypes.
 *
 * PERK regresses parameters on random Fourier features of a voxel's input row x [D] (its signal as Re/Im
 * or magnitude columns, normalised, known properties appended):
 *
 *     z_f(x) = cos(u_f),   u_f = sum_j W[f, j] x[j] + b[f]        (f < F features)
 *
 * with W and b drawn by the caller (the length scales folded into W). The kernels compute these features
 * tile by tile and never hold them for more than a tile of rows at a time; the caller folds the
 * sqrt(2 / F) of the Gaussian-kernel approximation and the centring into its heads.
 *
 * Conventions are capi.h's: one struct per entry point, 0 on success, else nonzero with bs_last_error();
 * arrays are row-major and contiguous, real, of `dtype` (float32 or float64; the CUDA library takes float32)
 * unless a field says float64. `stream`, `scratch`: as in capi.h; bs_perk_scratch_bytes says how many
 * scratch bytes a call needs (the host needs none for map and VJP).
 *
 * Sums over features (F terms) and over samples are accumulated in float64 across tiles, each tile's
 * partial sum (at most 64 features, or a block of samples) in `dtype`.
 */
#ifndef BLOCHSIM_PERK_H
#define BLOCHSIM_PERK_H

#include "capi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most heads one map or VJP call evaluates (the caller splits more into several calls). */
#define BS_PERK_MAX_OUTPUTS 16

/* The random features shared by every PERK pass. */
typedef struct bs_perk_features {
  int64_t num_inputs;      /* D: columns of an input row                                             */
  int64_t num_features;    /* F                                                                      */
  const void* frequency;   /* [F, D] read: W, per input column divided by its length scale           */
  const void* frequency_t; /* [D, F] read: the same W transposed (each product then reads along rows)*/
  const void* phase;       /* [F] read: b, rad                                                       */
} bs_perk_features;

/* output[v, t] = offset[t] + sum_f cos(u_f(input[v])) * head[t, f] */
typedef struct bs_perk_map_args {
  int32_t dtype;         /* bs_dtype                                  */
  int32_t num_threads;   /* host threads; <= 0: all of the pool       */
  void* stream;
  bs_perk_features features;
  int64_t num_voxels;    /* V                                         */
  int64_t num_outputs;   /* T, 1..BS_PERK_MAX_OUTPUTS                 */
  const void* input;     /* [V, D] read                               */
  const void* head;      /* [T, F] read                               */
  const void* offset;    /* [T] read                                  */
  void* output;          /* [V, T] written                            */
  void* scratch;         /* device scratch (CUDA build), or null      */
  int64_t scratch_bytes;
} bs_perk_map_args;

/* input_grad[v, j] = sum_t cotangent[v, t] d output[v, t] / d input[v, j]
 *                  = -sum_f sin(u_f(input[v])) (sum_t cotangent[v, t] head[t, f]) W[f, j]          */
typedef struct bs_perk_vjp_args {
  int32_t dtype;
  int32_t num_threads;
  void* stream;
  bs_perk_features features;
  int64_t num_voxels;     /* V                                        */
  int64_t num_outputs;    /* T, 1..BS_PERK_MAX_OUTPUTS                */
  const void* input;      /* [V, D] read                              */
  const void* head;       /* [T, F] read                              */
  const void* cotangent;  /* [V, T] read                              */
  void* input_grad;       /* [V, D] written                           */
  void* scratch;          /* device scratch (CUDA build), or null     */
  int64_t scratch_bytes;
} bs_perk_vjp_args;

/* The streaming fit's sums over one chunk of n samples, added to what the accumulators hold:
 *   feature_sum[f]       += sum_k z_f(input[k])
 *   feature_gram[f, g]   += sum_k z_f(input[k]) z_g(input[k])          (the whole symmetric matrix)
 *   feature_target[f, t] += sum_k z_f(input[k]) target[k, t]
 * A null accumulator is skipped. Whatever the dtype, the accumulators are float64. */
typedef struct bs_perk_accumulate_args {
  int32_t dtype;
  int32_t num_threads;
  void* stream;
  bs_perk_features features;
  int64_t num_samples;     /* n                                                             */
  int64_t num_targets;     /* T >= 0                                                        */
  const void* input;       /* [n, D] read                                                   */
  const void* target;      /* [n, T] read (null when T = 0 or feature_target is null)       */
  double* feature_sum;     /* [F] float64, added to, or null                                */
  double* feature_gram;    /* [F, F] float64, added to, or null                             */
  double* feature_target;  /* [F, T] float64, added to, or null                             */
  void* scratch;           /* the chunk's features, host and device: bs_perk_scratch_bytes  */
  int64_t scratch_bytes;
} bs_perk_accumulate_args;

BS_API int32_t bs_perk_map(const bs_perk_map_args* args);
BS_API int32_t bs_perk_vjp(const bs_perk_vjp_args* args);
BS_API int32_t bs_perk_accumulate(const bs_perk_accumulate_args* args);
/* Scratch bytes a pass needs (pass: 0 map, 1 VJP, 2 accumulate; args: that pass's struct), or -1 on
 * invalid arguments (see bs_last_error). */
BS_API int64_t bs_perk_scratch_bytes(int32_t pass, const void* args);

#ifdef __cplusplus
}
#endif
#endif
