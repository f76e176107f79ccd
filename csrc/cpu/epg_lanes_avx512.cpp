// The lane path for AVX-512: 16 float lanes (epg_lanes.inc; dispatch in epg_lanes.cpp). The headers come
// first, outside the target region, as in epg_lanes_avx2.cpp.
#include <cstring>
#include <type_traits>
#include <vector>

#include "epg_host.hpp"
#include "epg_lanes.hpp"

#ifdef BS_HAVE_WIDE_LANES
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
namespace bs::lanes_avx512 {
constexpr int kFloatLanes = 16;
#include "epg_lanes.inc"
}  // namespace bs::lanes_avx512
#pragma GCC pop_options
#endif
