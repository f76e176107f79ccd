#!/usr/bin/env bash
# Build the release's three wheels into dist/ and check each one:
#   blochsim        (Python package + libblochsim_cpu.so)
#   blochsim-cuda12 (NVRTC 12.6 fatbin + g++ launcher; PyPI has no CUDA 12 nvcc)
#   blochsim-cuda13 (nvcc 13.0 from PyPI's cuda-toolkit)
# Each is built by pip with build isolation, so its toolchain comes from its pyproject.toml's build
# requirements (PyPI) and nothing from this machine but a C++ compiler and CMake.
#
#   scripts/build_wheels.sh              # all three (about 30 minutes on 2 cores: the CUDA ones dominate)
#   scripts/build_wheels.sh cpu cu13     # a subset
#   DIST=/tmp/w scripts/build_wheels.sh  # another output folder
# Release builds use a manylinux_2_28 container (.github/workflows/wheels.yml): gcc 12 here yields
# linux_x86_64 wheels that need glibc 2.34.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=${DIST:-dist}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
# The base wheel holds every host SIMD set (a source build compiles only its processor's widest).
export CMAKE_ARGS="${CMAKE_ARGS:+$CMAKE_ARGS }-DBLOCHSIM_HOST_LANES=all"
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(cpu cu12 cu13)
mkdir -p "$dist"
for t in "${targets[@]}"; do
  case $t in
    cpu) src=. ;;
    cu12) src=packages/blochsim-cuda12 ;;
    cu13) src=packages/blochsim-cuda13 ;;
    *) echo "unknown target $t (cpu, cu12, cu13)" >&2; exit 2 ;;
  esac
  echo "== $t: pip wheel $src" >&2
  start=$SECONDS
  python3 -m pip wheel --no-deps --disable-pip-version-check -w "$dist" "$src"
  echo "== $t: built in $((SECONDS - start)) s" >&2
done
# cuobjdump lists the CUDA wheels' architectures; PyPI has it (any 13.x reads CUDA 12 fatbins too).
if ! command -v cuobjdump >/dev/null && [ ! -x /usr/local/cuda/bin/cuobjdump ] && [ ! -x .whl/tools/nvidia/cu13/bin/cuobjdump ]; then
  python3 -m pip install -q --no-deps --target .whl/tools "nvidia-cuda-cuobjdump>=13"
fi
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' blochsim/_version.py)
python3 scripts/check_wheel.py "$dist"/blochsim*-"$version"-*.whl
