#!/usr/bin/env bash
# On the lent GPU: the built wheels, installed as a user gets them, against the card.
# Needs dist/ (scripts/build_wheels.sh) and .whl/ (the nvidia-cuda-runtime-cu12 wheel that
# scripts/check_wheel.py fetched); both are git-ignored, so carry them:
#   run(command="bash scripts/gpu_wheel_check.sh", carry=["dist", ".whl"])
#
# cu13: blochsim + blochsim-cuda13 installed with pip --no-deps into a target folder whose nvidia/ is the
#   image torch's own nvidia wheels (as in one site-packages); the library loads bare and its libcudart
#   resolves through the rpath into torch's nvidia wheel; then tests/test_cuda.py runs on the wheel with
#   CUDA_DISABLE_PTX_JIT=1, so only the shipped machine code (sm_90 here) can run.
# cu12: the image's torch is a CUDA 13 build and no CUDA 12 torch can be installed there, so
#   blochsim-cuda12 is installed beside the carried nvidia-cuda-runtime-cu12 wheel, loaded bare (libcudart
#   12 from that wheel), and tests/test_cuda.py runs with torch.version.cuda mocked to 12.6 so the loader
#   picks blochsim_cuda12: its kernels then run through the CUDA 12 runtime beside torch's CUDA 13 one.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=${OUT:-/tmp/blochsim-wheels}
mkdir -p "$out"
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' blochsim/_version.py)
pick() { ls "$1"/$2 2>/dev/null | sort | tail -1; }
base=$(pick dist "blochsim-$version-*.whl")
cu12=$(pick dist "blochsim_cuda12-$version-*.whl")
cu13=$(pick dist "blochsim_cuda13-$version-*.whl")
rt12=$(pick .whl "nvidia_cuda_runtime_cu12-12.*.whl")
for f in base cu12 cu13 rt12; do
  [ -n "${!f}" ] || { echo "missing the $f wheel (carry dist and .whl)"; exit 2; }
done
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
ldd --version | head -1  # wheels built on Debian 12 (not in manylinux_2_28) need glibc 2.36
python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
status=0
export CUDA_DISABLE_PTX_JIT=1
unset BLOCHSIM_CUDA_LIBRARY BLOCHSIM_CPU_LIBRARY LD_LIBRARY_PATH

# Loads LIBRARY of the given package in a fresh process, without torch, and prints where libcudart came from.
bare='import ctypes, importlib, sys
m = importlib.import_module(sys.argv[1]); lib = ctypes.CDLL(str(m.LIBRARY))
lib.bs_version.restype = ctypes.c_char_p
cudart = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcudart" in l})
print(sys.argv[1], "ABI", lib.bs_abi_version(), "release", lib.bs_version().decode(), "libcudart", cudart)
sys.exit(0 if len(cudart) == 1 and cudart[0].startswith(sys.argv[2]) else 1)'
# Runs tests/test_cuda.py from the target folder (so blochsim is the installed wheel, not the tree).
tests='import os, sys, torch
if sys.argv[1] != "-": torch.version.cuda = sys.argv[1]
import pytest, blochsim
from blochsim import _native
assert blochsim.__file__.startswith(os.getcwd()), blochsim.__file__
code = pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[2]])
print("blochsim from", os.path.dirname(blochsim.__file__), "- CUDA library", getattr(_native._cuda, "_name", None))
sys.exit(code)'

echo "== cu13: $(basename "$cu13")"
t13=$(mktemp -d)/site
python3 -m pip install -q --no-deps --no-index --target "$t13" "$base" "$cu13" || exit 1
torch_nvidia=$(python3 -c "import nvidia, os; print(os.path.realpath(list(nvidia.__path__)[0]))" 2>/dev/null)
if [ -e "$torch_nvidia/cu13/lib/libcudart.so.13" ]; then
  ln -s "$torch_nvidia" "$t13/nvidia"
  (cd "$t13" && python3 -c "$bare" blochsim_cuda13 "$torch_nvidia/cu13/lib/") || { echo "FAIL: libcudart not from torch's wheel"; status=1; }
else
  echo "note: this torch has no nvidia/cu13 wheel; the library relies on the libcudart torch loaded"
fi
(cd "$t13" && python3 -c "$tests" - "$repo/tests/test_cuda.py") 2>&1 | tee "$out/cu13.log" | tail -4
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== cu12: $(basename "$cu12") beside $(basename "$rt12")"
t12=$(mktemp -d)/site
python3 -m pip install -q --no-deps --no-index --target "$t12" "$base" "$cu12" "$rt12" || exit 1
(cd "$t12" && python3 -c "$bare" blochsim_cuda12 "$t12/nvidia/cuda_runtime/lib/") || { echo "FAIL: libcudart 12 not from the wheel"; status=1; }
(cd "$t12" && python3 -c "$tests" 12.6 "$repo/tests/test_cuda.py") 2>&1 | tee "$out/cu12.log" | tail -4
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "gpu_wheel_check: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
