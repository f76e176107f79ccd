#!/usr/bin/env bash
# Whether tests/test_cuda_on_host.py can fail: for each mutation below (a line of the CUDA kernels undone), build
# the CUDA library on the host from a copy of HEAD with it applied and run the tests that should catch it; each
# must fail. Needs the host library (BLOCHSIM_CPU_LIBRARY, or the package installed) and g++ with C++20.
# Run from the repository root: bash scripts/cuda_on_host_mutations.sh
set -uo pipefail
work=${WORK:-/tmp/cuda-on-host-mutations}
rm -rf "$work" && mkdir -p "$work/tree" && git archive HEAD | tar -x -C "$work/tree"
status=0
# file | sed expression | the tests (-k) that must catch it
while IFS='|' read -r file expr tests; do
  src=$work/tree/$file
  cp "$src" "$work/original"
  sed -i "$expr" "$src"
  if cmp -s "$work/original" "$src"; then echo "mutation did not apply: $expr"; status=1; continue; fi
  if ! (cd "$work/tree" && PYTHONPATH=. python3 tests/test_cuda_on_host.py build "$work/lib" >"$work/build.log" 2>&1); then
    echo "mutation did not build: $expr"; status=1
  elif (cd "$work/tree" && BLOCHSIM_CUDA_ON_HOST_LIBRARY="$work/lib/libblochsim_cuda_on_host.so" PYTHONPATH=. \
        python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda_on_host.py -k "$tests" >"$work/test.log" 2>&1); then
    echo "mutation NOT caught: $expr"; status=1
  else
    echo "mutation caught: $expr: $(grep -m1 -E "^FAILED" "$work/test.log" | cut -c1-120)"
  fi
  cp "$work/original" "$src"
done <<'MUTATIONS'
csrc/cuda/epg_device.cuh|s/for (int o = LANES \/ 2; o > 0; o >>= 1)/for (int o = LANES \/ 2; o > 1; o >>= 1)/|derivatives and warp
csrc/include/blochsim/event_loop.hpp|s/if (!order0) f0 = N(0);  \/\/ another/;  \/\/ another/|plain_adjoint and auto
csrc/cuda/epg_device.cuh|/vjp_plain_lanes_kernel(const Problem<R> pb_in/,/^}/ s/  eg.active = active;/  eg.active = true;/|plain_adjoint and lanes4
csrc/cuda/epg_device.cuh|s/for (int q = 0; q < kStaged; ++q, to += step) to\[0\] = from\[q \* kVoxels\];/for (int q = 0; q < kStaged; ++q, to += step) to[0] = from[q];/|register_kernel
csrc/cuda/epg_device.cuh|s/  if (!folds_into(head.ev, first.ev)) return;/;/|folded_events and auto
csrc/cuda/epg_device.cuh|s/  const int64_t k0 = int64_t(lane) \* KPL;/  const int64_t k0 = int64_t(LANES == 32 ? lane ^ 1 : lane) * KPL;/|plain_adjoint and plain32
csrc/cuda/epg_device.cuh|/__device__ void add_table/,/^  }/ s/    const N y = each_float(x, GroupSum{voxel_lanes});/    const N y = x;/|saturation and warp
csrc/cuda/epg_device.cuh|s/  eg.voxel_lanes = LANES;/  eg.voxel_lanes = 32;/|fixed_pool_group and poolb
csrc/include/blochsim/event_loop.hpp|s/  c.sa = r.sa;/  c.sa = -r.sa;/|plain_adjoint and auto
csrc/include/blochsim/event_loop.hpp|s/    ev.dt = N(ev.wrap ? dt_wrap : held.dt);/    ev.dt = N(held.dt);/|plain_adjoint and auto
csrc/include/blochsim/event_loop.hpp|s/        DecodedPlainEvents<N, R> events{{pb, t}, codes, codes\[pb.E\].dt, {}, {}, {}};/        DecodedPlainEvents<N, R> events{{pb, t}, codes, 2 * codes[pb.E].dt, {}, {}, {}};/|plain_adjoint and thread
csrc/include/blochsim/event_loop.hpp|s/      f.record = pb.record\[m\];/      f.record = f.record;/|plain_adjoint and auto
csrc/include/blochsim/event_loop.hpp|s/  f.back = int16_t(e == 0 ? pb.E - p : e - p);/  f.back = int16_t(e == 0 ? pb.E - p : 1);/|plain_adjoint and auto
csrc/include/blochsim/event_loop.hpp|s/    const int64_t skip = events.ahead(e);  \/\/ to the stretch's first head/    const int64_t skip = 0;/|plain_adjoint and thread
csrc/include/blochsim/launch_plan.hpp|s/start_adjoint_lanes<N, S, 4, kPlain, 8>(launcher, shape, general, V,/start_adjoint_lanes<N, S, 4, kPlain, 8>(launcher, shape, general, V - 1,/|first_and_second and auto
csrc/include/blochsim/event_loop.hpp|s/  c.turn = cis(-fetch<R>(pb.phase, e + f.sample_at));/  c.turn = cis(fetch<R>(pb.phase, e + f.sample_at));/|first_and_second and auto
csrc/include/blochsim/event_loop.hpp|s/  ev.rotation = uniform ? \&c.rotation : nullptr;/  ev.rotation = \&c.rotation;/|general_adjoint_decoded and map
csrc/include/blochsim/event_loop.hpp|s/  ev.dt = ev.wrap ? fetch<N>(pb.dt_wrap, 0) : N(c.dt);/  ev.dt = N(c.dt);/|general_adjoint_decoded and map
csrc/include/blochsim/launch_plan.hpp|s/start_adjoint_lanes<N, S, 1, kPlain, 32>(launcher, shape,/start_adjoint_lanes<N, S, 1, kPlain, 32>(launcher, lanes_shape(V, 8),/|first_and_second and warp
csrc/include/blochsim/event_loop.hpp|s/    eg.add(kGradPhase, ev.e + ev.sample_at, /    eg.add(kGradPhase, ev.e, /|general_adjoint_decoded and map
csrc/include/blochsim/event_loop.hpp|s/    if constexpr (kFolds) return codes\[e\].back;/    if constexpr (kFolds) return 1;/|general_adjoint_folds and auto
csrc/include/blochsim/event_loop.hpp|s/    const int64_t skip = ahead(e);/    const int64_t skip = 0;/|general_adjoint_folds and auto
csrc/include/blochsim/event_loop.hpp|s/  if (c.record >= 0) turn = cis(-fetch<N>(pb.phase, e + c.sample_at));/  if (c.record >= 0) turn = cis(-fetch<N>(pb.phase, e));/|general_adjoint_decoded and map
csrc/include/blochsim/launch_rules.hpp|s/  if (complex_second_order \&\& plain_general_adjoint<N, S>(pb, 16)) return 16;/;/|general_adjoint_folds and auto
csrc/include/blochsim/launch_rules.hpp|/const bool second_order_groups = Num<N>::P == 1/ s/lanes == 8/lanes == 0/|general_adjoint_folds and plain8
csrc/include/blochsim/launch_rules.hpp|s/  if (pool_groups) return warp_adjoint<N, S>(pb, V) ? 16 : 1;/  if (pool_groups) return warp_adjoint<N, S>(pb, V) ? 32 : 1;/|pool_second_order_groups
csrc/include/blochsim/launch_plan.hpp|s/    if (values_decodable(pb)) {/    if (false) {/|pool_second_order_groups
csrc/include/blochsim/launch_rules.hpp|s/  const bool complex_plain = std::is_same<S, Cx<N>>::value \&\& !per_voxel_pulses(pb);/  const bool complex_plain = false;/|first_and_second and lanes8
csrc/include/blochsim/number.hpp|/operator\*(const Cx<Dual<R, P>>& a, const Cx<R>& b)/,/^}/ s/a.re \* b.im + a.im \* b.re/a.re * b.im - a.im * b.re/|first_and_second and auto
csrc/include/blochsim/epg.hpp|s/return Cx<N>(N(ev.value_turn->re), N(ev.value_turn->im));/return Cx<N>(N(ev.value_turn->re), -N(ev.value_turn->im));/|first_and_second and auto
csrc/include/blochsim/launch_rules.hpp|s/    if (!warp_kernels .* !values_decodable(pb)) return false;/    return false;/|jvp_on_decoded or pool_second_order
csrc/cuda/epg_device.cuh|/forward_values_kernel(const Problem<R> pb_in/,/^}/ s/    const int64_t steps = codes\[e\].span;/    const int64_t steps = 1;/|jvp_on_decoded
MUTATIONS
exit $status
