#!/usr/bin/env bash
# The GPU checks of the fused CUDA decode and nvCOMP zstd (issue 28, deliverables 2, 4 and 5), in one go:
# the CUDA tests of those modules, then benchmarks/gpu_layer.py. Run from the repository root on the GPU
# machine. Wheels in .whl/ (nvidia-nvcomp-cu13, nvidia-libnvcomp-cu13, zstandard, for the machine's Python)
# are installed to /tmp/site first; without nvCOMP its tests skip and its table is left out.
# OUT (default: ./out) receives gpu_layer_tests.log, gpu_layer_bench.log and gpu_layer.json.
set -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# dctdata itself: an editable install (builds the C kernels for this Python); where that fails, the source tree
# with the two mapped packages linked in place (this is a throwaway copy of the checkout).
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1; then
    echo "editable install failed (see install.log): using the source tree"
    ln -sfn ../loaders dctdata/loaders
    ln -sfn ../preprocess dctdata/preprocess
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -c "import nvidia.nvcomp as n; print('nvcomp', n.__version__)" 2>/dev/null || echo "nvcomp: not installed"
# about 2-3 minutes (Triton compiles a kernel per codec class; one torch.compile test)
timeout 420 pytest -m cuda -q -rs -p no:cacheprovider \
    tests/core/test_fused_cuda.py tests/core/test_functional_decompress.py tests/core/test_nvcomp_zstd.py \
    tests/core/test_layer.py 2>&1 | tee "$OUT/gpu_layer_tests.log"
# about 1 minute on an H200
timeout 240 python3 -m benchmarks gpu-layer --out "$OUT/gpu_layer.json" 2>&1 | tee "$OUT/gpu_layer_bench.log"
