"""What dmlgraph may do to the whole process, and only when the process owner asks.

Pausing the garbage collector, capping the address space and forking for shape inference help a
command-line run but touch state a library caller owns: they happen only inside `process_wide()`,
which the CLI enters. Why each, and what happens without: docs/internals.md, process.py.
"""
from __future__ import annotations

import contextvars
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple


class ProcessPolicy(NamedTuple):
    """Which process-wide measures are allowed (all off: what a library call gets). (A NamedTuple:
    the command line imports this module, and `dataclasses` would cost `--help` a third of its time.)"""

    pause_gc: bool = False
    memory_caps: bool = False
    children: bool = False


_POLICY: contextvars.ContextVar[ProcessPolicy] = contextvars.ContextVar("dmlgraph_process_policy",
                                                                        default=ProcessPolicy())  # noqa: B039 - immutable


def policy() -> ProcessPolicy:
    """The measures allowed in the current context."""
    return _POLICY.get()


@contextmanager
def process_wide(*, pause_gc: bool = True, memory_caps: bool = True, children: bool = True) -> Iterator[None]:
    """Allow dmlgraph calls inside the block to pause gc, cap the address space while evaluating
    masks, and fork a shape-inference child (each restored or reaped before the call returns).

    For a process that runs dmlgraph as its main job (the CLI, a batch worker); a library caller
    who owns such a process may enter it too.
    """
    token = _POLICY.set(ProcessPolicy(pause_gc, memory_caps, children))
    try:
        yield
    finally:
        _POLICY.reset(token)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """SIGINT held back during the block, then delivered (as KeyboardInterrupt) when it ends; for
    steps an interrupt must not cut in two (a fork, a C++ extension's import). Where signals cannot
    be held (Windows), the block runs as it is."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextmanager
def address_space_headroom(extra: int) -> Iterator[None]:
    """The process's address space capped at its current size + `extra` during the block (never
    above a limit already set): a runaway allocation then fails (MemoryError, std::bad_alloc)
    instead of exhausting the machine's memory. Where there is no such limit (not Linux) or a
    sandbox refuses it, the block runs uncapped."""
    try:
        import resource
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = current + extra
        for cap in (soft, hard):  # never raise a limit the user set
            if cap != resource.RLIM_INFINITY:
                limit = min(limit, cap)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
