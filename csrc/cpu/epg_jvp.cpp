// JVP: P tangents at once (P padded up to 1, 2, 4 or 8), each P compiled apart (epg_jvp.hpp). Eight tangents
// run as two passes of four, so nothing is compiled for eight: the two JVP units (13-17 s of CPU each) and the
// lanes' eight-tangent forward in each instruction set cost a fresh install on 2 cores about 40 s of CPU, and
// two passes of four ran 5-6-column Jacobians in 0.89-1.11x the time of one of eight (docs/design.md, "Build
// and loading").
#include <stdexcept>
#include <string>

#include "capi.h"

namespace bs {
// Defined in epg_jvp.hpp, instantiated in the units CMakeLists.txt writes.
template <class R, int P>
void jvp_at(const bs_epg_jvp_args& a);

namespace {
// The call's tangents first .. first + count - 1 alone: every tangent array (a leading [P] axis, capi.h) and the
// signal's tangent ([P, V, S] complex) advanced by `first` directions. Null (zero) tangents stay null.
template <class R>
bs_epg_jvp_args tangents_from(const bs_epg_jvp_args& a, int first, int count) {
  bs_epg_jvp_args b = a;
  auto skip = [first](const void* data, int64_t stride_p) -> const void* {
    return data ? static_cast<const R*>(data) + first * stride_p : nullptr;
  };
  bs_tangents& t = b.tangents;
  t.count = count;
  for (int j = 0; j < BS_NUM_TISSUE; ++j) t.tissue[j] = skip(t.tissue[j], t.tissue_stride_p[j]);
  t.dt_s = skip(t.dt_s, a.program.num_events);
  t.dt_wrap_s = skip(t.dt_wrap_s, 1);
  t.flip_rad = skip(t.flip_rad, a.program.num_events);
  t.phase_rad = skip(t.phase_rad, a.program.num_events);
  bs_tables& tt = b.tables_tangent;  // stride_p in the order of unpack.hpp's tables
  const void** tables[] = {&tt.L, &tt.r, &tt.T, &tt.zeq, &tt.sat, &tt.field, &tt.spinor, &tt.profile};
  for (int i = 0; i < 8; ++i) *tables[i] = skip(*tables[i], tt.stride_p[i]);
  if (a.signal_tangent)
    b.signal_tangent = static_cast<R*>(a.signal_tangent) + 2 * first * a.tissue.num_voxels * a.program.num_samples;
  return b;
}
}  // namespace

template <class R>
void jvp_entry(const bs_epg_jvp_args& a) {
  switch (a.tangents.count) {
    case 1: return jvp_at<R, 1>(a);
    case 2: return jvp_at<R, 2>(a);
    case 4: return jvp_at<R, 4>(a);
    case 8:
      jvp_at<R, 4>(tangents_from<R>(a, 0, 4));
      return jvp_at<R, 4>(tangents_from<R>(a, 4, 4));
    default:
      throw std::invalid_argument("tangents.count must be 1, 2, 4 or 8 (pad with zero tangents), got " +
                                  std::to_string(a.tangents.count));
  }
}
template void jvp_entry<float>(const bs_epg_jvp_args&);
template void jvp_entry<double>(const bs_epg_jvp_args&);
}  // namespace bs
