// PERK's arithmetic, written once over the number type for the host (csrc/cpu/perk.cpp: float, double and
// their SIMD vectors) and the device (csrc/cuda/perk.cu: float): the feature cos(u) and its slope -sin(u),
// the C ABI's checks, and the typed views both libraries unpack the structs of csrc/perk.h into.
//
// cos and sin are Taylor polynomials after one reduction by 2 pi, with no branch, so one source serves a
// scalar, a GCC vector of lanes and a CUDA thread alike, and the host and device agree. The reduction
// u - k 2 pi (k = u / 2 pi rounded by the 1.5 * 2^(mantissa bits) trick) uses a three-part 2 pi whose
// first part has few enough bits that k * part is exact for |k| < 2^14; the remainder r lies in
// [-pi, pi], where the series truncated after r^18 (float) or r^28 (double) is off by at most
// pi^20 / 20! = 3.6e-9 (float) or pi^30 / 30! = 3e-18 (double): below the type's rounding.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blochsim/portability.hpp"
#include "perk.h"

namespace bs {
namespace perk {

constexpr int kMaxOutputs = BS_PERK_MAX_OUTPUTS;
// Features per tile, host and device: sums over more features than this are float64 across tiles.
constexpr int64_t kFeatureTile = 64;

// ---- the feature function ------------------------------------------------------------------------------
template <class R>
struct TwoPi;
template <>
struct TwoPi<float> {
  static constexpr float inverse = 0.15915494309189535f;
  static constexpr float round = 12582912.0f;  // 1.5 * 2^23: x + round - round is x rounded to an integer
  static constexpr float part1 = 6.28125f;     // 201 / 32: 8 significant bits, so k * part1 is exact
  static constexpr float part2 = 1.9353071795864769e-3f;
  static constexpr float part3 = static_cast<float>(1.9353071795864769253e-3 - 1.9353071795864769e-3f);
  static constexpr int cos_terms = 10;  // r^0 .. r^18
};
template <>
struct TwoPi<double> {
  static constexpr double inverse = 0.15915494309189533577;
  static constexpr double round = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr double part1 = 6.28318530717958623200;  // double(2 pi)
  static constexpr double part2 = 2.4492935982947064e-16;  // 2 pi - part1
  static constexpr double part3 = 0.0;
  static constexpr int cos_terms = 15;  // r^0 .. r^28
};

constexpr double inverse_factorial(int n) {
  double f = 1.0;
  for (int i = 2; i <= n; ++i) f *= i;
  return 1.0 / f;
}

// Horner over the even (first = 0: cos) or odd (first = 1: sin / r) Taylor coefficients, term `k` down.
template <class R, int first, int k, class N>
BS_HD N taylor(const N& r2, const N& p) {
  constexpr R c = static_cast<R>((k % 2 ? -1.0 : 1.0) * inverse_factorial(2 * k + first));
  if constexpr (k == 0)
    return p * r2 + c;
  else
    return taylor<R, first, k - 1>(r2, p * r2 + c);
}

// u reduced to [-pi, pi] (N: R, or a vector of R).
template <class R, class N>
BS_HD N reduce_turns(const N& u) {
  using T = TwoPi<R>;
  const N k = (u * T::inverse + T::round) - T::round;
  return ((u - k * T::part1) - k * T::part2) - k * T::part3;
}

// cos(u): the feature.
template <class R, class N>
BS_HD N feature_cos(const N& u) {
  constexpr int top = TwoPi<R>::cos_terms - 1;
  const N r = reduce_turns<R>(u);
  const N r2 = r * r;
  const N zero = r2 * R(0);
  return taylor<R, 0, top - 1>(r2, zero + static_cast<R>((top % 2 ? -1.0 : 1.0) * inverse_factorial(2 * top)));
}

// -sin(u): the feature's slope d cos(u) / du.
template <class R, class N>
BS_HD N feature_slope(const N& u) {
  constexpr int top = TwoPi<R>::cos_terms - 1;
  const N r = reduce_turns<R>(u);
  const N r2 = r * r;
  const N zero = r2 * R(0);
  const N last = zero + static_cast<R>((top % 2 ? -1.0 : 1.0) * inverse_factorial(2 * top + 1));
  return -(r * taylor<R, 1, top - 1>(r2, last));
}

// ---- typed views of the C ABI ---------------------------------------------------------------------------
template <class R>
struct Features {
  int64_t D, F;
  const R* W;   // [F, D]
  const R* Wt;  // [D, F]
  const R* b;   // [F]
};

template <class R>
Features<R> features_of(const bs_perk_features& f) {
  return {f.num_inputs, f.num_features, static_cast<const R*>(f.frequency), static_cast<const R*>(f.frequency_t),
          static_cast<const R*>(f.phase)};
}

// ---- checks (host code of both libraries) ---------------------------------------------------------------
inline void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

inline void check_features(const bs_perk_features& f) {
  require(f.num_inputs >= 1, "features.num_inputs (D) must be >= 1, got " + std::to_string(f.num_inputs));
  require(f.num_features >= 1, "features.num_features (F) must be >= 1, got " + std::to_string(f.num_features));
  require(f.frequency && f.frequency_t && f.phase,
          "features.frequency [F, D], features.frequency_t [D, F] and features.phase [F] must not be null");
}

inline void check_outputs(int64_t T) {
  require(T >= 1 && T <= kMaxOutputs, "num_outputs must be in 1.." + std::to_string(kMaxOutputs) + ", got " +
                                          std::to_string(T) + " (split the heads over several calls)");
}

inline void check(const bs_perk_map_args& a) {
  check_features(a.features);
  check_outputs(a.num_outputs);
  require(a.num_voxels >= 0, "num_voxels must be >= 0, got " + std::to_string(a.num_voxels));
  require(a.num_voxels == 0 || (a.input && a.head && a.offset && a.output),
          "input [V, D], head [T, F], offset [T] and output [V, T] must not be null");
}

inline void check(const bs_perk_vjp_args& a) {
  check_features(a.features);
  check_outputs(a.num_outputs);
  require(a.num_voxels >= 0, "num_voxels must be >= 0, got " + std::to_string(a.num_voxels));
  require(a.num_voxels == 0 || (a.input && a.head && a.cotangent && a.input_grad),
          "input [V, D], head [T, F], cotangent [V, T] and input_grad [V, D] must not be null");
}

// The fit's scratch: the chunk's features, F rounded up to whole tiles ([tiles][n][kFeatureTile] on the host,
// [n][F] on the device).
template <class R>
int64_t accumulate_scratch_bytes(const bs_perk_accumulate_args& a) {
  const int64_t padded = (a.features.num_features + kFeatureTile - 1) / kFeatureTile * kFeatureTile;
  return a.num_samples * padded * static_cast<int64_t>(sizeof(R));
}

template <class R>
inline void check(const bs_perk_accumulate_args& a) {
  check_features(a.features);
  require(a.num_samples >= 0, "num_samples must be >= 0, got " + std::to_string(a.num_samples));
  require(a.num_targets >= 0, "num_targets must be >= 0, got " + std::to_string(a.num_targets));
  require(a.num_samples == 0 || a.input, "input [n, D] must not be null");
  require(!a.feature_target || a.num_targets == 0 || a.target,
          "target [n, T] must not be null when feature_target is given and T > 0");
  require(a.num_samples == 0 || (a.scratch && a.scratch_bytes >= accumulate_scratch_bytes<R>(a)),
          "scratch must hold the chunk's features: " + std::to_string(accumulate_scratch_bytes<R>(a)) +
              " bytes (bs_perk_scratch_bytes), got " + std::to_string(a.scratch_bytes));
}

}  // namespace perk
}  // namespace bs
