"""Holding Ctrl-C through a block that must not be cut, and delivering it once the block has ended.

Two blocks need it. A store operation: DuckDB polls for Python signals while it works and turns a Ctrl-C into
whichever error its call was making, losing the batch in flight. Ray's start: it forks its processes, and a Ctrl-C
that Python raises inside a fork handler (``logging``'s, say) is printed as "Exception ignored" and lost, so the
search would run on as if nobody had pressed it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Hold a Ctrl-C that arrives inside the block until the block has ended, then deliver it (as the handler that
    was in place would: ``KeyboardInterrupt`` for Python's own); outside the main thread, where Python delivers no
    signal, or where Ctrl-C's handler is not Python's to replace, nothing is held."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if not held:
        return
    if callable(previous):
        previous(signal.SIGINT, None)
    elif previous != signal.SIG_IGN:
        raise KeyboardInterrupt
