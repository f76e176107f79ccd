#!/usr/bin/env bash
# Build the CUDA library from this tree and run the GPU tests on the lent card (run from the repo root).
# Prints the test summary, then compute-sanitizer's memcheck and racecheck verdicts on a small case
# (SANITIZER_TOOLS="memcheck": that tool alone; SANITIZER=0: none).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/blochsim-gpu}
mkdir -p "$out"
# PREBUILT=dir: use libblochsim_cpu.so and libblochsim_cuda.so built elsewhere (carried with the call).
if [ -n "${PREBUILT:-}" ]; then
  libs=$PWD/$PREBUILT
else
  bash scripts/build_cuda.sh . build/gpu "$out" || exit 1
  libs=$PWD/build/gpu
fi
export BLOCHSIM_CPU_LIBRARY=$libs/libblochsim_cpu.so
export BLOCHSIM_CUDA_LIBRARY=$libs/libblochsim_cuda.so
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
# Every cuda-marked test of the suite (tests/test_cuda.py, test_cuda_api.py, and those in other files); the
# tail shows test_cuda_api.py's summary of the issue-28 findings.
python3 -X faulthandler -m pytest -q -m cuda tests -p no:cacheprovider 2>&1 | tee "$out/pytest.log" | tail -30
if [ "${SANITIZER:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  for tool in ${SANITIZER_TOOLS:-memcheck racecheck}; do
    # racecheck instruments every shuffle of the warp kernels: it ran past 8 minutes on the H200 (2026-12-02).
    BLOCHSIM_SANITIZER_CASE=1 timeout "${SANITIZER_TIMEOUT:-240}" compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 -m pytest -q -x tests/test_cuda.py -k sanitizer -p no:cacheprovider >"$out/$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool.log" | sort | uniq -c | head -3
  done
fi
if [ -n "${BENCH:-}" ]; then
  python3 benchmarks/kernel_cases.py --device cuda $BENCH --out "$out" 2>&1 | tail -30
fi
