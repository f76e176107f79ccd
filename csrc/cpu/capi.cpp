// The C ABI: error handling, versions, and dispatch on dtype, path and tangent count.
#include "capi.h"

#include <exception>
#include <string>

#include "blochsim/abi_guard.hpp"
#include "epg_host.hpp"


namespace bs {
// Defined in the per-pass translation units.
template <class R>
void forward_entry(const bs_epg_forward_args& a);
template <class R>
void jvp_entry(const bs_epg_jvp_args& a);
template <class R>
void vjp_entry(const bs_epg_vjp_args& a);
template <class R>
void vjp_jvp_entry(const bs_epg_vjp_jvp_args& a);
}  // namespace bs

namespace {
using bs::guarded;

template <class Args, class F32, class F64>
int32_t by_dtype(const Args* a, F32 f32, F64 f64) {
  return guarded([&] {
    if (!a) throw std::invalid_argument("args must not be null");
    if (a->dtype == BS_FLOAT32) {
      f32(*a);
    } else if (a->dtype == BS_FLOAT64) {
      f64(*a);
    } else {
      throw std::invalid_argument("dtype must be BS_FLOAT32 (0) or BS_FLOAT64 (1), got " + std::to_string(a->dtype));
    }
  });
}
}  // namespace

extern "C" {

int32_t bs_abi_version(void) { return BS_ABI_VERSION; }
const char* bs_version(void) { return BLOCHSIM_VERSION; }
const char* bs_last_error(void) { return bs::last_error().c_str(); }

int32_t bs_epg_forward(const bs_epg_forward_args* a) {
  return by_dtype(a, bs::forward_entry<float>, bs::forward_entry<double>);
}
int32_t bs_epg_jvp(const bs_epg_jvp_args* a) { return by_dtype(a, bs::jvp_entry<float>, bs::jvp_entry<double>); }
int32_t bs_epg_vjp(const bs_epg_vjp_args* a) { return by_dtype(a, bs::vjp_entry<float>, bs::vjp_entry<double>); }
int32_t bs_epg_vjp_jvp(const bs_epg_vjp_jvp_args* a) {
  return by_dtype(a, bs::vjp_jvp_entry<float>, bs::vjp_jvp_entry<double>);
}
int64_t bs_epg_scratch_bytes(int32_t, const void*) { return 0; }
int64_t bs_epg_resident_voxels(int32_t, const void*) { return 0; }
}
