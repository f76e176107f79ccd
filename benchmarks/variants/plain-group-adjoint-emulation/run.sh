#!/usr/bin/env bash
# The plain group adjoint's host emulation: apply ../plain-group-adjoint.patch to a copy of this tree (HEAD's
# tracked files), build group_emulation.cpp against it with AddressSanitizer and UBSan, and run check.py,
# then (MUTATIONS=1) the same checks with each of five lines of the patch's group path undone, each of which
# must fail. Needs the host library (BLOCHSIM_CPU_LIBRARY, or the package built in place) and g++ with C++20.
# Run from the repository root: bash benchmarks/variants/plain-group-adjoint-emulation/run.sh
set -uo pipefail
here=benchmarks/variants/plain-group-adjoint-emulation
work=${WORK:-/tmp/plain-group-emulation}
rm -rf "$work" && mkdir -p "$work/tree"
git archive HEAD | tar -x -C "$work/tree"
(cd "$work/tree" && git apply "$OLDPWD/benchmarks/variants/plain-group-adjoint.patch") || exit 1
cp "$here/group_emulation.cpp" "$here/check.py" "$work/"
loop=$work/tree/csrc/include/blochsim/event_loop.hpp
cp "$loop" "$work/event_loop.hpp"
build() {
  g++ -std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fPIC -shared -pthread \
    -I "$work/tree/csrc" -I "$work/tree/csrc/include" "$work/group_emulation.cpp" -o "$work/libgroup_emulation.so"
}
check() {
  ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libubsan.so)" \
    TREE="$work/tree" PYTHONPATH="$work/tree" EMULATION="$work/libgroup_emulation.so" python3 "$work/check.py"
}
build || exit 1
check
status=$?
[ "${MUTATIONS:-0}" = 1 ] || exit $status
# Each mutation undoes one of the group path's lane rules; the check must fail on every one.
while IFS= read -r expr; do
  cp "$work/event_loop.hpp" "$loop"
  sed -i "$expr" "$loop"
  if cmp -s "$work/event_loop.hpp" "$loop"; then echo "mutation did not apply: $expr"; status=1; continue; fi
  build || exit 1
  if QUICK=1 check >"$work/mutation.log" 2>&1; then echo "mutation NOT caught: $expr"; status=1
  else echo "mutation caught: $expr: $(tail -1 "$work/mutation.log" | cut -c1-100)"; fi
done <<'MUTATIONS'
s/if (!order0) gq.a0 = gq.c0 = N(0);/;/
s/if (x.k0 != 0) lane_q.a0 = lane_q.c0 = N(0);/;/
s/if (!order0) f0 = N(0);  \/\/ another/;  \/\/ another/
s/if (order0) add_sample_adjoint(l.fp(0)\[0\], w, pe.turn);/add_sample_adjoint(l.fp(0)[0], w, pe.turn);/
s/  return k0 == 0 \&\& shift.samples;/  return shift.samples;/
MUTATIONS
cp "$work/event_loop.hpp" "$loop"
exit $status
