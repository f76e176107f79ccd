// One portability macro: the kernel headers compile with g++ for the host and with nvcc for the device.
#pragma once

#if defined(__CUDACC__)
#define BS_HD __host__ __device__ __forceinline__
#else
#define BS_HD inline __attribute__((always_inline))
#endif
