"""CUDA side streams that run the groups of concurrent stages at once, forked from and joined back to the caller.

A :class:`StreamFork` runs group ``i`` of a stage on side stream ``i``: it records a *fork* event on the caller's
current stream, makes every side stream wait on it, launches each group on its stream, records an *end* event
there, and makes the caller's stream wait on every end event. Nothing synchronises the host or the device, so
consecutive stages chain on the GPU, and the same code is valid inside a CUDA graph capture (the fork and join
events turn into graph edges, and every side stream is joined back before the capture ends).

Caching allocator: a tensor made on a side stream belongs to that stream's pool. The runner keeps every tensor
a stage reads referenced until that stage's join has been enqueued, and a side stream only gets new work after
a later fork, which comes after that join on the caller's stream; so memory freed by the caller is never
reused by a side stream while a reader may still be running, without ``record_stream``.

Not re-entrant: a fork's events are reused by every call, so one compiled stage (and one runner) must not be
called from two host threads at once (:class:`~ios_ray.runtime.executor.ScheduleRunner` holds a lock).
"""

from __future__ import annotations

import threading
from typing import Mapping, Sequence

import torch

from ios_ray.runtime.program import Env
from ios_ray.runtime.workers import GroupFn


class StreamFork:
    """Runs groups on their own side streams between a fork event and a join on the caller's stream."""

    def __init__(self, streams: Sequence[torch.cuda.Stream], device: torch.device) -> None:
        self.device = device
        self.streams = tuple(streams)
        self._fork = torch.cuda.Event()
        self._ends = tuple(torch.cuda.Event() for _ in self.streams)

    def run(self, groups: Sequence[GroupFn], env: Mapping[str, torch.Tensor]) -> Env:
        """Launch each group on its stream after the caller's pending work; the caller waits on all of them."""
        caller = torch.cuda.current_stream(self.device)
        self._fork.record(caller)
        outputs: Env = {}
        for group, stream, end in zip(groups, self.streams, self._ends):
            stream.wait_event(self._fork)
            with torch.cuda.stream(stream):
                outputs.update(group(env))
            end.record(stream)
        for end in self._ends:
            caller.wait_event(end)
        return outputs


class StreamPool:
    """The side streams of one runner on one GPU, created once and shared by all its stages (which run in turn)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._streams: list[torch.cuda.Stream] = []
        self._lock = threading.Lock()

    def fork(self, size: int) -> StreamFork:
        """A fork over the first ``size`` side streams (with its own events)."""
        with self._lock:
            while len(self._streams) < size:
                self._streams.append(torch.cuda.Stream(self.device))
            return StreamFork(self._streams[:size], self.device)
