// The lane path where GCC's x86-64 target regions are not available (another architecture or compiler): the
// portable 4-lane code (epg_lanes.inc; dispatch in epg_lanes.cpp). With GCC on x86-64 this unit is empty: a
// processor without AVX2 and FMA (Intel's before 2013, AMD's before 2015, some Atom, Celeron and Pentium
// parts since) runs the per-voxel path, 4.3-6x slower than these lanes, and a fresh install compiles about
// 18 s of CPU less (docs/design.md, "Build and loading").
#include <cstring>
#include <type_traits>
#include <vector>

#include "epg_host.hpp"
#include "epg_lanes.hpp"

#ifndef BS_HAVE_WIDE_LANES
namespace bs::lanes_sse2 {
constexpr int kFloatLanes = 4;
#include "epg_lanes.inc"
}  // namespace bs::lanes_sse2
#endif
