"""Grid-wide barriers for persistent kernels (kernels/persistent_decode.py): one int32 counter a
barrier. A program arrives (`grid_arrive`: a release atomic add, one thread, after a CTA barrier so
that all its threads' stores come before it) and, before reading what the other programs wrote
ahead of the barrier, waits (`grid_wait`: acquire loads until the counter reaches the program
count). Between the two it may load what no program writes (weights): the barrier's latency
hides behind those loads. A counter per barrier (not one counter for all) lets a program with
nothing to do in a stage arrive at the next barrier without waiting at this one: it reads
nothing, and whoever waits for the next barrier sees its earlier arrivals too. Every program of
the grid must be resident at once; the interpreter, which runs programs one after another, must
never reach a wait (the callers' staged launches take no barrier)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_acquire(ptr):
    """An acquire load at GPU scope (PTX ld.acquire): what other programs wrote before their
    release of this value is visible after it."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def grid_arrive(counter_ptr):
    tl.debug_barrier()  # every thread's stores are done before the one thread's release
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def grid_wait(counter_ptr, count):
    """Returns once `count` programs have arrived at the counter (at once when count <= 0)."""
    while load_acquire(counter_ptr) < count:
        pass
    tl.debug_barrier()
