"""Capturing a whole forward into CUDA graphs: one per input shape, replayed from a static input buffer.

The first call with a new (shape, dtype) warms the forward up on a side stream, then captures it with
``torch.cuda.graph`` (which synchronises the device once, at capture time only). A multi-stream forward is
captured as it runs: its side streams fork from the capture stream with events and join back before the
forward returns, which is what stream capture requires. Later calls copy the input into the graph's static
input, replay the graph on the caller's stream and return a copy of the static output (so a result survives
the next call). At most ``max_graphs`` shapes stay captured (each graph keeps a private memory pool); the oldest
is dropped first. Where capture fails (an op in the forward cannot be captured), that shape runs the forward
uncaptured, with a one-time warning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from ios_ray.errors import first_line

GraphKey = tuple[tuple[int, ...], torch.dtype]


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

    @property
    def captured_shapes(self) -> tuple[GraphKey, ...]:
        """The (shape, dtype) of every input shape that currently has a captured graph."""
        return tuple(self._graphs)

    def _capture(self, x: torch.Tensor, key: GraphKey) -> _Captured | None:
        static = torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)
        caller = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(caller)
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.forward(static)
        caller.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                output = self.forward(static)
        except RuntimeError as exc:
            torch.cuda.set_stream(caller)  # a failed capture can leave the capture stream current
            self._uncapturable.add(key)
            warnings.warn(f"the forward for input shape {key[0]} cannot be captured into a CUDA graph "
                          f"({first_line(exc)}); it runs uncaptured (pass cuda_graph=False to skip capturing).", stacklevel=3)
            return None
        if len(self._graphs) >= self.max_graphs:
            self._graphs.pop(next(iter(self._graphs)))
        captured = self._graphs[key] = _Captured(graph, static, output)
        return captured
