#!/usr/bin/env bash
# Build the host and CUDA libraries (sm_90) of a source tree: build_cuda.sh <source dir> <build dir> <log dir> [tag].
# The one configure line scripts/run_gpu_tests.sh and scripts/gpu_ab.sh build with; logs go to <log dir>/cmake[-tag].log
# and build[-tag].log, and a failure prints their tail or errors and exits non-zero.
set -uo pipefail
src=$1 dir=$2 logs=$3 tag=${4:+-$4}
cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLOCHSIM_CUDA=ON \
      -DBLOCHSIM_CUDA_ARCHITECTURES=90 >"$logs/cmake$tag.log" 2>&1 || { tail -30 "$logs/cmake$tag.log"; exit 1; }
ninja -C "$dir" -j "$(nproc)" blochsim_cpu blochsim_cuda >"$logs/build$tag.log" 2>&1 ||
  { grep -E "error" "$logs/build$tag.log" | head -30; exit 1; }
