"""Child processes that never outlive their parent.

An engine core or a service left running after its parent died (a failed start, Ctrl-C during
start-up, a SIGKILL) held its executor stream and once attached itself to the next server's
executor. On Linux the kernel can signal a child when its parent exits
(prctl(PR_SET_PDEATHSIG)); elsewhere the caller's fallback is the channel to the parent,
which reads EOF when the parent's process is gone.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(signum: int, parent_pid: int) -> bool:
    """Asks the kernel to send `signum` to this process when its parent exits; exits at once
    when the parent (`parent_pid`, the process that started this one) is already gone.
    Returns False where the platform has no such request (not Linux).

    The signal follows the parent *thread* that started this process: start children from a
    thread that lives as long as the parent (the main thread)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
    return True
