// Second-order adjoint: one tangent (P = 1), each precision and state path compiled apart (epg_vjp_jvp.hpp).
#include <stdexcept>
#include <string>

#include "capi.h"

namespace bs {
// Defined in epg_vjp_jvp.hpp, instantiated in the units CMakeLists.txt writes.
template <class R, bool kComplex>
void vjp_jvp_at(const bs_epg_vjp_jvp_args& a);

template <class R>
void vjp_jvp_entry(const bs_epg_vjp_jvp_args& a) {
  if (a.tangents.count != 1)
    throw std::invalid_argument("tangents.count must be 1 for the second-order adjoint, got " +
                                std::to_string(a.tangents.count));
  if (a.program.path == BS_PATH_REAL)
    vjp_jvp_at<R, false>(a);
  else
    vjp_jvp_at<R, true>(a);
}
template void vjp_jvp_entry<float>(const bs_epg_vjp_jvp_args&);
template void vjp_jvp_entry<double>(const bs_epg_vjp_jvp_args&);
}  // namespace bs
