#!/usr/bin/env bash
# The plain group adjoint held to the host library without a card: apply ../plain-group-adjoint.patch to a copy
# of this tree (HEAD's tracked files, this directory's files as they are now), then run
# test_plain_groups_on_host.py there (the CUDA build's adjoint passes compiled by g++ on cuda_on_host/, every
# warp of a grid as 32 threads) with every train and stride (FULL=1), under AddressSanitizer with SANITIZE=1
# (its build of every adjoint kernel takes many minutes of one core, with UBSan beside it more than 15); then,
# with MUTATIONS=1, the default cases (without the sanitizers) with one line of the patch undone at a time (five of event_loop.hpp's
# lane rules, two of the kernel's), each of which must fail. Needs the host library (BLOCHSIM_CPU_LIBRARY, or
# the package installed) and g++ with C++20. Run from the repository root:
#   bash benchmarks/variants/plain-group-adjoint-emulation/run.sh
set -uo pipefail
here=benchmarks/variants/plain-group-adjoint-emulation
work=${WORK:-/tmp/plain-group-emulation}
rm -rf "$work" && mkdir -p "$work/tree"
git archive HEAD | tar -x -C "$work/tree"
(cd "$work/tree" && git apply "$OLDPWD/benchmarks/variants/plain-group-adjoint.patch") || exit 1
rm -rf "$work/tree/$here" && mkdir -p "$work/tree/$here" && cp -r "$here"/. "$work/tree/$here/"
check() {  # sanitized: under AddressSanitizer; plain: without (the mutations: a build each)
  local mode=$1; shift
  if [ "$mode" = sanitized ]; then
    (cd "$work/tree" && ASAN_OPTIONS=detect_leaks=0 \
      LD_PRELOAD="$(g++ -print-file-name=libasan.so)" \
      EMULATION_CXXFLAGS="-fsanitize=address" PYTHONPATH=. \
      python3 -m pytest -q -p no:cacheprovider "$here/test_plain_groups_on_host.py" "$@")
  else
    (cd "$work/tree" && PYTHONPATH=. python3 -m pytest -q -p no:cacheprovider "$here/test_plain_groups_on_host.py" "$@")
  fi
}
FULL=1 check "$([ "${SANITIZE:-0}" = 1 ] && echo sanitized || echo plain)"
status=$?
[ "${MUTATIONS:-0}" = 1 ] || exit $status
# Each mutation undoes one rule; the default cases must fail on every one. "file|sed expression".
while IFS='|' read -r file expr; do
  src=$work/tree/$file
  cp "$src" "$work/original"
  sed -i "$expr" "$src"
  if cmp -s "$work/original" "$src"; then echo "mutation did not apply: $expr"; status=1; continue; fi
  if check plain -x >"$work/mutation.log" 2>&1; then echo "mutation NOT caught: $expr"; status=1
  else echo "mutation caught: $expr: $(grep -m1 -E "^FAILED|Error|diverged" "$work/mutation.log" | cut -c1-110)"; fi
  cp "$work/original" "$src"
done <<'MUTATIONS'
csrc/include/blochsim/event_loop.hpp|s/if (!order0) gq.a0 = gq.c0 = N(0);/;/
csrc/include/blochsim/event_loop.hpp|s/if (x.k0 != 0) lane_q.a0 = lane_q.c0 = N(0);/;/
csrc/include/blochsim/event_loop.hpp|s/if (!order0) f0 = N(0);  \/\/ another/;  \/\/ another/
csrc/include/blochsim/event_loop.hpp|s/if (order0) add_sample_adjoint(l.fp(0)\[0\], w, pe.turn);/add_sample_adjoint(l.fp(0)[0], w, pe.turn);/
csrc/include/blochsim/event_loop.hpp|s/  return k0 == 0 \&\& shift.samples;/  return shift.samples;/
csrc/cuda/epg_device.cuh|/vjp_plain_lanes_kernel(const Problem<R> pb_in/,/^}/ s/  eg.active = active;/  eg.active = true;/
csrc/cuda/epg_device.cuh|s/lane_store_size(pb_in, KPL, true)/lane_store_size(pb_in, KPL \/ 2, true)/
MUTATIONS
exit $status
