"""A stand-in for the parts of ``torch.cuda`` that capture and timing code calls, so that their control flow runs
on a machine without a GPU (the real thing runs in the tests marked ``gpu``).

Work is simulated: a callable under test calls :meth:`FakeCuda.launch` with a device time in ms. Outside a
capture that advances the fake device clock at once; during a capture it is added to the graph, and each replay
advances the clock by the graph's work plus :data:`REPLAY_START_MS`. Events read the clock. Each thread has its own
current stream. A capture whose work
raises fails the way torch's does: ``capture_end`` raises its own error and leaves the capture stream current.

The stream capture rules that multi-stream work must follow are enforced: a side stream joins a capture by waiting
on an event recorded on a stream in it; work launched during a capture on a stream outside it fails (on a GPU it
would run eagerly, outside the graph); and the capture fails as CUDA's does where a side stream that joined is not
joined back into the capture stream (an event recorded after its last work, waited on by the capture stream).

So does the caching allocator's bookkeeping of captures, as torch's: a capture begins allocating to its memory pool,
a capture that ends ends that, and one that fails does not (``CUDAGraph.capture_end`` raises first), after which
``empty_cache``, which ``torch.cuda.graph`` calls on entry, fails its assertion, so no later capture can begin,
until ``torch._C._cuda_endAllocateToPool`` ends the pool's allocation (``_cuda_releasePool`` then releases it).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

import pytest
import torch

#: The fake device's cost of starting one graph replay, in ms.
REPLAY_START_MS = 0.004
#: The error of a capture that ends with a side stream not joined back (CUDA's cudaErrorStreamCaptureUnjoined).
UNJOINED = "CUDA error: the capture sequence contains a fork that was not joined to the primary stream"
#: torch's error where ``empty_cache`` runs while the allocator believes a capture is underway.
CAPTURE_UNDERWAY = "captures_underway.empty() INTERNAL ASSERT FAILED at \"c10/cuda/CUDACachingAllocator.cpp\""


class FakeStream:
    """A stream: whether it takes part in the capture underway, and how much work it has been given."""

    def __init__(self) -> None:
        self.device = torch.device("cuda", 0)
        self.in_capture = False
        self.launches = 0
        self.joined_at: int | None = None  # its launches when the capture stream last waited on it

    def wait_stream(self, other: "FakeStream") -> None:
        """ios-ray calls this outside captures only; streams are ordered by the fake's single clock."""
        assert not (self.in_capture or other.in_capture), "wait_stream during a capture"

    def wait_event(self, event: "FakeEvent") -> None:
        """Join the capture where the event was recorded in it; the capture stream waiting joins the event's
        stream back."""
        if event.in_capture:
            self.in_capture = True
            if event.cuda.origin is self:
                event.stream.joined_at = event.launches


class FakeEvent:
    """An event that records the fake device clock, its stream and that stream's work so far; an ``external`` one
    recorded during a capture becomes a node of the graph instead, recorded anew at each replay."""

    def __init__(self, cuda: "FakeCuda", external: bool = False) -> None:
        self.cuda = cuda
        self.external = external
        self.time_ms: float | None = None
        self.stream: FakeStream | None = None
        self.launches = 0
        self.in_capture = False

    def record(self, stream: FakeStream | None = None) -> None:
        """Remember the clock and the stream's state (an external event in a capture: its place in the graph)."""
        self.stream = stream or self.cuda.current
        if self.external and self.cuda.capturing is not None:
            assert self.stream.in_capture, "an event recorded on a stream outside the capture"
            self.cuda.capturing.marks.append((self, self.cuda.capturing.work_ms))
            return
        self.time_ms, self.launches, self.in_capture = self.cuda.clock_ms, self.stream.launches, self.stream.in_capture

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
        self.marks: list[tuple[FakeEvent, float]] = []  # external events, each with the work captured before it
        self.captured = False
        self.pool: tuple[int, int] | None = None
        self.resets = 0
        cuda.graphs.append(self)

    def replay(self) -> None:
        """Run the captured work on the fake device, recording its external events where they stand in it."""
        assert self.captured, "replay of a graph that was never captured"
        scale = self.cuda.replay_scale()
        start = self.cuda.clock_ms + REPLAY_START_MS
        for event, offset in self.marks:
            event.time_ms = start + offset * scale
        self.cuda.clock_ms += self.work_ms * scale + REPLAY_START_MS
        self.cuda.replays += 1

    def reset(self) -> None:
        """Drop the graph; as torch's, release its pool only where its capture ended."""
        if self.captured and self.pool is not None:
            self.cuda._release_pool(0, self.pool)
        self.captured = False
        self.resets += 1


class FakeCuda:
    """The fake ``torch.cuda``: streams, events, graphs and a device clock; :meth:`install` patches torch."""

    def __init__(self) -> None:
        self.default = FakeStream()
        self._thread = threading.local()
        self.clock_ms = 0.0
        self.capturing: FakeGraph | None = None
        self.origin: FakeStream | None = None
        self.streams: list[FakeStream] = [self.default]
        self.graphs: list[FakeGraph] = []
        self.replays = 0
        self.pools_underway: list[tuple[int, int]] = []  # the allocator's captures underway, by pool
        self.released_pools: list[tuple[int, int]] = []
        self.spins: list[int] = []  # the cycles of each spin kernel (torch.cuda._sleep)
        self.replay_scale: Callable[[], float] = lambda: 1.0  # how much slower than captured each replay runs
        self._pool_handles = 0

    @property
    def current(self) -> FakeStream:
        """The calling thread's current stream (each thread has its own, as in torch)."""
        return getattr(self._thread, "stream", self.default)

    @current.setter
    def current(self, stream: FakeStream) -> None:
        self._thread.stream = stream

    def launch(self, ms: float) -> None:
        """Launch work of ``ms`` device time: into the graph being captured, else run it now."""
        if self.capturing is not None:
            assert self.current.in_capture, "work launched on a stream outside the capture would run eagerly"
            self.current.launches += 1
            self.capturing.work_ms += ms
        else:
            self.clock_ms += ms

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "FakeCuda":
        """Replace the torch.cuda names that ios-ray's capture and timing code use."""
        fakes: dict[str, Any] = {
            "Stream": self._new_stream,
            "current_stream": lambda device=None: self.current,
            "set_stream": self._set_stream,
            "stream": self._stream,
            "graph": self._graph,
            "CUDAGraph": lambda: FakeGraph(self),
            "Event": lambda enable_timing=False, external=False: FakeEvent(self, external),
            "device": lambda device=None: nullcontext(),
            "synchronize": lambda device=None: None,
            "graph_pool_handle": self._graph_pool_handle,
            "empty_cache": self._empty_cache,
            "_sleep": self._sleep,
        }
        for name, fake in fakes.items():
            monkeypatch.setattr(torch.cuda, name, fake)
        monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", self._end_allocate_to_pool, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_releasePool", self._release_pool, raising=False)
        return self

    def _sleep(self, cycles: int) -> None:
        """A spin kernel: ``cycles`` at the fake's clock of 1 GHz."""
        self.spins.append(cycles)
        self.launch(cycles / 1e6)

    def _graph_pool_handle(self) -> tuple[int, int]:
        self._pool_handles += 1
        return (0, self._pool_handles)

    def _empty_cache(self) -> None:
        if self.pools_underway:
            raise RuntimeError(CAPTURE_UNDERWAY)

    def _end_allocate_to_pool(self, device: int, pool: tuple[int, int]) -> None:
        if pool not in self.pools_underway:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.pools_underway.remove(pool)

    def _release_pool(self, device: int, pool: tuple[int, int]) -> None:
        assert pool not in self.released_pools, "a pool released twice"
        self.released_pools.append(pool)

    def _new_stream(self, device: object = None, priority: int = 0) -> FakeStream:
        stream = FakeStream()
        self.streams.append(stream)
        return stream

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
    def _graph(self, graph: FakeGraph, pool: tuple[int, int] | None = None, stream: FakeStream | None = None,
               capture_error_mode: str = "global") -> Iterator[None]:
        assert capture_error_mode == "thread_local" and stream is not None and stream is not self.default
        self._empty_cache()  # as torch.cuda.graph does on entry: it fails while another capture is underway
        assert self.capturing is None
        pool = pool or self._graph_pool_handle()
        self.pools_underway.append(pool)
        if stream not in self.streams:
            self.streams.append(stream)
        saved, self.current, self.capturing, self.origin = self.current, stream, graph, stream
        stream.in_capture = True
        try:
            yield
            unjoined = [s for s in self.streams if s.in_capture and s is not stream and s.joined_at != s.launches]
            if unjoined:
                raise RuntimeError(UNJOINED)
        except RuntimeError as exc:
            self._end_capture()  # the pool stays underway, as torch leaves it
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture") from exc
        self._end_capture()
        self.pools_underway.remove(pool)
        graph.captured, graph.pool = True, pool
        self.current = saved

    def _end_capture(self) -> None:
        self.capturing = self.origin = None
        for stream in self.streams:
            stream.in_capture, stream.launches, stream.joined_at = False, 0, None
