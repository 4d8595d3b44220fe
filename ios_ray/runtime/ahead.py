"""Regions compiled ahead, side by side: worker processes compile the regions of passes about to run into Inductor's
on-disk cache of compiled graphs (the FX graph cache), while this process compiles others.

With ``inductor`` kernels a pass's first call compiles its regions one after another (:mod:`~ios_ray.runtime.regions`):
a search's check compiles every candidate's (72 distinct regions of Inception V3 from the H200's float32 timings; the
H200's float16 check spent most of its 34 s so), one region at a time, however many cores the host has.
:func:`compile_ahead` first runs each pass once as it is (:func:`~ios_ray.runtime.regions.tracing_ahead`: every
region runs its code and traces it), then compiles the traces side by side: workers take them from the front, each
compiling a trace as this process would (:func:`~ios_ray.runtime.regions.compile_traced`, so that the cache keys it
alike) and leaving the result in the cache; this process compiles from the back, then reads the workers' from the
cache. The workers start only once one of this process's compiles misses the cache: where the cache already holds the
passes' regions (a model searched before), each compiles here in a fraction of a worker's start. The passes' first
calls after it run compiled code.

A trace travels without its weights where the region freezes them (the cache keys a frozen weight by its shape and
dtype, so any values of those shapes make the same entry; the worker fills them with a fixed pattern), but for those
Inductor may write into the code, keyed by value. A worker compiles with the calling thread's number of torch threads
and the settings the cache keys by. Whatever a worker does, this process compiles from its own trace and weights: a
worker that fails, is slow or keys otherwise costs time, never a wrong answer.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import multiprocessing
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Callable, Sequence, cast

import torch

from ios_ray.paired import CompiledAhead
from ios_ray.runtime.regions import Signature, Trace, compile_traced, freezes, loaded_modules_forgotten, \
    placeholders, tracing_ahead

#: The most compile workers a host starts: each holds its own torch (and, on a GPU, a CUDA context).
MOST_WORKERS = 8
#: The fewest traces that make a compile worker worth starting: a worker loads torch and Inductor first (3 to 5 s of
#: a core), and a region compiles in 0.2 to 0.5 s (Inception V3's, on a 2-core CPU).
TRACES_PER_WORKER = 8


def default_workers(cores: int | None = None) -> int:
    """Compile workers for a host of ``cores`` cores usable by this process (default: its own): one per core but
    this process's, at most :data:`MOST_WORKERS`."""
    return max(0, min(MOST_WORKERS, (_cores() if cores is None else cores) - 1))


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def compile_ahead(passes: Sequence[Callable[[], object]], workers: int, seconds: float | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> CompiledAhead:
    """Run each pass once as it is, tracing its regions, then compile the traces side by side with up to ``workers``
    compile workers (one per :data:`TRACES_PER_WORKER` traces, started at the first compile the cache does not serve;
    none: here alone); what is not compiled within ``seconds`` compiles at its region's first call."""
    started = clock()

    def seconds_left() -> float | None:
        return None if seconds is None else max(0.0, started + seconds - clock())

    with tracing_ahead() as traces:
        for run in passes:
            run()
    with CompileWorkers(min(workers, len(traces) // TRACES_PER_WORKER)) as pool:
        read, left = pool.compile(traces, seconds_left)
    return CompiledAhead(pool.workers if pool.started else 0, len(traces), read.hits, left, clock() - started,
                         read.misses)


class CompileWorkers:
    """Up to ``workers`` worker processes that compile traces into Inductor's FX graph cache (each loads torch and
    Inductor first), started by :meth:`compile` at this process's first compile the cache does not serve, stopped at
    the context's exit, their compiles not done by then given up."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        #: Whether the workers were started (a compile here missed the cache).
        self.started = False
        self._pool: ProcessPoolExecutor | None = None
        if workers > 0:  # a pool starts its processes at its first task
            self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_start_worker, initargs=(max(1, _cores() // (workers + 1)),))

    def __enter__(self) -> "CompileWorkers":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def compile(self, traces: Sequence[Trace], seconds_left: Callable[[], float | None]) -> tuple[CacheReads, int]:
        """Compile every trace: this process from the back; the workers from the front, started once a compile here
        missed the cache with at least :data:`TRACES_PER_WORKER` traces still queued; then the workers' here in order
        (read from the cache), then those of the same code as another (read from the cache too), until
        ``seconds_left`` says 0. How this process's reads of the workers' compiles went, and how many traces were
        left uncompiled."""
        firsts = _firsts(traces)
        queue = collections.deque(firsts)
        given: list[tuple[Trace, Future]] = []
        refused: list[Trace] = []
        lock, stop = threading.Lock(), threading.Event()
        feeder = threading.Thread(target=self._feed, args=(queue, given, refused, lock, stop), daemon=True)
        while seconds_left() != 0:
            with lock:
                if not queue:
                    break
                trace = queue.pop()
            served = _compiled_from_cache(trace)
            if self._pool is not None and not self.started and not served and len(queue) >= TRACES_PER_WORKER:
                self.started = True
                feeder.start()
        stop.set()
        if feeder.is_alive():
            feeder.join()
        left, read = list(queue), CacheReads()
        for trace, future in given:
            if _settled(future, seconds_left()):
                read.compile(trace, future.exception() is None)
            else:
                left.append(trace)
        compiled_first = {id(trace) for trace in firsts}
        for trace in [*refused, *(t for t in traces if id(t) not in compiled_first)]:
            if seconds_left() == 0:
                left.append(trace)
            else:
                trace.compile()
        return read, len(left)

    def _feed(self, queue: collections.deque[Trace], given: list[tuple[Trace, Future]], refused: list[Trace],
              lock: threading.Lock, stop: threading.Event) -> None:
        """Keep each worker busy with the trace at the front of ``queue`` until it is empty or ``stop`` is set; a
        trace that cannot be sent (a graph Inductor's pickler refuses) goes to ``refused``."""
        assert self._pool is not None
        running: set[Future] = set()
        while not stop.is_set():
            with lock:
                while queue and len(running) < self.workers:
                    trace = queue.popleft()
                    try:
                        future = self._pool.submit(_compile_in_worker, _payload(trace))
                    except Exception:  # noqa: BLE001  # this process compiles it
                        refused.append(trace)
                        continue
                    given.append((trace, future))
                    running.add(future)
                if not queue:
                    return
            running = wait(running, timeout=0.05, return_when=FIRST_COMPLETED).not_done

    def close(self) -> None:
        """Stop the workers now: compiles not started are dropped, those under way end with their process."""
        if self._pool is None:
            return
        processes = list(getattr(self._pool, "_processes", {}).values())  # no public way to stop them before 3.14
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join()
        self._pool = None


@dataclasses.dataclass
class CacheReads:
    """Of the traces a worker compiled, how many this process then read from Inductor's cache (``hits``) and how many
    it compiled again (``misses``: the two processes keyed the compile otherwise, so the worker saved nothing)."""

    hits: int = 0
    misses: int = 0

    def compile(self, trace: Trace, by_a_worker: bool) -> None:
        """Compile ``trace`` here; where a worker compiled it, count whether Inductor's cache served it."""
        hit = _compiled_from_cache(trace)
        if by_a_worker:
            self.hits += hit
            self.misses += not hit


def _compiled_from_cache(trace: Trace) -> bool:
    """Compile ``trace`` here: whether Inductor's FX graph cache served the compile."""
    from torch._dynamo.utils import counters

    before = counters["inductor"]["fxgraph_cache_hit"]
    trace.compile()
    return bool(counters["inductor"]["fxgraph_cache_hit"] > before)


def _firsts(traces: Sequence[Trace]) -> list[Trace]:
    """The traces but those of the same code, signature and threads as one before (which compiles into the cache
    entry they then read)."""
    firsts: dict[tuple[str, Signature, int], Trace] = {}
    for trace in traces:
        firsts.setdefault((trace.graph.code, trace.signature, trace.threads), trace)
    return list(firsts.values())


def _settled(future: Future, seconds: float | None) -> bool:
    """Whether a worker's compile ended (well or not) within ``seconds`` (None: however long it takes)."""
    return not wait([future], timeout=seconds).not_done


def _payload(trace: Trace) -> bytes:
    """What a worker needs to compile a trace as this process would: the graph, the signature and the settings."""
    settings = dict(_keyed_settings(), threads=trace.threads)
    return _lean_dumps((trace.graph, trace.signature, settings), frozen=freezes(trace.signature))


def _start_worker(compile_threads: int) -> None:
    """A compile worker's start: Inductor loaded, compiling its own kernels on ``compile_threads`` processes."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx  # noqa: F401  # loaded before the first trace arrives

    config.compile_threads = compile_threads


def _compile_in_worker(payload: bytes) -> None:
    """Compile a sent trace into Inductor's cache, on inputs of the sent signature, with the sender's settings."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler

    traced, sent, settings = cast(tuple[torch.fx.GraphModule, Signature, dict[str, Any]],
                                  GraphPickler.loads(payload, FakeTensorMode()))
    _apply_settings(settings)
    inputs = placeholders(sent)
    with torch.no_grad(), loaded_modules_forgotten():
        compile_traced(traced, inputs)


def _keyed_settings() -> dict[str, Any]:
    """The settings of this thread that Inductor's cache keys a compile by, or that change what it compiles."""
    return {"threads": torch.get_num_threads(), "default_dtype": torch.get_default_dtype(),
            "matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "deterministic": (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled())}


def _apply_settings(settings: dict[str, Any]) -> None:
    """A worker made to compile as the sender's thread would (:func:`_keyed_settings`), each setting set only where
    it differs (setting one to its default value can change how torch reports it, and so the cache's key)."""
    setters: dict[str, Callable[[Any], None]] = {
        "threads": torch.set_num_threads, "default_dtype": torch.set_default_dtype,
        "matmul_precision": torch.set_float32_matmul_precision,
        "cudnn_tf32": functools.partial(setattr, torch.backends.cudnn, "allow_tf32"),
        "deterministic": lambda both: torch.use_deterministic_algorithms(both[0], warn_only=both[1])}
    own = _keyed_settings()
    for name, value in settings.items():
        if own[name] != value:
            setters[name](value)


def _patterned(shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype, device: torch.device
               ) -> torch.Tensor:
    """A weight of this shape, strides, dtype and device filled with a fixed pattern of several values (a uniform
    one could be folded into the code as one number, which the sender's weight would not)."""
    t = torch.empty_strided(shape, strides, dtype=dtype, device=device)
    return t.copy_((torch.arange(t.numel()) % 7 + 1).reshape(shape))


def _lean_dumps(sent: tuple[torch.fx.GraphModule, Signature, dict[str, Any]], frozen: bool) -> bytes:
    """A trace, its signature and the settings as bytes for a worker, the trace pickled as Inductor pickles graphs
    between processes (node by node: the worker compiles exactly this graph); where the region freezes its weights
    (``frozen``), each weight Inductor would not write into the code as its shape, strides and dtype only
    (:func:`_patterned` there)."""
    from torch._inductor.graph import GraphLowering
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx._graph_pickler import GraphPickler

    class Lean(GraphPickler):
        def reducer_override(self, obj: Any) -> Any:
            if frozen and type(obj) in (torch.Tensor, torch.nn.Parameter) and not isinstance(obj, FakeTensor) \
                    and obj.layout == torch.strided and not GraphLowering.can_inline_constant(obj):
                return _patterned, (tuple(obj.shape), obj.stride(), obj.dtype, obj.device)
            return super().reducer_override(obj)

    return Lean.dumps(sent)
