// The lane path for AVX2 with FMA: 8 float lanes (epg_lanes.inc; dispatch in epg_lanes.cpp). The headers
// come first, outside the target region, so everything they define stays baseline code (a function the
// linker may take from any unit must be); only epg_lanes.inc's functions carry the target, and the event
// loop's functions, always inline, are compiled into them.
#include <cstring>
#include <type_traits>
#include <vector>

#include "epg_host.hpp"
#include "epg_lanes.hpp"

#ifdef BS_HAVE_WIDE_LANES
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace bs::lanes_avx2 {
constexpr int kFloatLanes = 8;
#include "epg_lanes.inc"
}  // namespace bs::lanes_avx2
#pragma GCC pop_options
#endif
