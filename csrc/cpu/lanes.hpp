// Lanes<R, W>: W voxels as one number, for the host's real plain path (epg_lanes.inc). Every arithmetic
// operation acts on the W voxels at once (one SIMD instruction where the target has W-wide registers), so
// the event loop, written over a number type, runs unchanged across a block of voxels: states are arrays
// over orders of Lanes (W voxels side by side in memory), and a shift moves whole lanes, not elements.
// Dual<Lanes<R, W>, P> carries P tangents the same way. Host only: the device maps voxels to threads.
#pragma once

#include <cmath>

#include "blochsim/epg.hpp"

namespace bs {

template <class R, int W>
struct Lanes {
  typedef R Vec __attribute__((vector_size(W * sizeof(R))));
  Vec x;

  BS_HD Lanes() : x(Vec{}) {}
  BS_HD Lanes(R a) : x(Vec{} + a) {}  // NOLINT: a constant is the same in every lane
  // Copies through the vector: GCC copies a trivially copyable struct in pieces of the translation unit's
  // widest move (16 bytes for the x86-64 baseline) even inside a target region, and a 32-byte load of two
  // 16-byte stores cannot be forwarded (AVX2 forward 6x slower than with this, on the 2-core VM).
  BS_HD Lanes(const Lanes& o) : x(o.x) {}
  BS_HD Lanes& operator=(const Lanes& o) {
    x = o.x;
    return *this;
  }
  BS_HD static Lanes of(Vec v) {
    Lanes r;
    r.x = v;
    return r;
  }
  BS_HD R operator[](int l) const { return x[l]; }
  BS_HD void set(int l, R a) { x[l] = a; }

  BS_HD friend Lanes operator+(const Lanes& a, const Lanes& b) { return of(a.x + b.x); }
  BS_HD friend Lanes operator-(const Lanes& a, const Lanes& b) { return of(a.x - b.x); }
  BS_HD friend Lanes operator*(const Lanes& a, const Lanes& b) { return of(a.x * b.x); }
  BS_HD friend Lanes operator/(const Lanes& a, const Lanes& b) { return of(a.x / b.x); }
  BS_HD friend Lanes operator-(const Lanes& a) { return of(-a.x); }
  BS_HD Lanes& operator+=(const Lanes& b) {
    x += b.x;
    return *this;
  }
  BS_HD Lanes& operator-=(const Lanes& b) {
    x -= b.x;
    return *this;
  }
  BS_HD Lanes& operator*=(const Lanes& b) {
    x *= b.x;
    return *this;
  }
};

template <class R, int W>
struct Num<Lanes<R, W>> {
  using Real = Lanes<R, W>;
  static constexpr int P = 0;
  BS_HD static Real value(const Lanes<R, W>& x) { return x; }
};

template <class R, int W>
struct PassesInPlace<Lanes<R, W>> {
  static constexpr bool value = true;
};
template <class R, int W, int P>
struct PassesInPlace<Dual<Lanes<R, W>, P>> {
  static constexpr bool value = true;
};

// The scalar under a lane type (the element type of a voxel's values) and its width.
template <class N>
struct LaneOf;
template <class R, int W>
struct LaneOf<Lanes<R, W>> {
  using Scalar = R;
  static constexpr int W_ = W;
};
template <class R, int W, int P>
struct LaneOf<Dual<Lanes<R, W>, P>> : LaneOf<Lanes<R, W>> {};

// Elementary functions lane by lane (they run per interval length and per pulse, not per order). Where every
// lane holds the same angle (a pulse's flip with B1 uniform) one call serves them all.
template <class R, int W, class F>
BS_HD Lanes<R, W> each_lane(const Lanes<R, W>& a, const F& f) {
  Lanes<R, W> r;
  for (int l = 0; l < W; ++l) r.set(l, f(a[l]));
  return r;
}
template <class R, int W>
BS_HD bool same_in_every_lane(const Lanes<R, W>& a) {
  for (int l = 1; l < W; ++l)
    if (!(a[l] == a[0])) return false;
  return true;
}
template <class R, int W>
BS_HD Lanes<R, W> exp(const Lanes<R, W>& a) {
  return each_lane(a, [](R x) { return std::exp(x); });
}
template <class R, int W>
BS_HD void sin_cos(const Lanes<R, W>& a, Lanes<R, W>& s, Lanes<R, W>& c) {
  if (same_in_every_lane(a)) {
    R sv, cv;
    sin_cos(a[0], sv, cv);
    s = Lanes<R, W>(sv);
    c = Lanes<R, W>(cv);
    return;
  }
  for (int l = 0; l < W; ++l) {
    R sv, cv;
    sin_cos(a[l], sv, cv);
    s.set(l, sv);
    c.set(l, cv);
  }
}
template <class R, int W>
BS_HD Lanes<R, W> sin(const Lanes<R, W>& a) {
  Lanes<R, W> s, c;
  sin_cos(a, s, c);
  return s;
}
template <class R, int W>
BS_HD Lanes<R, W> cos(const Lanes<R, W>& a) {
  Lanes<R, W> s, c;
  sin_cos(a, s, c);
  return c;
}
// Dual<Lanes>: the chain rule over lane-wise values (number.hpp's Dual overloads call std:: on the value).
template <class R, int W, int P>
BS_HD Dual<Lanes<R, W>, P> exp(const Dual<Lanes<R, W>, P>& a) {
  const Lanes<R, W> e = exp(a.v);
  return chain(a, e, e);
}
template <class R, int W, int P>
BS_HD void sin_cos(const Dual<Lanes<R, W>, P>& a, Dual<Lanes<R, W>, P>& s, Dual<Lanes<R, W>, P>& c) {
  Lanes<R, W> sv, cv;
  sin_cos(a.v, sv, cv);
  s = chain(a, sv, cv);
  c = chain(a, cv, -sv);
}

// A number of one voxel (R or Dual<R, P>) in every lane, and lane l of a lane number.
template <class R, int W>
BS_HD Lanes<R, W> widen(R a, Lanes<R, W>*) {
  return Lanes<R, W>(a);
}
template <class R, int W, int P>
BS_HD Dual<Lanes<R, W>, P> widen(const Dual<R, P>& a, Dual<Lanes<R, W>, P>*) {
  Dual<Lanes<R, W>, P> r;
  r.v = Lanes<R, W>(a.v);
  for (int p = 0; p < P; ++p) r.d[p] = Lanes<R, W>(a.d[p]);
  return r;
}
template <class N, class X>
BS_HD N widen_to(const X& a) {
  return widen(a, static_cast<N*>(nullptr));
}

}  // namespace bs
