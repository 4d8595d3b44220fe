"""Regions compiled ahead, side by side (:mod:`ios_ray.runtime.ahead`): the passes run once as they are, tracing their
regions; workers compile traces into Inductor's cache, which this process then reads, keyed alike in both (the
workers' weights are placeholders); what is left past the time given compiles at its first call; the result always
computes what eager kernels compute."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
import torch

from ios_ray.frontend import import_module
from ios_ray.runtime import Program, ScheduleRunner, ahead
from ios_ray.runtime.ahead import TRACES_PER_WORKER, CompileWorkers, compile_ahead, default_workers
from ios_ray.runtime.regions import Region, tracing_ahead
from tests.helpers import relative_error
from tests.test_regions import on_a_fake_gpu
from tests.test_runtime_schedules import BUILDERS, Tiny, make_schedule, tiny

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)


def candidates(dtype: torch.dtype) -> tuple[torch.nn.Module, torch.Tensor, list[ScheduleRunner]]:
    """The tiny model in ``dtype``, an input, and three schedules of it over one ``inductor`` program, as a check runs
    its candidates (groups of several units on worker threads among them)."""
    model, x = tiny().to(dtype), torch.randn(2, *Tiny.input_shape, dtype=dtype)
    imported = import_module(model, x[:1])
    program = Program.from_imported(imported, CPU, "inductor")
    runners = [ScheduleRunner(program, make_schedule(imported.graph, BUILDERS[strategy], 2, kernels="inductor"))
               for strategy in ("ios_like", "greedy", "sequential")]
    return model, x, runners


def regions_of(runners: list[ScheduleRunner]) -> list[Region]:
    """The distinct regions the runners call."""
    return list({id(r): r for runner in runners for r in runner.regions}.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_regions_a_worker_compiled_are_read_from_inductors_cache_and_compute_what_eager_computes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dtype: torch.dtype) -> None:
    # float32: frozen weights, sent as placeholders; float64 (not frozen on a CPU): sent as they are. Groups trace on
    # worker threads of one torch thread, and a worker must compile with that count to key alike; a worker started
    # elsewhere names memory formats by another module unless they are keyed by name.
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ahead, "TRACES_PER_WORKER", 1)  # the tiny model's few traces enough for a worker
    model, x, runners = candidates(dtype)
    regions = regions_of(runners)
    with torch.no_grad():
        expected = model(x)
        with tracing_ahead() as traces:
            for runner in runners:
                assert relative_error(runner.run_stages(x), expected) <= 1e-5  # the code as it is
    assert {id(t.region) for t in traces} == {id(r) for r in regions} and len(traces) == len(regions) >= 4
    assert any(t.threads == 1 for t in traces) and not any(r.compiled for r in regions)
    counters.clear()
    with CompileWorkers(1) as workers:
        read, left = workers.compile(traces, lambda: None)
    assert left == 0 and read.hits >= 1 and read.misses == 0
    assert counters["inductor"]["fxgraph_cache_hit"] >= read.hits  # every worker's compile read here, none again
    assert counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"] == len(traces)
    assert all(len(r.compiled) == 1 and None not in r.compiled.values() and not r.traced for r in regions)
    compiled = [dict(r.compiled) for r in regions]
    with torch.no_grad():
        for runner in runners:
            assert relative_error(runner(x), expected) <= (1e-5 if dtype == torch.float32 else 1e-12)
    assert [r.compiled for r in regions] == compiled  # the first calls ran the compiled code, compiling nothing


def test_a_workers_compile_keyed_otherwise_is_counted_as_compiled_again_not_as_the_workers(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    sent = ahead._payload  # the worker compiles with one torch thread more than the trace ran on: another key
    monkeypatch.setattr(ahead, "_payload", lambda trace: sent(dataclasses.replace(trace, threads=trace.threads + 1)))
    monkeypatch.setattr(ahead, "TRACES_PER_WORKER", 1)
    model, x, runners = candidates(torch.float32)
    with torch.no_grad():
        found = compile_ahead([lambda runner=runner: runner.run_stages(x) for runner in runners], workers=1)
        assert all(relative_error(runner(x), model(x)) <= 1e-5 for runner in runners)
    assert found.workers == 1 and found.by_workers == 0 and found.missed >= 1 and found.left == 0
    assert f"0 by 1 worker ({found.missed} more missed the cache and compiled again)" in found.summary()


def test_where_inductors_cache_holds_the_regions_no_worker_starts(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    # a fresh cache starts the worker at the first compile (the test above); one that holds every region, none
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ahead, "TRACES_PER_WORKER", 1)
    _, x, runners = candidates(torch.float32)
    with torch.no_grad():
        first = compile_ahead([lambda runner=runner: runner.run_stages(x) for runner in runners], workers=0)
        model, x, runners = candidates(torch.float32)  # other weights, the same shapes: the same cache entries
        counters.clear()
        again = compile_ahead([lambda runner=runner: runner.run_stages(x) for runner in runners], workers=1)
        assert all(relative_error(runner(x), model(x)) <= 1e-5 for runner in runners)
    assert again.regions == first.regions == counters["inductor"]["fxgraph_cache_hit"] and again.left == 0
    assert again.workers == 0 and again.by_workers == 0 and "by 0 workers" in again.summary()


def test_past_the_time_given_a_region_compiles_its_trace_at_its_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, runners = candidates(torch.float32)
    with torch.no_grad():
        ahead = compile_ahead([lambda runner=runner: runner.run_stages(x) for runner in runners], workers=4,
                              seconds=0.0)
    regions = regions_of(runners)
    assert ahead.regions == len(regions) == ahead.left and ahead.by_workers == 0
    assert ahead.workers == min(4, len(regions) // TRACES_PER_WORKER)  # too few traces for a worker's start
    assert all(not r.compiled and len(r.traced) == 1 for r in regions)
    traced = Region._traced
    monkeypatch.setattr(Region, "_traced", lambda *_: pytest.fail("traced again"))  # the trace made ahead serves
    with torch.no_grad():
        for runner in runners:
            assert relative_error(runner(x), model(x)) <= 1e-5
    monkeypatch.setattr(Region, "_traced", traced)
    assert all(len(r.compiled) == 1 and None not in r.compiled.values() and not r.traced for r in regions)


def test_compiled_ahead_alone_every_region_compiles_before_the_passes_first_calls() -> None:
    model, x, runners = candidates(torch.float32)
    with torch.no_grad():
        ahead = compile_ahead([lambda runner=runner: runner.run_stages(x) for runner in runners], workers=0)
        assert ahead.left == 0 and ahead.workers == 0 and ahead.regions == len(regions_of(runners))
        assert all(len(r.compiled) == 1 and None not in r.compiled.values() for r in regions_of(runners))
        assert all(relative_error(runner(x), model(x)) <= 1e-5 for runner in runners)


def test_a_host_starts_a_compile_worker_per_core_but_its_own_and_at_most_eight() -> None:
    assert [default_workers(cores) for cores in (1, 2, 4, 9, 16, 64)] == [0, 1, 3, 8, 8, 8]


def test_a_memory_format_is_keyed_alike_whichever_module_a_process_finds_torch_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # pickle names a memory format by the first module it finds holding ``torch``: a compile worker (a process
    # started elsewhere, its main module another) may find another, and its cache keys would then differ
    import sys
    import types

    from torch._inductor.codecache import FxGraphCachePickler

    from ios_ray.runtime.regions import _memory_formats_keyed_by_name

    graph = torch.fx.symbolic_trace(torch.nn.ReLU())
    first = types.ModuleType("a_main_module_that_imported_torch")
    first.torch = torch  # type: ignore[attr-defined]

    def keys(keyed: bool) -> set[str]:
        found = set()
        for modules in (dict(sys.modules), {first.__name__: first, **sys.modules}):
            with monkeypatch.context() as patch:
                patch.setitem(sys.modules, first.__name__, first)  # importable, but last in the order scanned
                patch.setattr(sys, "modules", modules)  # the order scanned
                with _memory_formats_keyed_by_name() if keyed else contextlib.nullcontext():
                    found.add(FxGraphCachePickler(graph).get_hash(torch.channels_last))
        return found

    assert len(keys(keyed=False)) == 2  # where the two processes differ
    assert len(keys(keyed=True)) == 1


def test_on_a_gpu_a_check_compiles_its_regions_ahead_outside_any_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    # the check's runners on a (fake) GPU: the passes run ahead on their streams, uncaptured; every region compiles
    # there, so that the runners' first calls (the capture's warm-up, then the capture) compile nothing
    cuda, compiled_while, model, x, program = on_a_fake_gpu(monkeypatch)
    runners = [ScheduleRunner(program, make_schedule(program.graph, BUILDERS[strategy], 2, kernels="inductor"), CUDA,
                              cuda_graph=True) for strategy in ("ios_like", "sequential")]
    with torch.no_grad():
        ahead = compile_ahead([lambda runner=runner: runner.run_stages(x) for runner in runners], workers=2)
        assert ahead.left == 0 and not cuda.graphs and compiled_while == [False] * ahead.regions
        for runner in runners:  # the fake device runs nothing: the tensors stay on the CPU
            assert relative_error(runner.captured(x), model(x)) <= 1e-5  # type: ignore[misc]
    assert compiled_while == [False] * ahead.regions == [False] * len(regions_of(runners))
    assert [g.captured for g in cuda.graphs] == [True, True]
