#!/usr/bin/env bash
# The plain group adjoint's host emulations: apply ../plain-group-adjoint.patch to a copy of this tree (HEAD's
# tracked files), build against it, with AddressSanitizer and UBSan,
#   group_emulation.cpp   event_loop.hpp's group path, a lane a thread (the shifts copied from the device's)
#   kernel_emulation.cpp  the kernel's own source (epg_device.cuh vjp_plain_lanes_kernel) on cuda_on_host/,
#                         every warp of the grid as 32 threads: its warp sums, atomics, padding groups, scratch
# and run check.py on each (the kernel's on two trains at stride 4 unless FULL=1); then (MUTATIONS=1) the checks with one line of the patch undone at a time (five
# of event_loop.hpp's lane rules on the first, two of the kernel's on the second), each of which must fail.
# Needs the host library (BLOCHSIM_CPU_LIBRARY, or the package built in place) and g++ with C++20.
# Run from the repository root: bash benchmarks/variants/plain-group-adjoint-emulation/run.sh
set -uo pipefail
here=benchmarks/variants/plain-group-adjoint-emulation
work=${WORK:-/tmp/plain-group-emulation}
rm -rf "$work" && mkdir -p "$work/tree"
git archive HEAD | tar -x -C "$work/tree"
(cd "$work/tree" && git apply "$OLDPWD/benchmarks/variants/plain-group-adjoint.patch") || exit 1
cp -r "$here/group_emulation.cpp" "$here/kernel_emulation.cpp" "$here/cuda_on_host" "$here/check.py" "$work/"
build() {  # $1: group or kernel
  g++ -std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fPIC -shared -pthread \
    -I "$work/cuda_on_host" -I "$work/tree/csrc" -I "$work/tree/csrc/include" -I "$work/tree/csrc/cuda" \
    "$work/$1_emulation.cpp" -o "$work/lib$1_emulation.so"
}
check() {  # $1: group or kernel
  ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libubsan.so)" \
    TREE="$work/tree" PYTHONPATH="$work/tree" EMULATION="$work/lib$1_emulation.so" python3 "$work/check.py"
}
status=0
for kind in group kernel; do
  echo "== $kind emulation"
  build $kind || exit 1
  # The kernel's emulation runs every warp of a grid at once (hundreds of threads meeting at each shuffle):
  # the trains at stride 4 only, unless FULL=1; the group path's covers every stride.
  if [ $kind = kernel ] && [ "${FULL:-0}" != 1 ]; then QUICK=1 check $kind || status=1; else check $kind || status=1; fi
done
[ "${MUTATIONS:-0}" = 1 ] || exit $status
# Each mutation undoes one rule; the check must fail on every one. "file|sed expression|emulation".
while IFS='|' read -r file expr kind; do
  src=$work/tree/$file
  cp "$src" "$work/original"
  sed -i "$expr" "$src"
  if cmp -s "$work/original" "$src"; then echo "mutation did not apply: $expr"; status=1; continue; fi
  build $kind || exit 1
  if QUICK=1 check $kind >"$work/mutation.log" 2>&1; then echo "mutation NOT caught: $expr"; status=1
  else echo "mutation caught ($kind): $expr: $(tail -1 "$work/mutation.log" | cut -c1-100)"; fi
  cp "$work/original" "$src"
done <<'MUTATIONS'
csrc/include/blochsim/event_loop.hpp|s/if (!order0) gq.a0 = gq.c0 = N(0);/;/|group
csrc/include/blochsim/event_loop.hpp|s/if (x.k0 != 0) lane_q.a0 = lane_q.c0 = N(0);/;/|group
csrc/include/blochsim/event_loop.hpp|s/if (!order0) f0 = N(0);  \/\/ another/;  \/\/ another/|group
csrc/include/blochsim/event_loop.hpp|s/if (order0) add_sample_adjoint(l.fp(0)\[0\], w, pe.turn);/add_sample_adjoint(l.fp(0)[0], w, pe.turn);/|group
csrc/include/blochsim/event_loop.hpp|s/  return k0 == 0 \&\& shift.samples;/  return shift.samples;/|group
csrc/cuda/epg_device.cuh|/vjp_plain_lanes_kernel(const Problem<R> pb_in/,/^}/ s/  eg.active = active;/  eg.active = true;/|kernel
csrc/cuda/epg_device.cuh|s/lane_store_size(pb_in, KPL, true)/lane_store_size(pb_in, KPL \/ 2, true)/|kernel
MUTATIONS
exit $status
