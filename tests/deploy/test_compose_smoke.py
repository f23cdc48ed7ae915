"""The compose smoke test (deploy/compose_smoke.sh): builds both images, runs the stack with
Docker Compose as a user would (no token set), streams a completion through the public gRPC
port and a chat completion through the HTTP port, and checks a bad MODEL ends with its cause.

It runs wherever a Docker engine answers (`docker info`) and a compose is installed: about 5
minutes the first time (base image, wheelhouses, builds), ~70 s cached. Elsewhere it skips
saying why. LLMSERVE_COMPOSE_SMOKE=1 runs it even without a running engine (the script starts
dockerd as root); LLMSERVE_COMPOSE_SMOKE=0 skips it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "compose_smoke.sh"
# A cold first run (base rootfs, downloads, builds) takes about 5 minutes here; cached, ~70 s.
TIMEOUT_S = 1500


def _why_not() -> str | None:
    """Why the smoke test cannot run here (None: it can)."""
    wanted = os.environ.get("LLMSERVE_COMPOSE_SMOKE")
    if wanted == "0":
        return "LLMSERVE_COMPOSE_SMOKE=0"
    if wanted == "1":
        return None  # the script starts dockerd if it can, or says SKIP itself
    if shutil.which("docker") is None:
        return "no docker CLI here (LLMSERVE_COMPOSE_SMOKE=1 to try anyway)"
    if subprocess.run(["docker", "info"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                      timeout=30, check=False).returncode != 0:
        return "no Docker engine answers `docker info` (LLMSERVE_COMPOSE_SMOKE=1 starts dockerd as root)"
    return None


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_compose_smoke():
    why = _why_not()
    if why:
        pytest.skip(f"compose smoke: {why}")
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    sys.stdout.write(proc.stdout)  # the timings and sizes, shown with -s or on failure
    lines = proc.stdout.strip().splitlines()
    skipped = [line for line in lines if line.startswith("compose smoke: SKIP")]
    if proc.returncode == 0 and skipped:
        pytest.skip(skipped[-1])
    assert proc.returncode == 0, f"compose_smoke.sh exited {proc.returncode}:\n" + "\n".join(lines[-40:])
    assert any(line.startswith("compose smoke: PASS") for line in lines), "\n".join(lines[-40:])
    assert "client: OK" in proc.stdout and "http: OK" in proc.stdout
