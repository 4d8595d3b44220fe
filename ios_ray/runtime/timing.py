"""Timing calls on a device: one sample, a run of samples after a warm-up, their median, p10 and p90 in ms, and a
stage's samples inside a CUDA graph.

The profiler times stages with it, and ``ios-ray run``/``bench`` and the search's end-to-end check time whole models
with it (it lives in the runtime because the runtime may not import the profiler).

* On a GPU a sample is the time between two CUDA events on the current stream, synchronised on the end event
  only, so nothing inside the timed call is forced to wait for the device.
* On a CPU a sample is a ``time.perf_counter_ns`` interval. The profiler runs :func:`cpu_primer` before each
  call of a stage, as the op before it would in a pass, and freed memory stays in the process
  (:mod:`~ios_ray.runtime.allocator`), so that the stages of a schedule sum to about its forward pass
  (bench/RESULTS.md has the figures).

Timing a stage on a GPU as a deployed schedule runs it (:func:`graph_samples_ms`): copies of it captured into one
CUDA graph, replays timed with events. A deployed schedule runs as one CUDA graph
(:class:`~ios_ray.runtime.executor.ScheduleRunner`), so no host launches a kernel between its stages. A stage timed eagerly, with events around the Python call that launches its
kernels, is at small batch mostly that launch time (the host launches more slowly than a modern GPU runs small
kernels), and a DP fed such timings would optimise launch overhead instead of the GPU's work. So on a GPU:

1. the stage runs once eagerly on the capture stream, then ``copies`` calls of it, back to back, are captured into
   one graph (:func:`~ios_ray.runtime.cuda_graph.capture`; a parallel stage forks its side streams from the capture
   stream and joins them back, as in the runtime, so each copy starts after the previous one's join, as a stage
   starts after the previous stage in a pass);
2. a spin kernel of about half a millisecond is enqueued (:data:`BACKLOG_CYCLES`), then ``warmup`` replays, then
   ``repeat`` replays each followed by an event, with no synchronisation in between: the device works through a
   backlog while the host enqueues (the spin makes one even where a replay takes the device less time than the
   host takes to launch it, and wakes a GPU that idled while the stage was captured), so the interval between two
   events is the device's time for one replay, not the host's time to launch it;
3. a sample is such an interval over ``copies``, which spreads the replay's own start-up cost on the device;
4. the graph is reset: its private memory pool is released (torch returns it to the driver at the next capture,
   which empties the cache first).

That costs the host about 14 ms per stage (a capture, an instantiation and a synchronisation per graph) where the
stage's kernels take the device 0.05 ms (Inception V3 at batch 1 on an H100). :func:`graph_batch_samples_ms` times
a batch of stages in one graph instead: each stage's calls between two timing events recorded inside the graph,
the graph replayed and read after each replay until every stage's samples are tight; each stage still starts right
after the previous one ends, as in a pass. The profiler times a GPU's stages so (:mod:`ios_ray.profiler.timing`).
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from typing import Callable, Iterator, Mapping, Sequence

import torch

from ios_ray.paired import summary_ms
from ios_ray.runtime.cuda_graph import capture

#: Times one call of a callable in ms.
Sampler = Callable[[Callable[[], object]], float]


def sample_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Time one call of ``fn`` on ``device`` in ms."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
    begin = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - begin) / 1e6


def samples_ms(
    fn: Callable[[], object], device: torch.device | str, warmup: int, repeat: int,
    before: Callable[[], object] | None = None,
) -> list[float]:
    """``warmup`` untimed calls, then ``repeat`` timed ones; ms each. ``before``, where given, runs untimed before
    every call (see :func:`cpu_primer`)."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"need repeat >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}")
    device = torch.device(device)
    prepare = before or (lambda: None)
    samples = []
    with torch.inference_mode():
        for _ in range(warmup):
            prepare()
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        for _ in range(repeat):
            prepare()
            samples.append(sample_ms(fn, device))
    return samples


def cpu_primer() -> Callable[[], object]:
    """A small conv (0.1-0.2 ms on a 2-core Xeon) for the calling thread to run before each timed call of a CPU stage.

    In a deployed pass a stage starts right after another op ran on the calling thread: that thread's intra-op
    threads are still spinning, and the caches hold the other op's data. Timed back to back with nothing between,
    a stage that hands its groups to worker threads finds all cores idle and looked up to 50% faster than it runs
    in a pass, so the DP picked such stages and the whole schedule ran slower than sequential; primed, the stage
    pays what it pays in a pass.
    """
    x, weight = torch.randn(1, 32, 28, 28), torch.randn(32, 32, 1, 1)
    return lambda: torch.nn.functional.conv2d(x, weight)


def alternating_rounds(
    fns: Mapping[str, Callable[[], object]], device: torch.device | str, warmup: int, sample: Sampler | None = None,
    rewarm: bool = True,
) -> Iterator[dict[str, float]]:
    """Rounds without end of several callables timed side by side, after ``warmup`` untimed calls of each: each
    round times every callable once, in the reverse order and the given order by turns (the first round starts
    with the callable warmed last), and yields its ms by name. Run it under ``torch.inference_mode()``.

    Interleaving makes a noisy neighbour slow every callable alike instead of whichever ran then, and reversing
    the order gives each position to each callable alike. With ``rewarm`` each timed call follows a call of the
    same callable (an untimed one, or its own timed call of the round before where the order repeats it), so that
    it finds its own weights in the cache and its own worker threads awake rather than the previous callable's:
    for callables that hold weights of their own (eager against a schedule against a compiled model). Without, the
    calls of a round run back to back; what the second of a round pays for following the other callable, each
    callable pays in every other round. ``sample`` times one call in ms (default :func:`sample_ms` on ``device``;
    tests pass a fake clock).
    """
    if warmup < 0:
        raise ValueError(f"need warmup >= 0, got {warmup}")
    timed = sample or functools.partial(sample_ms, device=torch.device(device))
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    last = names[-1] if warmup else None
    for index in itertools.count():
        found = {}
        for name in reversed(names) if index % 2 == 0 else names:
            if rewarm and name != last:
                fns[name]()
            found[name] = timed(fns[name])
            last = name
        yield found


def interleaved_samples_ms(
    fns: Mapping[str, Callable[[], object]], device: torch.device | str, warmup: int, rounds: int
) -> dict[str, list[float]]:
    """``rounds`` rounds of :func:`alternating_rounds`: ms each, by name, the i-th sample of each from round i (so
    that samples pair by round)."""
    if rounds < 1:
        raise ValueError(f"need rounds >= 1, got rounds={rounds}")
    samples: dict[str, list[float]] = {name: [] for name in fns}
    with torch.inference_mode():
        for found in itertools.islice(alternating_rounds(fns, device, warmup), rounds):
            for name, ms in found.items():
                samples[name].append(ms)
    return samples


def measure_latency(
    fn: Callable[[torch.Tensor], object], x: torch.Tensor, warmup: int, repeat: int, device: torch.device | str
) -> tuple[float, float, float]:
    """Call ``fn(x)`` ``warmup`` times untimed, then ``repeat`` times timed; returns (median, p10, p90) in ms."""
    return summary_ms(samples_ms(lambda: fn(x), device, warmup, repeat))


#: GPU clock cycles the spin kernel before the replays runs: about 0.5 ms at an H100's 1.98 GHz boost clock, time
#: enough for the host to enqueue a stage's replays and events behind it.
BACKLOG_CYCLES = 1_000_000


def graph_samples_ms(
    fn: Callable[[], object], stream: torch.cuda.Stream, warmup: int, repeat: int, copies: int
) -> list[float]:
    """The device time in ms of one call of ``fn``, per timed replay of a graph holding ``copies`` calls of it,
    captured on ``stream``; raises :class:`~ios_ray.runtime.cuda_graph.CaptureError` where ``fn`` cannot be captured."""
    if repeat < 1 or warmup < 0 or copies < 1:
        raise ValueError(f"need repeat >= 1, warmup >= 0 and copies >= 1, got repeat={repeat}, warmup={warmup}, "
                         f"copies={copies}")

    def calls() -> None:
        for _ in range(copies):
            fn()

    with torch.cuda.device(stream.device), torch.inference_mode():
        graph, _ = capture(calls, stream, warmup=1, warm=fn)
        try:
            return _replay_samples_ms(graph, stream.device, warmup, repeat, copies)
        finally:
            graph.reset()


def _replay_samples_ms(
    graph: torch.cuda.CUDAGraph, device: torch.device, warmup: int, repeat: int, copies: int
) -> list[float]:
    """Behind a spin kernel, replay ``warmup`` times, then ``repeat`` times between events, all enqueued before one
    synchronisation."""
    stream = torch.cuda.current_stream(device)
    torch.cuda._sleep(BACKLOG_CYCLES)
    for _ in range(warmup):
        graph.replay()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(repeat + 1)]
    marks[0].record(stream)
    for mark in marks[1:]:
        graph.replay()
        mark.record(stream)
    marks[-1].synchronize()
    return [start.elapsed_time(end) / copies for start, end in zip(marks, marks[1:])]


#: A batch of stages stops replaying once each stage's samples spread this little ((p90 - p10) / median), after at
#: least :data:`LEAST_REPLAYS` replays: a GPU's timings of a stage are steady, and more replays add little.
TIGHT = 0.05
LEAST_REPLAYS = 3


def graph_batch_samples_ms(
    fns: Sequence[Callable[[], object]], stream: torch.cuda.Stream, warmup: int, most: int, copies: int,
    tight: float = TIGHT, least: int = LEAST_REPLAYS,
) -> list[list[float]]:
    """Per callable, the device time in ms of one call, from replays of ONE CUDA graph captured on ``stream`` that
    holds ``copies`` calls of each callable in turn with a timing event recorded before each callable's calls and one
    after the last (events recorded as graph nodes, ``external=True``, so each replay records them anew).

    After ``warmup`` replays, each replay runs behind a spin kernel (so the device is awake and busy when the replay
    starts) and is read after it ends: an interval between two events, less what an event costs inside a graph (the
    interval between two events with nothing between, recorded first in the same replay), over ``copies`` is one
    sample of the callable between them (without that subtraction a stage of a few microseconds reads a microsecond
    or two long, and a sum of 100 stages overshoots what they take in one graph by 10-15%: H100, 2026-11-26).
    Replays stop once every callable has ``least`` samples spread within ``tight``, or after ``most``.
    Capturing many stages in one graph is what makes this cheap: the capture, instantiation and synchronisation a
    graph costs the host is paid once for all of them. Raises
    :class:`~ios_ray.runtime.cuda_graph.CaptureError` where some callable cannot be captured."""
    if most < 1 or warmup < 0 or copies < 1 or not fns:
        raise ValueError(f"need most >= 1, warmup >= 0, copies >= 1 and a callable, got most={most}, warmup={warmup}, "
                         f"copies={copies}, {len(fns)} callables")
    empty = torch.cuda.Event(enable_timing=True, external=True)
    marks = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(len(fns) + 1)]

    def calls() -> None:
        empty.record()
        for fn, mark in zip(fns, marks):
            mark.record()
            for _ in range(copies):
                fn()
        marks[-1].record()

    def warm() -> None:
        for fn in fns:
            fn()

    with torch.cuda.device(stream.device), torch.inference_mode():
        graph, _ = capture(calls, stream, warmup=1, warm=warm)
        try:
            for _ in range(warmup):
                graph.replay()
            samples: list[list[float]] = [[] for _ in fns]
            for replay in range(most):
                torch.cuda._sleep(BACKLOG_CYCLES)
                graph.replay()
                marks[-1].synchronize()
                event_ms = empty.elapsed_time(marks[0])
                for found, start, end in zip(samples, marks, marks[1:]):
                    found.append(max(start.elapsed_time(end) - event_ms, 0.0) / copies)
                if replay + 1 >= least and all(_spread(found) <= tight for found in samples):
                    break
            return samples
        finally:
            graph.reset()


def _spread(samples: list[float]) -> float:
    """(p90 - p10) / median of samples (infinite where the median is 0)."""
    median, p10, p90 = summary_ms(samples)
    return (p90 - p10) / median if median > 0 else math.inf
