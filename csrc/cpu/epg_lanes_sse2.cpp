// The lane path for the x86-64 baseline: SSE2, 4 float lanes (epg_lanes.inc; dispatch in epg_lanes.cpp).
#include <cstring>
#include <type_traits>
#include <vector>

#include "epg_host.hpp"
#include "epg_lanes.hpp"

namespace bs::lanes_sse2 {
constexpr int kFloatLanes = 4;
#include "epg_lanes.inc"
}  // namespace bs::lanes_sse2
