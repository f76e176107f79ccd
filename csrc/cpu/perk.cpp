// The host's PERK entry points (csrc/perk.h): the tile passes of perk_tiles.inc compiled for the x86-64
// baseline (SSE2), AVX2 with FMA and AVX-512, each in a namespace of its own inside its GCC target region,
// and picked once per process by what the processor has (BLOCHSIM_HOST_ISA narrows it), as epg_lanes.cpp
// does for the EPG lanes.
// perk.hpp's feature functions take and return the vectors by value; they are always inlined into the
// target regions, so no call passes a vector across the ABI GCC warns about.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "blochsim/abi_guard.hpp"
#include "blochsim/perk.hpp"
#include "perk.h"
#include "scratch.hpp"
#include "thread_pool.hpp"
#include "host_isa.hpp"

namespace bs {

namespace perk_sse2 {
constexpr int kVectorBytes = 16;
#include "perk_tiles.inc"
}  // namespace perk_sse2

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC's target regions
#define BS_PERK_WIDE 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace perk_avx2 {
constexpr int kVectorBytes = 32;
#include "perk_tiles.inc"
}  // namespace perk_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
namespace perk_avx512 {
constexpr int kVectorBytes = 64;
#include "perk_tiles.inc"
}  // namespace perk_avx512
#pragma GCC pop_options
#endif

namespace {

Isa isa() {
  static const Isa chosen = pick_host_isa();
  return chosen;
}

// Each pass at R on the widest instruction set available.
#ifdef BS_PERK_WIDE
#define BS_PERK_PASS(pass)                                   \
  template <class R, class Args>                             \
  void pass##_host(const Args& a) {                          \
    switch (isa()) {                                         \
      case Isa::kAvx512: return perk_avx512::pass<R>(a);     \
      case Isa::kAvx2: return perk_avx2::pass<R>(a);         \
      default: return perk_sse2::pass<R>(a);                 \
    }                                                        \
  }
#else
#define BS_PERK_PASS(pass)                                   \
  template <class R, class Args>                             \
  void pass##_host(const Args& a) {                          \
    (void)isa();                                             \
    perk_sse2::pass<R>(a);                                   \
  }
#endif
BS_PERK_PASS(map_at)
BS_PERK_PASS(vjp_at)
BS_PERK_PASS(accumulate_at)
#undef BS_PERK_PASS

template <class Args>
const Args& args_of(const Args* a) {
  if (!a) throw std::invalid_argument("args must not be null");
  if (a->dtype != BS_FLOAT32 && a->dtype != BS_FLOAT64)
    throw std::invalid_argument("dtype must be BS_FLOAT32 (0) or BS_FLOAT64 (1), got " + std::to_string(a->dtype));
  return *a;
}

}  // namespace
}  // namespace bs

extern "C" {

int32_t bs_perk_map(const bs_perk_map_args* args) {
  return bs::guarded([&] {
    const auto& a = bs::args_of(args);
    bs::perk::check(a);
    if (a.num_voxels == 0) return;
    if (a.dtype == BS_FLOAT32) {
      bs::map_at_host<float>(a);
    } else {
      bs::map_at_host<double>(a);
    }
  });
}

int32_t bs_perk_vjp(const bs_perk_vjp_args* args) {
  return bs::guarded([&] {
    const auto& a = bs::args_of(args);
    bs::perk::check(a);
    if (a.num_voxels == 0) return;
    if (a.dtype == BS_FLOAT32) {
      bs::vjp_at_host<float>(a);
    } else {
      bs::vjp_at_host<double>(a);
    }
  });
}

int32_t bs_perk_accumulate(const bs_perk_accumulate_args* args) {
  return bs::guarded([&] {
    const auto& a = bs::args_of(args);
    if (a.dtype == BS_FLOAT32) {
      bs::perk::check<float>(a);
      if (a.num_samples == 0) return;
      bs::accumulate_at_host<float>(a);
    } else {
      bs::perk::check<double>(a);
      if (a.num_samples == 0) return;
      bs::accumulate_at_host<double>(a);
    }
  });
}

int64_t bs_perk_scratch_bytes(int32_t pass, const void* args) {
  int64_t bytes = -1;
  const int32_t status = bs::guarded([&] {
    switch (pass) {
      case 0:
        bs::perk::check(bs::args_of(static_cast<const bs_perk_map_args*>(args)));
        bytes = 0;
        break;
      case 1:
        bs::perk::check(bs::args_of(static_cast<const bs_perk_vjp_args*>(args)));
        bytes = 0;
        break;
      case 2: {
        const auto& a = bs::args_of(static_cast<const bs_perk_accumulate_args*>(args));
        bs::perk::check_features(a.features);
        bytes = a.dtype == BS_FLOAT32 ? bs::perk::accumulate_scratch_bytes<float>(a)
                                      : bs::perk::accumulate_scratch_bytes<double>(a);
        break;
      }
      default:
        throw std::invalid_argument("pass must be 0 (map), 1 (VJP) or 2 (accumulate), got " + std::to_string(pass));
    }
  });
  return status == 0 ? bytes : -1;
}
}
