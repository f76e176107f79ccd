// Device code of the CUDA 12 package: csrc/cuda/epg_device.cuh compiled by NVRTC 12 (PyPI has no CUDA 12
// nvcc). scripts/build_cu12_fatbin.py instantiates the kernels by name expression, one cubin per
// architecture plus PTX, and packs them into the fatbin that launcher.cpp embeds. nvrtc_include/ stands in
// for the few standard headers the shared kernel headers include.
#include "epg_device.cuh"

#include "cuda12_launcher/params.hpp"

// The launcher passes bs12::EventGradParams where the kernel takes bs::DeviceEventGrad<N>.
template <class N>
struct SameLayout {
  using D = bs::DeviceEventGrad<N>;
  using M = bs12::EventGradParams<typename bs::Num<N>::Real>;
  static_assert(sizeof(D) == sizeof(M) && std::is_same<decltype(D::out), decltype(M::out)>::value &&
                    std::is_same<decltype(D::out_tan), decltype(M::out_tan)>::value &&
                    std::is_same<decltype(D::active), decltype(M::active)>::value,
                "csrc/cuda12_launcher/params.hpp no longer mirrors bs::DeviceEventGrad");
};
template struct SameLayout<float>;
template struct SameLayout<bs::Dual<float, 1>>;
