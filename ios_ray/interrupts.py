"""Holding Ctrl-C (and a SIGTERM) through a block that must not be cut, and delivering it once the block has ended;
a SIGTERM that stops a command as a Ctrl-C does.

Two blocks need it. A store operation: DuckDB polls for Python signals while it works and turns a Ctrl-C into
whichever error its call was making, losing the batch in flight. Ray's start: it forks its processes, and a Ctrl-C
that Python raises inside a fork handler (``logging``'s, say) is printed as "Exception ignored" and lost, so the
search would run on as if nobody had pressed it (a SIGTERM likewise; Ray's start is kept from replacing the handlers
meanwhile: :mod:`ios_ray.app.search.ray_session`).

A SIGTERM (``kill``, ``timeout``, a container stopping) ends a process at once, or where Ray's driver has replaced its
handler with ``sys.exit``, unwinds it through code that only a Ctrl-C is stopped cleanly in, then aborts (exit -6
with Ray's stack dump). The command line makes it raise :class:`Terminated`, a ``KeyboardInterrupt``, so a search
stops the way it stops on Ctrl-C: what was measured is stored, Ray is shut down, one line says so.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The signals a block holds, where their handlers are Python's to replace.
_HELD = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """A SIGTERM, raised where Python raises ``KeyboardInterrupt`` for a Ctrl-C (see the module docstring)."""


#: Set once a SIGTERM has raised :class:`Terminated`: the stop it caused may surface as another ``KeyboardInterrupt``
#: (Ray's processes, sent the same SIGTERM by a ``kill`` of the process group, end the driver's calls their own way).
_terminated = threading.Event()


def _terminate(signum: int, frame: Any) -> None:
    _terminated.set()
    raise Terminated


def was_terminated(stop: KeyboardInterrupt) -> bool:
    """Whether a stop came from a SIGTERM: it is :class:`Terminated`, or one was raised before it."""
    return isinstance(stop, Terminated) or _terminated.is_set()


def stop_on_sigterm() -> None:
    """From now on a SIGTERM raises :class:`Terminated` in the main thread (where Python delivers signals)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)


def ignore_stops() -> None:
    """From now on a Ctrl-C or a SIGTERM is ignored (in the main thread, where Python delivers signals): for a process
    whose work is done and that is only ending."""
    if threading.current_thread() is threading.main_thread():
        for signum in _HELD:
            signal.signal(signum, signal.SIG_IGN)


@contextmanager
def ctrl_c_held() -> Iterator[list[int]]:
    """Hold a Ctrl-C, or a SIGTERM handled in Python, that arrives inside the block until the block has ended, then
    deliver it (as the handler that was in place would: ``KeyboardInterrupt`` for Python's own Ctrl-C); outside the
    main thread, where Python delivers no signal, or for a signal whose handler is not Python's, nothing is held.
    Yields the signals held so far (so that the block can cut short what it would otherwise try again)."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {signum: signal.getsignal(signum) for signum in _HELD}
    previous = {signum: handler for signum, handler in previous.items()
                if callable(handler) or (signum == signal.SIGINT and handler is not None)}
    for signum in previous:
        signal.signal(signum, lambda number, frame: held.append(number))
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for number in dict.fromkeys(held):
        handler = previous[signal.Signals(number)]
        if callable(handler):
            handler(number, None)
        elif handler != signal.SIG_IGN:
            raise KeyboardInterrupt
