// Portability macros: the kernel headers compile with g++ for the host and with nvcc for the device.
#pragma once

#if defined(__CUDACC__)
#define BS_HD __host__ __device__ __forceinline__
// Loops over EPG orders unroll fully where the device kernel fixes the order count at compile time,
// so a voxel's states stay in registers; elsewhere the hint is harmless.
#define BS_UNROLL _Pragma("unroll")
#define BS_NO_UNROLL _Pragma("unroll 1")
#define BS_NO_ALIAS BS_UNROLL
#else
#define BS_HD inline __attribute__((always_inline))
#define BS_UNROLL
#define BS_NO_UNROLL
// A loop whose arrays the caller keeps apart (their pointers come from one scratch buffer, so the compiler
// cannot tell): the host vectorises it without run-time overlap checks.
#define BS_NO_ALIAS _Pragma("GCC ivdep")
#endif
