"""The API process's hold on one engine-core process: start it, stop it, say how it ended, and
the bound on restarting it (api/engine_client.py restarts a core that died).

Restart policy (module constants; docs/hardening.md): a core that dies is restarted at once; a
restart that fails (the new core exits or reports Failed before Ready), or a core that dies
again within STABLE_S of starting, counts as one more failure in a row, and each is retried
after 1, 2, 4, 8 s. After MAX_FAILURES in a row the scheduler gives up and exits 1 for its own
supervisor (llmserve, docker, systemd): a core that crashes at start never loops forever. A core
that lived STABLE_S starts the count again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.engine.core_process import command_line
from scheduler_svc.messages import Failed
from scheduler_svc.pipe import Channel, ChannelClosed
from step_protocol.domain import ExecutorInfo

log = logging.getLogger("llmserve.engine")
MAX_FAILURES = 5  # restarts that fail in a row (or cores dying within STABLE_S) before giving up
STABLE_S = 60.0  # a core that lived this long has proven its start: the count starts over
BACKOFF_S = (0.0, 1.0, 2.0, 4.0, 8.0)  # before the 1st, 2nd, ... attempt in a row
# The folder that holds the scheduler_svc package: the core process imports the same code.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# Ctrl-C and SIGTERM to the group are ignored first thing (main() says why): a signal during
# the imports before main() printed a KeyboardInterrupt traceback.
_CORE_ENTRY = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
               "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               f"import sys; sys.path.append({_PACKAGE_ROOT!r}); "
               "from scheduler_svc.engine.core_process import main; main()")


class CoreStartError(RuntimeError):
    """The engine core process could not start (it could not reach the executor, or died)."""


class CoreProcess:
    """One engine-core process and its end of the channel."""

    def __init__(self, config: SchedulerConfig):
        self._config = config
        self.channel: Channel | None = None
        self.process: subprocess.Popen | None = None
        self.started_at = time.monotonic()

    async def start(self) -> ExecutorInfo:
        """Starts the process; returns once it has handshaken with the executor. A start that
        fails or is cancelled (a signal during start-up) leaves no core process behind."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # subprocess, not multiprocessing: no resource-tracker process to orphan.
            self.process = subprocess.Popen(
                [sys.executable, "-c", _CORE_ENTRY,
                 *command_line(theirs.fileno(), self._config.max_pipe_frame_bytes, os.getpid())],
                pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        try:
            self.channel = await Channel.open(ours, self._config.max_pipe_frame_bytes)
            await self.channel.send(self._config)
            msg = await self.channel.recv()
        except ChannelClosed:
            msg = Failed(f"it {await self.ended()} during start-up (its log is above)")
        except BaseException:
            await self.stop()
            raise
        if isinstance(msg, Failed):
            await self.stop()
            raise CoreStartError(f"the engine core could not start: {msg.message}")
        self.started_at = time.monotonic()
        return msg.info

    async def stop(self, timeout: float = 5.0) -> None:
        """Closes the channel (the core stops on EOF) and waits for the process to exit; kills
        it after `timeout` seconds."""
        if self.channel is not None:
            self.channel.close()
        if self.process is None:
            return
        if not await self._wait(timeout):
            log.warning("the engine core did not stop within %.0f s; killing it", timeout)
            self.process.kill()
            self.process.wait()

    async def ended(self, timeout: float = 2.0) -> str:
        """How the process ended, for a log line ("exited with code -9 (SIGKILL)"). The channel
        closes as the process exits, a moment before the kernel reports its status: waits up to
        `timeout` for it, then kills a process that is still there (its channel is unusable)."""
        if self.process is None:
            return "is gone"
        if not await self._wait(timeout):
            self.process.kill()
            self.process.wait()
            return f"broke its channel and was killed (code {self.process.returncode})"
        return f"exited with code {describe_exit(self.process.returncode)}"

    async def _wait(self, timeout: float) -> bool:
        """Whether the process exited within `timeout` (polled: no blocking wait on the loop)."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.process.poll() is not None


def describe_exit(returncode: int) -> str:
    """A process's exit status in words: "1", "-9 (SIGKILL)"."""
    if returncode < 0:
        try:
            return f"{returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            return str(returncode)
    return str(returncode)


class RestartPolicy:
    """Counts failures in a row and says how long to wait before the next attempt, or None:
    give up (see the module docstring)."""

    def __init__(self, max_failures: int = MAX_FAILURES, stable_s: float = STABLE_S,
                 backoff_s: tuple[float, ...] = BACKOFF_S):
        self.max_failures, self.stable_s, self.backoff_s = max_failures, stable_s, backoff_s
        self.failures = 0

    def core_died(self, lived_s: float) -> None:
        """A running core died after `lived_s` seconds: a short life counts as a failure."""
        self.failures = 0 if lived_s >= self.stable_s else self.failures

    def next_delay(self) -> float | None:
        """Counts one more attempt in a row; seconds to wait before it, None past the limit."""
        self.failures += 1
        if self.failures > self.max_failures:
            return None
        return self.backoff_s[min(self.failures, len(self.backoff_s)) - 1]
