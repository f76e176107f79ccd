// Number types the event loop is written over: float, double, and Dual<R, P> (a value with P tangents).
// At a real type the loop is the forward simulation and the adjoint; at Dual it is the JVP and the
// second-order adjoint. Cx<N> is a complex number over any of them.
#pragma once

#include <cmath>
#include <type_traits>

#include "blochsim/portability.hpp"

namespace bs {

template <class R, int P>
struct Dual {
  R v;     // value
  R d[P];  // tangents

  BS_HD Dual() : v(0) {
    for (int p = 0; p < P; ++p) d[p] = 0;
  }
  BS_HD Dual(R value) : v(value) {  // NOLINT: a constant is a Dual with zero tangents
    for (int p = 0; p < P; ++p) d[p] = 0;
  }
};

// Traits: the real type under a number, its tangent count, and access to value and tangents.
template <class N>
struct Num {
  using Real = N;
  static constexpr int P = 0;
  BS_HD static Real value(const N& x) { return x; }
};
template <class R, int P_>
struct Num<Dual<R, P_>> {
  using Real = R;
  static constexpr int P = P_;
  BS_HD static Real value(const Dual<R, P_>& x) { return x.v; }
};

template <class N>
BS_HD typename Num<N>::Real value_of(const N& x) {
  return Num<N>::value(x);
}

// ---- Dual arithmetic ---------------------------------------------------------------------------
template <class R, int P>
BS_HD Dual<R, P> operator+(const Dual<R, P>& a, const Dual<R, P>& b) {
  Dual<R, P> r;
  r.v = a.v + b.v;
  for (int p = 0; p < P; ++p) r.d[p] = a.d[p] + b.d[p];
  return r;
}
template <class R, int P>
BS_HD Dual<R, P> operator-(const Dual<R, P>& a, const Dual<R, P>& b) {
  Dual<R, P> r;
  r.v = a.v - b.v;
  for (int p = 0; p < P; ++p) r.d[p] = a.d[p] - b.d[p];
  return r;
}
template <class R, int P>
BS_HD Dual<R, P> operator-(const Dual<R, P>& a) {
  Dual<R, P> r;
  r.v = -a.v;
  for (int p = 0; p < P; ++p) r.d[p] = -a.d[p];
  return r;
}
template <class R, int P>
BS_HD Dual<R, P> operator*(const Dual<R, P>& a, const Dual<R, P>& b) {
  Dual<R, P> r;
  r.v = a.v * b.v;
  for (int p = 0; p < P; ++p) r.d[p] = a.d[p] * b.v + a.v * b.d[p];
  return r;
}
template <class R, int P>
BS_HD Dual<R, P> operator*(const Dual<R, P>& a, R b) {
  Dual<R, P> r;
  r.v = a.v * b;
  for (int p = 0; p < P; ++p) r.d[p] = a.d[p] * b;
  return r;
}
template <class R, int P>
BS_HD Dual<R, P> operator*(R a, const Dual<R, P>& b) {
  return b * a;
}
template <class R, int P>
BS_HD Dual<R, P> operator+(const Dual<R, P>& a, R b) {
  Dual<R, P> r = a;
  r.v += b;
  return r;
}
template <class R, int P>
BS_HD Dual<R, P> operator+(R a, const Dual<R, P>& b) {
  return b + a;
}
template <class R, int P>
BS_HD Dual<R, P> operator-(const Dual<R, P>& a, R b) {
  Dual<R, P> r = a;
  r.v -= b;
  return r;
}
template <class R, int P>
BS_HD Dual<R, P> operator-(R a, const Dual<R, P>& b) {
  return -b + a;
}
template <class R, int P>
BS_HD Dual<R, P> operator/(const Dual<R, P>& a, const Dual<R, P>& b) {
  Dual<R, P> r;
  const R inv = R(1) / b.v;
  r.v = a.v * inv;
  for (int p = 0; p < P; ++p) r.d[p] = (a.d[p] - r.v * b.d[p]) * inv;
  return r;
}
template <class R, int P>
BS_HD Dual<R, P> operator/(R a, const Dual<R, P>& b) {
  return Dual<R, P>(a) / b;
}
template <class R, int P>
BS_HD Dual<R, P> operator/(const Dual<R, P>& a, R b) {
  return a * (R(1) / b);
}
template <class R, int P, class B>
BS_HD Dual<R, P>& operator+=(Dual<R, P>& a, const B& b) {
  a = a + b;
  return a;
}
template <class R, int P, class B>
BS_HD Dual<R, P>& operator-=(Dual<R, P>& a, const B& b) {
  a = a - b;
  return a;
}
template <class R, int P, class B>
BS_HD Dual<R, P>& operator*=(Dual<R, P>& a, const B& b) {
  a = a * b;
  return a;
}

// Elementary functions: plain types use std::, Duals apply the chain rule.
template <class R, int P>
BS_HD Dual<R, P> chain(const Dual<R, P>& a, R f, R df) {
  Dual<R, P> r;
  r.v = f;
  for (int p = 0; p < P; ++p) r.d[p] = df * a.d[p];
  return r;
}
template <class R, int P>
BS_HD Dual<R, P> exp(const Dual<R, P>& a) {
  const R e = std::exp(a.v);
  return chain(a, e, e);
}
template <class R, int P>
BS_HD Dual<R, P> sin(const Dual<R, P>& a) {
  return chain(a, std::sin(a.v), std::cos(a.v));
}
template <class R, int P>
BS_HD Dual<R, P> cos(const Dual<R, P>& a) {
  return chain(a, std::cos(a.v), -std::sin(a.v));
}
using std::cos;
using std::exp;
using std::sin;

// sin and cos of one angle (float or double): on the device one range reduction for both (sincosf, sincos).
// (The Dual overload below is the more specialised for dual numbers.)
template <class R>
BS_HD void sin_cos(R a, R& s, R& c) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<R, float>::value)
    sincosf(a, &s, &c);
  else
    sincos(a, &s, &c);
#else
  s = std::sin(a);
  c = std::cos(a);
#endif
}
template <class R, int P>
BS_HD void sin_cos(const Dual<R, P>& a, Dual<R, P>& s, Dual<R, P>& c) {
  R sv, cv;
  sin_cos(a.v, sv, cv);
  s = chain(a, sv, cv);
  c = chain(a, cv, -sv);
}

// ---- complex numbers over N ----------------------------------------------------------------------
template <class N>
struct Cx {
  N re, im;
  BS_HD Cx() : re(0), im(0) {}
  BS_HD Cx(N r) : re(r), im(0) {}  // NOLINT
  BS_HD Cx(N r, N i) : re(r), im(i) {}
};

template <class N>
BS_HD Cx<N> operator+(const Cx<N>& a, const Cx<N>& b) {
  return Cx<N>(a.re + b.re, a.im + b.im);
}
template <class N>
BS_HD Cx<N> operator-(const Cx<N>& a, const Cx<N>& b) {
  return Cx<N>(a.re - b.re, a.im - b.im);
}
template <class N>
BS_HD Cx<N> operator-(const Cx<N>& a) {
  return Cx<N>(-a.re, -a.im);
}
template <class N>
BS_HD Cx<N> operator*(const Cx<N>& a, const Cx<N>& b) {
  return Cx<N>(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}
template <class N>
BS_HD Cx<N> operator*(const Cx<N>& a, const N& b) {
  return Cx<N>(a.re * b, a.im * b);
}
template <class N>
BS_HD Cx<N> operator*(const N& a, const Cx<N>& b) {
  return Cx<N>(a * b.re, a * b.im);
}
// A dual complex number times a real one's complex or real value (the second order's states by a pulse's
// rotation where no tangent reaches it: event_loop.hpp kDecodedValues): two products a part, where a dual
// factor takes three.
template <class R, int P>
BS_HD Cx<Dual<R, P>> operator*(const Cx<Dual<R, P>>& a, const Cx<R>& b) {
  return Cx<Dual<R, P>>(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}
template <class R, int P>
BS_HD Cx<Dual<R, P>> operator*(const Cx<R>& a, const Cx<Dual<R, P>>& b) {
  return b * a;
}
template <class R, int P>
BS_HD Cx<Dual<R, P>> operator*(const Cx<Dual<R, P>>& a, R b) {
  return Cx<Dual<R, P>>(a.re * b, a.im * b);
}
template <class R, int P>
BS_HD Cx<Dual<R, P>> operator*(R a, const Cx<Dual<R, P>>& b) {
  return b * a;
}
template <class N>
BS_HD Cx<N>& operator+=(Cx<N>& a, const Cx<N>& b) {
  a = a + b;
  return a;
}
template <class N>
BS_HD Cx<N> conj(const Cx<N>& a) {
  return Cx<N>(a.re, -a.im);
}
template <class N>
BS_HD Cx<N> mul_i(const Cx<N>& a) {  // i * a
  return Cx<N>(-a.im, a.re);
}
template <class N>
BS_HD Cx<N> cis(const N& angle) {  // exp(i angle)
  Cx<N> z;
  sin_cos(angle, z.im, z.re);
  return z;
}
template <class N>
BS_HD N re(const Cx<N>& a) {
  return a.re;
}
template <class N>
BS_HD N im(const Cx<N>& a) {
  return a.im;
}

// The real path keeps states in real planes; these let generic code treat them like complex ones.
template <class N>
BS_HD N conj(const N& a) {
  return a;
}
template <class N>
BS_HD N re(const N& a) {
  return a;
}
template <class N>
BS_HD N im(const N&) {
  return N(0);
}

// Re(conj(a) * b): the real inner product of adjoint a and perturbation b.
template <class N>
BS_HD N re_dot(const Cx<N>& a, const Cx<N>& b) {
  return a.re * b.re + a.im * b.im;
}
template <class N>
BS_HD N re_dot(const N& a, const N& b) {
  return a * b;
}

}  // namespace bs
