#!/usr/bin/env bash
# The wheels the GPU machine lacks (Python 3.12, no network there) into .whl/ (gitignored), which a
# `run` call carries and benchmarks/gpu_suite.sh installs: the gRPC health and reflection services,
# gguf, and structured outputs' llguidance with jsonschema (its tests') and jsonschema's dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
pip download -q --no-deps -d .whl grpcio-health-checking==1.84.0 grpcio-reflection==1.84.0 gguf==0.19.0 \
  llguidance==1.9.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 attrs==26.1.0
pip download -q --no-deps -d .whl --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12 \
  rpds-py==0.30.0
ls .whl
