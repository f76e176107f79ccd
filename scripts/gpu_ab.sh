#!/usr/bin/env bash
# A/B of CUDA kernel variants through the public API on the lent card (run from the repo root).
#
# Builds the tree's CUDA library (build/gpu, as scripts/run_gpu_tests.sh does: a call after that one builds
# nothing) and one library per variant named in VARIANTS, each the tree with benchmarks/variants/<name>.patch
# applied (build/gpu-ab/<name>, from a copy made once: a later call on a warm machine rebuilds nothing), then
# runs benchmarks/api_cases.py on each library in turn, ROUNDS times, alternating, so that each comparison is
# read within one run on one card. STRIDES adds each library at each forced checkpoint stride (api_cases
# --stride: every adjoint launch) to every round, and SCRATCH_MIB the tree's library at each scratch cap
# (api_cases --scratch-mib: an adjoint then holds up to that much where its own call's arrays come to less;
# the peaks show what it costs).
#
#   VARIANTS="replay-to-last-pass" CASES="epg_real_grad" N="2000 20000" STRIDES="3" COMMIT=<commit> \
#     bash scripts/gpu_ab.sh
#   VARIANTS="lambda-in-registers" CASES="epg_real_grad" N="100000 1000000" STRIDES="9 15" SCRATCH_MIB="768" \
#     COMMIT=<commit> bash scripts/gpu_ab.sh
#
# Each run writes its record under $OUT/ab/<library>[-s<stride>|-m<MiB>]-r<round>/ with
# BLOCHSIM_RECORD_COMMIT set to COMMIT[-variant], and the script prints every run's table. BUILD_ONLY=1 stops
# after the builds (a call of its own where the builds and the runs would not fit one call's time).
# PREBUILT=dir builds nothing: each library (base and every variant) is dir/<name>/libblochsim_cuda.so[.xz],
# built elsewhere and carried with the call (an xz'd library is ~18 MB: three fit the carry beside the tree),
# the host library dir/cpu/libblochsim_cpu.so[.xz]; .xz files are decompressed first.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/blochsim-ab}
mkdir -p "$out/ab"
commit=${COMMIT:-nogit}
rounds=${ROUNDS:-2}
root=$PWD

prebuilt=${PREBUILT:-}
[ -n "$prebuilt" ] && [[ $prebuilt != /* ]] && prebuilt=$root/$prebuilt
libdir() {
  if [ -n "$prebuilt" ]; then echo "$prebuilt/$1"; elif [ "$1" = base ]; then echo "$root/build/gpu";
  else echo "$root/build/gpu-ab/$1"; fi
}
build() {  # build <name> <source dir>
  local dir
  dir=$(libdir "$1")
  local start=$SECONDS
  bash "$root/scripts/build_cuda.sh" "$2" "$dir" "$out" "$1" || return 1
  echo "build $1: $((SECONDS - start)) s"
}

# The tree with a variant's patch applied: the library's sources only (the Python package is the tree's).
variant_tree() {  # variant_tree <name> -> prints the source dir
  local src=$root/build/gpu-ab/src-$1
  if [ ! -d "$src" ]; then
    mkdir -p "$src/blochsim"
    cp -r CMakeLists.txt csrc scripts "$src/" && cp blochsim/_version.py "$src/blochsim/"
    (cd "$src" && patch -p1 -s <"$root/benchmarks/variants/$1.patch") >&2 || { rm -rf "$src"; return 1; }
  fi
  echo "$src"
}

libraries=(base ${VARIANTS:-})
if [ -n "$prebuilt" ]; then
  find "$prebuilt" -name '*.so.xz' -exec xz -d -f -k {} \;
  cpu_library=$prebuilt/cpu/libblochsim_cpu.so
else
  build base "$root" || exit 1
  for name in ${VARIANTS:-}; do
    src=$(variant_tree "$name") || { echo "variant $name: the patch does not apply"; exit 1; }
    build "$name" "$src" || exit 1
  done
fi
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
run() {  # run <library> <tag> [api_cases arguments...]
  local lib=$1 tag=$2
  shift 2
  local suffix=""
  [ "$lib" != base ] && suffix="-$lib"
  mkdir -p "$out/ab/$tag"
  echo "== $tag"
  local dir
  dir=$(libdir "$lib")
  BLOCHSIM_CPU_LIBRARY=${cpu_library:-$dir/libblochsim_cpu.so} BLOCHSIM_CUDA_LIBRARY=$dir/libblochsim_cuda.so \
    BLOCHSIM_RECORD_COMMIT="$commit$suffix" PYTHONPATH=$root \
    python3 benchmarks/api_cases.py --device cuda ${CASES:+--cases $CASES} ${N:+--n $N} \
    --out "$out/ab/$tag" "$@" 2>&1
}
for ((r = 1; r <= rounds; r++)); do
  for lib in "${libraries[@]}"; do
    run "$lib" "$lib-r$r"
    for stride in ${STRIDES:-}; do
      run "$lib" "$lib-s$stride-r$r" --stride "$stride"
    done
  done
  for mib in ${SCRATCH_MIB:-}; do
    run base "base-m$mib-r$r" --scratch-mib "$mib"
  done
done
