"""Keeping freed CPU memory in the process, so that large activations are not faulted in again on every pass.

glibc's malloc serves large blocks with fresh ``mmap``'ed pages and returns them to the OS when freed, so each
forward pass on a CPU page-faults its large activations in again, and which blocks are ``mmap``'ed depends on what
the process freed before (glibc raises its threshold as it goes): the same stage would time differently in a
long-lived profiler actor and in a fresh deployment process (bench/RESULTS.md, "Where the figures in docstrings
went", has the figures).

:func:`keep_freed_memory` turns that off for the whole process: no ``mmap`` for allocations and no trimming of the
heap, so the memory of a pass is reused by the next. The price is that the process keeps its peak memory. It is
applied wherever a :class:`~ios_ray.runtime.program.Program` is bound to the CPU, which covers the profiler's
measurements and every deployment alike.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_KEEP_BYTES = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory in the process (once); False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))
