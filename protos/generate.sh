#!/usr/bin/env bash
# Regenerates the Python stubs from protos/*.proto. Needs grpcio-tools==1.84.0
# (stubs made by a newer generator refuse to import under an older grpcio).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
python -m grpc_tools.protoc -I . --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" \
  protos/llmserve/v1/llmserve.proto protos/llmserve/executor/v1/executor.proto
