"""A stand-in for the parts of ``torch.cuda`` that capture and timing code calls, so that their control flow runs
on a machine without a GPU (the real thing runs in the tests marked ``gpu``).

Work is simulated: a callable under test calls :meth:`FakeCuda.launch` with a device time in ms. Outside a
capture that advances the fake device clock at once; during a capture it is added to the graph, and each replay
advances the clock by the graph's work plus :data:`REPLAY_START_MS`. Events read the clock. A capture whose work
raises fails the way torch's does: ``capture_end`` raises its own error and leaves the capture stream current.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import pytest
import torch

#: The fake device's cost of starting one graph replay, in ms.
REPLAY_START_MS = 0.004


class FakeStream:
    """A stream: identity only."""

    def __init__(self) -> None:
        self.device = torch.device("cuda", 0)

    def wait_stream(self, other: "FakeStream") -> None:
        """Streams are ordered by the fake's single clock: nothing to do."""

    def wait_event(self, event: "FakeEvent") -> None:
        """As wait_stream."""


class FakeEvent:
    """An event that records the fake device clock."""

    def __init__(self, cuda: "FakeCuda") -> None:
        self.cuda = cuda
        self.time_ms: float | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        """Remember the clock."""
        self.time_ms = self.cuda.clock_ms

    def synchronize(self) -> None:
        """Nothing runs asynchronously here."""

    def elapsed_time(self, end: "FakeEvent") -> float:
        """ms between two recorded events."""
        assert self.time_ms is not None and end.time_ms is not None, "elapsed_time of an unrecorded event"
        return end.time_ms - self.time_ms


class FakeGraph:
    """A captured graph: the work launched while it was being captured."""

    def __init__(self, cuda: "FakeCuda") -> None:
        self.cuda = cuda
        self.work_ms = 0.0
        self.captured = False
        self.resets = 0
        cuda.graphs.append(self)

    def replay(self) -> None:
        """Run the captured work on the fake device."""
        assert self.captured, "replay of a graph that was never captured"
        self.cuda.clock_ms += self.work_ms + REPLAY_START_MS
        self.cuda.replays += 1

    def reset(self) -> None:
        """Drop the graph."""
        self.captured = False
        self.resets += 1


class FakeCuda:
    """The fake ``torch.cuda``: streams, events, graphs and a device clock; :meth:`install` patches torch."""

    def __init__(self) -> None:
        self.default = FakeStream()
        self.current = self.default
        self.clock_ms = 0.0
        self.capturing: FakeGraph | None = None
        self.graphs: list[FakeGraph] = []
        self.replays = 0

    def launch(self, ms: float) -> None:
        """Launch work of ``ms`` device time: into the graph being captured, else run it now."""
        if self.capturing is not None:
            self.capturing.work_ms += ms
        else:
            self.clock_ms += ms

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "FakeCuda":
        """Replace the torch.cuda names that ios-ray's capture and timing code use."""
        fakes: dict[str, Any] = {
            "Stream": lambda device=None, priority=0: FakeStream(),
            "current_stream": lambda device=None: self.current,
            "set_stream": self._set_stream,
            "stream": self._stream,
            "graph": self._graph,
            "CUDAGraph": lambda: FakeGraph(self),
            "Event": lambda enable_timing=False: FakeEvent(self),
            "device": lambda device=None: nullcontext(),
            "synchronize": lambda device=None: None,
        }
        for name, fake in fakes.items():
            monkeypatch.setattr(torch.cuda, name, fake)
        return self

    def _set_stream(self, stream: FakeStream) -> None:
        self.current = stream

    @contextmanager
    def _stream(self, stream: FakeStream) -> Iterator[None]:
        saved, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = saved

    @contextmanager
    def _graph(self, graph: FakeGraph, stream: FakeStream, capture_error_mode: str = "global") -> Iterator[None]:
        assert capture_error_mode == "thread_local" and stream is not self.default
        saved, self.current, self.capturing = self.current, stream, graph
        try:
            yield
        except RuntimeError as exc:
            self.capturing = None
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture") from exc
        self.capturing = None
        graph.captured = True
        self.current = saved
