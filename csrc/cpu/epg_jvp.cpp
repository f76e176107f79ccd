// JVP: P tangents at once (P padded up to 1, 2, 4 or 8), each P compiled apart (epg_jvp.hpp).
#include <stdexcept>
#include <string>

#include "capi.h"

namespace bs {
// Defined in epg_jvp.hpp, instantiated in the units CMakeLists.txt writes.
template <class R, int P>
void jvp_at(const bs_epg_jvp_args& a);

template <class R>
void jvp_entry(const bs_epg_jvp_args& a) {
  switch (a.tangents.count) {
    case 1: return jvp_at<R, 1>(a);
    case 2: return jvp_at<R, 2>(a);
    case 4: return jvp_at<R, 4>(a);
    case 8: return jvp_at<R, 8>(a);
    default:
      throw std::invalid_argument("tangents.count must be 1, 2, 4 or 8 (pad with zero tangents), got " +
                                  std::to_string(a.tangents.count));
  }
}
template void jvp_entry<float>(const bs_epg_jvp_args&);
template void jvp_entry<double>(const bs_epg_jvp_args&);
}  // namespace bs
