"""Silencing what one thread prints while the frontend captures a model: :func:`this_thread_silent`.

A capture runs the model's own code (its prints) and torch's (printouts of a graph it failed on), none of it the
user's business. ``contextlib.redirect_stdout`` would replace ``sys.stdout`` for every thread: another thread's
output would vanish meanwhile, and two threads entering and leaving it in turn leave one's replacement behind.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from typing import Any, Iterator

import torch


@contextlib.contextmanager
def this_thread_silent() -> Iterator[None]:
    """What this thread writes to ``sys.stdout`` and ``sys.stderr`` inside the block is dropped; other threads' writes
    go through, and the streams are put back afterwards (each unless something else replaced it meanwhile), so a
    stream is never left replaced."""
    _hide_from_dynamo()
    saved = {name: getattr(sys, name) for name in ("stdout", "stderr")}
    muted = {name: _Muted(stream, threading.get_ident()) for name, stream in saved.items()}
    for name, stream in muted.items():
        setattr(sys, name, stream)
    try:
        yield
    finally:
        for name, stream in muted.items():
            if getattr(sys, name) is stream:
                setattr(sys, name, saved[name])


@functools.cache
def _hide_from_dynamo() -> None:
    """Keep torch.compile from tracing :class:`_Muted`'s methods: they run inside any thread's ``print``, also in a
    frame that a compiled model runs after a graph break, where Dynamo would compile them (and with a compile under
    way in another thread, that crashed the interpreter)."""
    for name in ("write", "flush", "__getattr__"):
        setattr(_Muted, name, torch.compiler.disable(getattr(_Muted, name)))


class _Muted:
    """A text stream that drops what one thread writes and passes the rest on to the stream it wraps."""

    def __init__(self, stream: Any, thread: int) -> None:
        self._stream = stream
        self._thread = thread

    def write(self, text: str) -> int:
        if threading.get_ident() == self._thread:
            return len(text)
        return self._stream.write(text)

    def flush(self) -> None:
        if threading.get_ident() != self._thread:
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
