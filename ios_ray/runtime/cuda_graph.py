"""Capturing work into CUDA graphs: the one capture routine, and whole forwards replayed per input shape.

:func:`capture` is how ios-ray captures anything (a whole forward here, a profiled stage in
:mod:`~ios_ray.runtime.timing`): the work first runs eagerly on the capture stream, after the caller's
pending work (lazy initialisations such as cuBLAS workspaces and kernel loading must not happen inside a capture),
then one call is captured with ``torch.cuda.graph`` on that same stream, in ``thread_local`` error mode (Ray's
and torch's own threads may call CUDA meanwhile), one capture in the process at a time. Multi-stream work is
captured as it runs: its side streams fork from the capture stream with events and join back before the work
returns, which is what stream capture requires. Where a capture fails (an op synchronises with the host or is
otherwise not capturable), the current stream is restored, the capture's memory pool is handed back to the caching
allocator (see :func:`_release_failed_pool`: otherwise no later capture in the process could succeed) and
:class:`CaptureError` says which op failed.

:class:`CapturedForward` replays a forward from a static input buffer: the first call with a new (shape, dtype)
captures, later calls copy the input into the graph's static input, replay the graph on the caller's stream and
return a copy of the static output (so a result survives the next call). The static input is an ordinary tensor
even where the capturing call runs under ``torch.inference_mode`` (an inference tensor could not be written by a
later call outside it), in the memory format of the input it is captured with. At most ``max_graphs`` shapes stay
captured (each graph keeps a private memory pool); the oldest is dropped first. Where capture fails, that shape
runs the forward uncaptured, with a one-time warning.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

from ios_ray.errors import first_line

GraphKey = tuple[tuple[int, ...], torch.dtype]
T = TypeVar("T")


#: Held while a capture is underway: ``torch.cuda.graph`` empties the allocator's cache on entry, which fails while
#: another thread's capture is underway (two runners of a model served from two threads, say).
_ONE_CAPTURE_AT_A_TIME = threading.Lock()


class CaptureError(RuntimeError):
    """Work that cannot be captured into a CUDA graph; the message is the first line of the op's own error."""


def capture(
    fn: Callable[[], T], stream: torch.cuda.Stream, warmup: int = 1, warm: Callable[[], object] | None = None,
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Run ``warm`` (default: ``fn``) ``warmup`` times on ``stream``, then capture one call of ``fn`` there into a
    new CUDA graph.

    Returns the graph and what the captured call returned (its tensors live in the graph's private memory pool and
    are rewritten by every replay). Raises :class:`CaptureError` where the capture fails, with the caller's stream
    current again; running out of memory is raised as it is.
    """
    caller = torch.cuda.current_stream(stream.device)
    stream.wait_stream(caller)
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            (warm or fn)()
    caller.wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()
    try:
        with _ONE_CAPTURE_AT_A_TIME, torch.cuda.graph(graph, pool=pool, stream=stream,
                                                      capture_error_mode="thread_local"):
            result = fn()
    except RuntimeError as exc:
        torch.cuda.set_stream(caller)  # a failed capture_end leaves the capture stream current
        graph.reset()
        _release_failed_pool(stream.device, pool)
        cause = _first_cause(exc)
        if isinstance(cause, torch.cuda.OutOfMemoryError):
            raise cause from None
        raise CaptureError(first_line(cause)) from exc
    return graph, result


def _release_failed_pool(device: torch.device, pool: tuple[int, int]) -> None:
    """Tell the caching allocator that a failed capture into ``pool`` is over, and release the pool.

    ``CUDAGraph.capture_end`` raises at ``cudaStreamEndCapture`` before it ends the pool's allocation, and
    ``reset`` releases a pool only after a capture that ended, so the allocator would go on believing a capture is
    underway: its ``empty_cache``, which ``torch.cuda.graph`` calls on entry, then fails an internal assertion, and
    no later capture in the process succeeds. Here the pool is ended and released as ``torch.cuda.use_mem_pool``
    does on exit; where the capture got further (the allocation already ended), there is nothing to undo. (torch
    before 2.8 names the first binding ``_cuda_endAllocateCurrentStreamToPool``; where neither takes these
    arguments, later captures in the process fail and their stages are timed uncaptured, saying why.)
    """
    end = getattr(torch._C, "_cuda_endAllocateToPool", None) or getattr(torch._C,
                                                                        "_cuda_endAllocateCurrentStreamToPool", None)
    if end is None:
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        end(index, pool)
    except (RuntimeError, TypeError):  # the allocation had ended; or an old binding that takes other arguments
        return
    torch._C._cuda_releasePool(index, pool)


def _first_cause(error: BaseException) -> BaseException:
    """The error that started a chain: a failed op inside a capture is masked by capture_end's own failure."""
    while error.__context__ is not None and error.__context__ is not error:
        error = error.__context__
    return error


@dataclass(frozen=True)
class _Captured:
    graph: torch.cuda.CUDAGraph
    input: torch.Tensor
    output: torch.Tensor


class CapturedForward:
    """``forward`` (a tensor-to-tensor callable on one GPU) replayed as CUDA graphs, captured per input shape."""

    def __init__(
        self, forward: Callable[[torch.Tensor], torch.Tensor], device: torch.device, warmup: int = 2,
        max_graphs: int = 4,
    ) -> None:
        self.forward = forward
        self.device = device
        self.warmup = warmup
        self.max_graphs = max_graphs
        self._stream = torch.cuda.Stream(device)
        self._graphs: dict[GraphKey, _Captured] = {}
        self._uncapturable: set[GraphKey] = set()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Replay the graph captured for ``x``'s shape (capturing it first), or run uncaptured where that failed."""
        key = (tuple(x.shape), x.dtype)
        with torch.cuda.device(self.device):
            captured = self._graphs.get(key)
            if captured is None and key not in self._uncapturable:
                captured = self._capture(x, key)
            if captured is None:
                return self.forward(x)
            captured.input.copy_(x)
            captured.graph.replay()
            return captured.output.clone()

    def _capture(self, x: torch.Tensor, key: GraphKey) -> _Captured | None:
        with torch.inference_mode(False):
            static = torch.empty_like(x).copy_(x)  # dense, in x's memory format (NHWC stays NHWC)
        try:
            graph, output = capture(lambda: self.forward(static), self._stream, self.warmup)
        except CaptureError as exc:
            self._uncapturable.add(key)
            warnings.warn(f"the forward for input shape {key[0]} cannot be captured into a CUDA graph ({exc}); it "
                          "runs uncaptured (pass cuda_graph=False to skip capturing).", stacklevel=3)
            return None
        if len(self._graphs) >= self.max_graphs:
            self._graphs.pop(next(iter(self._graphs)))
        captured = self._graphs[key] = _Captured(graph, static, output)
        return captured
