"""Timing a stage on a GPU as a deployed schedule runs it: copies of it captured into one CUDA graph, replays
timed with events.

A deployed schedule runs as one CUDA graph (:class:`~ios_ray.runtime.executor.ScheduleRunner`), so no host
launches a kernel between its stages. A stage timed eagerly, with events around the Python call that launches its
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
"""

from __future__ import annotations

from typing import Callable

import torch

from ios_ray.runtime.cuda_graph import capture

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
