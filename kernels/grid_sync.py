"""Grid-wide barriers for persistent kernels (kernels/persistent_decode.py): one int32 counter a
barrier. A program arrives (`grid_arrive`: a release atomic add, one thread, after a CTA barrier so
that all its threads' stores come before it) and, before reading what the other programs wrote
ahead of the barrier, waits (`grid_wait`: one thread's acquire loads until the counter reaches
the program count, then a CTA barrier). Between the two it may load what no program writes
(weights): the barrier's latency hides behind those loads. A counter per barrier (not one counter for all) lets a program with
nothing to do in a stage arrive at the next barrier without waiting at this one: it reads
nothing, and whoever waits for the next barrier sees its earlier arrivals too. Every program of
the grid must be resident at once; the interpreter, which runs programs one after another, must
never reach a wait (the callers' staged launches take no barrier)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grid_arrive(counter_ptr):
    tl.debug_barrier()  # every thread's stores are done before the one thread's release
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _spin_thread0(ptr, count):
    """Thread 0 of the program loads `ptr` (acquire, GPU scope) until it reaches `count`; the
    program's other threads go on at once (to the CTA barrier that follows)."""
    return tl.inline_asm_elementwise(
        """{
        .reg .pred %gs_p;
        .reg .b32 %gs_t;
        mov.u32 %gs_t, %tid.x;
        setp.ne.u32 %gs_p, %gs_t, 0;
        @%gs_p bra GS_DONE;
        GS_WAIT:
        ld.acquire.gpu.global.b32 %gs_t, [$1];
        setp.lt.s32 %gs_p, %gs_t, $2;
        @%gs_p bra GS_WAIT;
        GS_DONE:
        mov.u32 $0, 0;
        }""", "=r,l,r", [ptr, count], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def grid_wait(counter_ptr, count):
    """Returns once `count` programs have arrived at the counter (at once when count <= 0). One
    thread polls (as cooperative groups' grid sync does), the others wait at the CTA barrier: the
    program's acquire, then the barrier, orders every thread's later loads after the arrivals, and
    132 pollers (not 132 x num_warps) share the counter's L2 line with the arrivals."""
    _spin_thread0(counter_ptr, count)
    tl.debug_barrier()
