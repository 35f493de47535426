#!/usr/bin/env bash
# The GPU checks of the entropy stage's decoder (dctdata.entropy.device) in one go, from the repository root:
#   1. the CUDA tests (the kernel bit for bit against the CPU decoder and the lane emulator, hostile streams,
#      every launch layout, a non-default stream),
#   2. benchmarks/gpu_ctxrans.py (bit-exactness, batches of 32 and 256 timed with CUDA events, hostile streams),
#   3. the same script's --quick mode under compute-sanitizer memcheck (skipped, with a note, when there is no
#      compute-sanitizer: the CUDA toolkit's, or the nvidia-cuda-sanitizer-api wheel's nvidia/cu13/bin copy).
# The kernel is compiled once (into OUT/kernel-cache) and reused by the later steps. Each step has a timeout;
# all of it takes a few minutes. Usage: benchmarks/gpu_ctxrans_checks.sh [OUT]   (default OUT: gpu_ctxrans_out)
set -u
OUT=${1:-gpu_ctxrans_out}
mkdir -p "$OUT"
export DCTDATA_CACHE_DIR="$OUT/kernel-cache"
status=0

echo "== 1. CUDA tests"
timeout 300 python -m pytest -q -p no:cacheprovider -m cuda tests/core/test_ctxrans_kernel.py 2>&1 | tee "$OUT/pytest_cuda.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== 2. benchmark"
timeout 300 python -m benchmarks gpu-ctxrans --out "$OUT/gpu_ctxrans.json" 2>&1 | tee "$OUT/bench.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== 3. compute-sanitizer memcheck (--quick)"
SAN=$(command -v compute-sanitizer || python -c "
import glob, sys
found = [p for d in sys.path for p in glob.glob(d + '/nvidia/*/bin/compute-sanitizer')]
print(found[0] if found else '')")
if [ -n "$SAN" ]; then
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 420 "$SAN" --tool memcheck --error-exitcode 1 \
        python -m benchmarks gpu-ctxrans --quick --out "$OUT/gpu_ctxrans_quick.json" 2>&1 | tee "$OUT/memcheck.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
    echo "no compute-sanitizer found: memcheck not run" | tee "$OUT/memcheck.txt"
fi
echo "== done: exit $status (outputs in $OUT)"
exit $status
