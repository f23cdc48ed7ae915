#!/bin/sh
# The executor image's entry point. MODEL (from docker-compose.yml) names the model to serve: a
# folder or .gguf file under /models (MODELS_DIR on the host), or an absolute path in the
# container; empty or unset = the built-in SmolLM2-135M-Instruct. It is passed to the executor
# as ONE argument, so a name with spaces stays whole (compose's `command:` would split it).
# Any other argument is passed on: `docker run IMAGE --enforce-eager` works as before.
set -eu
if [ -n "${MODEL:-}" ]; then
    case "$MODEL" in
        /*) model=$MODEL ;;
        *) model=/models/$MODEL ;;
    esac
    set -- --model "$model" "$@"
fi
exec llmserve-executor --host 0.0.0.0 "$@"
