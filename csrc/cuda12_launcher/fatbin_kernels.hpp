// The kernels of the CUDA 12 package's fatbin, shared by its launcher (launcher.cpp) and the program that
// lists them for the fatbin's build (kernel_list.cpp): a thread per voxel for every pass (no warp or group
// kernels, no event decoding: launch_plan.hpp with kWarpKernels false), each kernel named by the expression
// NVRTC instantiates it from (scripts/build_cu12_fatbin.py) and the launcher finds it by.
#pragma once

#include <string>

#include "blochsim/launch_plan.hpp"
#include "cuda12_launcher/params.hpp"

namespace bs {

// What the CUDA 12 package's launchers share (launch_plan.hpp says what a launcher provides).
struct ThreadKernels : ResidencyQuery {
  static constexpr bool kWarpKernels = false;
  // bs::DeviceEventGrad<N> is device code; params.hpp mirrors its bytes (kernels.cu checks).
  template <class N>
  using EventGrad = bs12::EventGradParams<typename Num<N>::Real>;
};

template <class T>
struct TypeName;  // spelled as the name expressions spell it
template <>
struct TypeName<float> {
  static std::string get() { return "float"; }
};
template <int P>
struct TypeName<Dual<float, P>> {
  static std::string get() { return "bs::Dual<float, " + std::to_string(P) + ">"; }
};
template <class N>
struct TypeName<Cx<N>> {
  static std::string get() { return "bs::Cx<" + TypeName<N>::get() + ">"; }
};

// The name expression of a thread-per-voxel kernel (ForwardThread, AdjointThread: the table's rows with
// template parameters <N, S, KC>), with R, the problem's real type, float (the CUDA libraries take float32).
template <template <class, class, int> class Tag, class N, class S, int KC>
std::string kernel_expression(Tag<N, S, KC>) {
  return std::string("bs::") + Tag<N, S, KC>::name + "<" + TypeName<N>::get() + ", " + TypeName<S>::get() + ", " +
         std::to_string(KC) + ", float>";
}

}  // namespace bs
