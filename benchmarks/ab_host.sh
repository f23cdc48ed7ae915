#!/usr/bin/env bash
# The executor's host path, this tree against OLD_TREE (an export of the commit to compare with),
# alternating in one call (lent machines differ: quote ratios): the launch profile of decode steps
# (benchmarks/launch_profile.py) and a verify step's cost (benchmarks/spec_step_cost.py), llama-1b;
# WHAT=w4: a decode step's device time against the floor (benchmarks/w4_ab.py; W4_SHAPES, W4_BATCHES,
# W4_ARGS: more of its flags for both trees, e.g. --persistent-decode).
#   [WHAT=launch|verify|w4] bash benchmarks/ab_host.sh OLD_TREE[,OLD_TREE2..] [ROUNDS]     (launch and verify by default)
set -uo pipefail
cd "$(dirname "$0")/.."
old=$1
rounds=${2:-2}
site=""
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  site=/tmp/site
fi
# the model folder is built by this tree first (the old tree reuses it)
llama1b=$(PYTHONPATH=$site:$PWD python3 -c 'from benchmarks.harness import model_path; print(model_path("llama-1b"))' | tail -1)
for r in $(seq "$rounds"); do
  for tree in . ${old//,/ }; do
    label=$([ "$tree" = . ] && echo new || basename "$tree")
    (cd "$tree" && export PYTHONPATH=$site:$PWD
      if [ "${WHAT:-both}" = w4 ]; then
        for shape in ${W4_SHAPES:-llama-1b smollm2-135m-draft}; do  # one process a shape: its own KV budget
          timeout 300 python3 -m benchmarks.w4_ab --shapes "$shape" --batches "${W4_BATCHES:-1,8,64}" \
            --label "$label r$r" ${W4_ARGS:-} 2>&1 | grep "^W4 "
        done
      fi
      if [ "${WHAT:-both}" != verify ] && [ "${WHAT:-both}" != w4 ]; then
        timeout 240 python3 -m benchmarks.launch_profile 2>&1 | grep -E "^b=|warm-up: |captured [0-9]+ CUDA" | cut -c1-220 | sed "s/^/LAUNCH $label r$r /"
      fi
      if [ "${WHAT:-both}" != launch ] && [ "${WHAT:-both}" != w4 ]; then
        timeout 240 python3 -m benchmarks.spec_step_cost --device cuda --model "$llama1b" 2>&1 | grep "^b=" |
          sed "s/^/VERIFY $label r$r /"
      fi)
  done
done
