"""``torch.compile(model, backend="ios_ray")``: graphs looked up, searched, or run as Dynamo hands them over.

The searches run on this machine's CPU through the session's Ray, on a model of two small graphs; the compiles that
must measure nothing run in a fresh process, which must end without having started Ray.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
import traceback
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
from torch import nn

import ios_ray
from bench.synthetic import SyntheticCost
from ios_ray.app.search.budgets import schedule_memory
from ios_ray.app.compile.backend import CompileError, IosRayBackend
from ios_ray.app.compile.compiled_graph import FALLBACK, CompiledGraph
from ios_ray.app.search.compiled_search import record_graphs
from ios_ray.app.compile.graph_schedules import Found, local_device
from ios_ray.errors import UserError
from ios_ray.frontend import import_module
from ios_ray.ir import Graph
from ios_ray.scheduler import LazySpace, SearchParams
from ios_ray.store import LatencyStore
from tests.helpers import GIVEN_KERNELS, HANG_S, NAMED_KERNELS, ios_ray_here
from tests.store_writer import fake_rows
from tests.compile_models import INPUT_SHAPE, Bottlenecks, Branching, Caching, Counting, TwoInputs, broken
from tests.test_runtime_schedules import BUILDERS, make_schedule

ROOT = Path(__file__).resolve().parent.parent
MISSING = "no schedule for graph"


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    """Each test compiles from scratch (Dynamo keeps compiled code per function)."""
    torch._dynamo.reset()


def compiled(model: nn.Module, backend: Any, x: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    """The output of ``model`` compiled with ``backend`` on ``x`` (without gradients) and the warnings it gave."""
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(model, backend=backend)(x)
    return out, [str(w.message) for w in caught if "ios_ray" in str(w.message)]


def graphs(backend: IosRayBackend) -> list[CompiledGraph]:
    """The graphs the backend compiled to a CompiledGraph."""
    return [g for g in backend.graphs if isinstance(g, CompiledGraph)]


def test_an_empty_store_warns_once_per_graph_and_equals_eager(tmp_path: Path) -> None:
    model, x = broken(), torch.randn(3, *INPUT_SHAPE)
    backend = ios_ray.backend(schedules=tmp_path / "none", store=tmp_path / "none.duckdb")
    out, said = compiled(model, backend, x)
    torch.testing.assert_close(out, model(x))
    assert len(graphs(backend)) == 2 and sum(MISSING in s for s in said) == 2
    assert all("torch_compile=True" in s and "on_miss='search'" in s for s in said if MISSING in s)
    again, said = compiled(model, backend, x)
    torch.testing.assert_close(again, model(x))
    assert not any(MISSING in s for s in said)
    assert [dict(g.runs) for g in graphs(backend)] == [{FALLBACK: 2}, {FALLBACK: 2}]
    assert not (tmp_path / "none.duckdb").exists()


def test_a_graph_is_named_by_the_models_forward_also_where_that_forward_is_torchs_own(tmp_path: Path) -> None:
    backend = ios_ray.backend(schedules=tmp_path / "none", store=tmp_path / "none.duckdb")
    model, x = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval(), torch.randn(2, *INPUT_SHAPE)
    out, said = compiled(model, backend, x)  # Dynamo's frame is torch's wrapper of the module's call
    torch.testing.assert_close(out, model(x))
    assert [g.name for g in graphs(backend)] == ["Sequential.forward"]
    assert any(s.startswith(f"ios_ray: {MISSING} Sequential.forward.") for s in said), said


def test_a_data_dependent_branch_and_a_graph_of_two_inputs_equal_eager() -> None:
    model, x = Branching().eval(), torch.randn(2, *INPUT_SHAPE)
    backend = ios_ray.backend(schedules=None, store=None)
    out, said = compiled(model, backend, x)
    torch.testing.assert_close(out, model(x))
    # The graph before the branch returns the condition (one number) beside its feature map: it imports as the
    # feature map's graph, and Dynamo's code computes the condition from it.
    before = graphs(backend)[0]
    assert before.unimported is None and before.call.tail is not None, said
    assert before.graph is not None and len(before.graph.units) == 4
    assert not any("does not import" in s for s in said)
    two = TwoInputs().eval()
    backend = ios_ray.backend(schedules=None, store=None)
    with torch.no_grad(), pytest.warns(UserWarning, match="it reads 2 input tensors"):
        out = torch.compile(two, backend=backend)(x, x + 1)
    torch.testing.assert_close(out, two(x, x + 1))
    assert "reads 2 input tensors" in backend.graphs[0].reason and dict(backend.graphs[0].runs) == {FALLBACK: 1}
    assert [(graph.name, dict(graph.runs)) for graph in backend.graphs] == [("TwoInputs.forward", {FALLBACK: 1})]


def test_a_search_ahead_of_time_records_the_graphs_of_a_model_compiled_before_and_after_it_ran() -> None:
    model = Caching().eval()
    recorder = record_graphs(model, torch.randn(2, *INPUT_SHAPE))
    # a first compile breaks where the first call caches (two graphs); compiled after it ran, the model is one graph
    assert [(name.split()[1].strip("()").split("@")[0], shape) for name, _, shape in recorder.calls] == [
        ("Caching.forward", INPUT_SHAPE), ("Caching.forward", (16, 12, 12)), ("Caching.forward", INPUT_SHAPE)]
    whole = import_module(recorder.calls[2][1], torch.randn(2, *INPUT_SHAPE)).graph
    halves = [import_module(call, torch.randn(2, *shape)).graph for _, call, shape in recorder.calls[:2]]
    assert len(whole.units) == sum(len(g.units) for g in halves) and not recorder.skipped


def scheduled_backend(model: nn.Module, x: torch.Tensor) -> IosRayBackend:
    """A backend given an IOS-like schedule of every graph torch.compile hands over for ``model`` at ``x``'s shape
    and batch (made without measuring), after Dynamo is reset."""
    probe = ios_ray.backend(schedules=[], store=None)
    compiled(model, probe, x)
    torch._dynamo.reset()
    made = [make_schedule(g.graph, BUILDERS["ios_like"], x.shape[0]) for g in graphs(probe)]
    return ios_ray.backend(schedules=made, store=None)


def readme_net() -> nn.Module:
    """The README's torch.compile model (two graphs: convs, then a mean and a linear head), seeded."""
    from tests.readme import blocks

    namespace: dict[str, Any] = {}
    exec(blocks("python")["## With torch.compile"][0].split("model = Net()")[0], namespace)  # the class Net
    torch.manual_seed(0)
    return namespace["Net"]().eval()


def ran(backend: IosRayBackend) -> list[dict[str, int]]:
    """What each graph ran, per graph."""
    return [dict(g.runs) for g in backend.graphs]


@pytest.mark.parametrize("optimizer", [torch.optim.AdamW, torch.optim.SGD])
def test_a_fused_optimizer_step_is_followed_by_the_compiled_model(optimizer: type) -> None:
    """Issue 46, item 1: a fused step writes the parameters without increasing their version counters."""
    model, x = broken(), torch.randn(2, *INPUT_SHAPE)
    backend = scheduled_backend(model, x)
    fast = torch.compile(model, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))
    step = optimizer(model.parameters(), lr=0.1, fused=True)
    for _ in range(2):
        step.zero_grad()
        model(x).square().mean().backward()
        step.step()
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))
    assert all(FALLBACK not in runs and sum(runs.values()) == 2 for runs in ran(backend))


def test_a_forward_that_writes_into_its_buffers_runs_as_dynamo_hands_it_over() -> None:
    model, x = Counting().eval(), torch.randn(2, *INPUT_SHAPE)
    twin = Counting().eval()
    twin.load_state_dict(model.state_dict())
    backend = ios_ray.backend(schedules=None, store=None)
    for _ in range(3):  # the count goes on: 1, 2, 3
        out, said = compiled(model, backend, x)
        torch.testing.assert_close(out, twin(x))
    assert all("it writes into L['self']._buffers['calls'] in place (+=)" in g.reason for g in backend.graphs)
    assert all("update it outside forward" in g.reason for g in backend.graphs)
    assert all(set(runs) == {FALLBACK} for runs in ran(backend)) and sum(r[FALLBACK] for r in ran(backend)) == 3


def test_compiled_under_autocast_a_graph_runs_as_dynamo_hands_it_over() -> None:
    model, x = broken(), torch.randn(2, *INPUT_SHAPE)
    backend = scheduled_backend(model, x)
    fast = torch.compile(model, backend=backend)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.warns(UserWarning, match=r"torch\.autocast \(bfloat16\) is on.*model\.to\(torch\.bfloat16\)"):
            out = fast(x)
        expected = model(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert ran(backend) == [{FALLBACK: 1}, {FALLBACK: 1}]  # recompiled: Dynamo guards on autocast
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))  # without autocast, the schedules again
    assert sum(FALLBACK not in runs for runs in ran(backend)) == 2, ran(backend)


def test_with_gradients_on_the_compiled_model_gives_autograd_its_history() -> None:
    """Issue 46, item 3: a graph compiled with gradients needed runs as Dynamo hands it over, with a warning."""
    model, x = broken(), torch.randn(2, *INPUT_SHAPE)
    backend = scheduled_backend(model, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.compile(model, backend=backend)(x).square().mean()
    said = [str(w.message) for w in caught if "ios_ray" in str(w.message)]
    assert len(said) == 2 and "gradients are enabled and the model's parameters require them" in said[0]
    assert "it computes gradients of its input" in said[1]  # the second graph reads the first one's output
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().mean().backward()
    torch.testing.assert_close(got, [p.grad for p in model.parameters()])
    assert all(runs == {FALLBACK: 1} for runs in ran(backend))


@pytest.mark.parametrize("dynamic", [None, True, False])
def test_other_input_sizes_and_layouts_equal_eager(dynamic: bool | None) -> None:
    """Issue 46, item 6: the README's model called at another height and width, and with a channels-last input."""
    model = readme_net()
    backend = scheduled_backend(model, torch.randn(8, 32, 17, 17))
    fast = torch.compile(model, backend=backend, dynamic=dynamic)
    inputs = [torch.randn(8, 32, 17, 17), torch.randn(8, 32, 20, 20),
              torch.randn(8, 32, 17, 17).to(memory_format=torch.channels_last), torch.randn(3, 32, 17, 17)]
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in inputs:
            torch.testing.assert_close(fast(x), model(x))
    said = [str(w.message) for w in caught]
    assert all(MISSING in s for s in said if "ios_ray" in s) and not any("does not import" in s for s in said)
    runs = collections.Counter()
    for graph in backend.graphs:
        runs.update(graph.runs)
    assert runs["given schedule 0"] + runs["given schedule 1"] == 4  # 17x17 at batch 8, either layout


def test_a_linear_head_is_the_same_unit_and_price_in_the_model_and_in_its_compiled_graph() -> None:
    """Issue 46, item 17: Dynamo hands the head over as ``linear(x, weight, bias)`` on held tensors, which stayed
    opaque and was priced 19 times what the model's own import of the same layer was."""
    from ios_ray.profiler.sim_model import stage_latency_ms
    from ios_ray.stage import Stage

    model = readme_net()
    whole = import_module(model, torch.randn(1, 32, 17, 17)).graph
    _, head_call, shape = record_graphs(model, torch.randn(8, 32, 17, 17)).calls[1]
    graph = import_module(head_call, torch.randn(1, *shape)).graph
    [ours] = [u for u in whole.units if u.kind == "linear"]
    [theirs] = [u for u in graph.units if u.kind == "linear"]
    assert (ours.attrs, ours.flops, ours.bytes, ours.weight_bytes) == \
        (theirs.attrs, theirs.flops, theirs.bytes, theirs.weight_bytes)
    priced = [stage_latency_ms(g, Stage("concurrent", ((u.id,),)), 8, "v100") for g, u in ((whole, ours),
                                                                                         (graph, theirs))]
    assert priced[0] == priced[1] and not any(u.kind == "opaque" for u in graph.units)


def test_calls_from_several_threads_equal_eager_and_leave_the_streams_alone() -> None:
    """Issue 46, item 7: graphs import on their first call, which several threads may make at once, while Dynamo
    compiles in others; the capture silences only its own thread."""
    model = broken()
    fast = torch.compile(model, backend=ios_ray.backend(schedules=None, store=None))
    streams, failures = (sys.stdout, sys.stderr), []

    def call() -> None:
        try:
            x = torch.randn(2, *INPUT_SHAPE)
            with torch.no_grad():
                torch.testing.assert_close(fast(x), model(x))
        except Exception as error:  # noqa: BLE001 - reported below
            failures.append(f"{type(error).__name__}: {error}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        threads = [threading.Thread(target=call) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert (sys.stdout, sys.stderr) == streams and not failures


def store_every_stage(graph: Graph, store: Path, batch: int) -> None:
    """Store made-up latencies (:class:`SyntheticCost`) of every stage a lazy search of ``graph`` may ask for, on
    this machine's CPU with eager kernels, at ``batch``."""
    space, cost = LazySpace.build(graph, SearchParams()), SyntheticCost(graph)
    stages = {**{p.key: p.stage for p in space.planned}, **{key: p.stage for key, p in space.plan.stages.items()}}
    fingerprint = local_device("cpu").running("eager").fingerprint
    LatencyStore(store).put(pa.concat_tables([fake_rows([key], cost.latency(stage), fingerprint, batch)
                                              for key, stage in stages.items()]))


def deployed(backend: IosRayBackend, model: nn.Module, x: torch.Tensor) -> list[Found | None]:
    """What the backend's schedules gave each graph of ``model`` compiled and called on ``x`` (whose output must
    equal the model's)."""
    found: list[Found | None] = []
    find = backend.schedules.find
    backend.schedules.find = lambda *args: found.append(find(*args)) or found[-1]  # type: ignore[method-assign]
    out, _ = compiled(model, backend, x)
    torch.testing.assert_close(out, model(x))
    return found


def test_a_memory_budget_keeps_the_schedule_the_store_gives_within_it(tmp_path: Path) -> None:
    """Like ``ios-ray search --memory-budget``: the DP over the store's latencies peaks above the budget, so the
    schedule deployed is the budgeted DP's."""
    model, x, store = Bottlenecks().eval(), torch.randn(2, *INPUT_SHAPE), tmp_path / "s.duckdb"
    probe = ios_ray.backend(schedules=None, store=None)
    compiled(model, probe, x)
    [graph] = [g.graph for g in graphs(probe)]
    store_every_stage(graph, store, batch=2)
    torch._dynamo.reset()
    [free] = deployed(ios_ray.backend(schedules=None, store=store), model, x)
    torch._dynamo.reset()
    [kept] = deployed(ios_ray.backend(schedules=None, store=store, memory_budget="1.0x"), model, x)
    assert free is not None and kept is not None and kept.origin == free.origin == f"the DP over {store}"
    unbudgeted, budgeted = schedule_memory(free.schedule, graph), schedule_memory(kept.schedule, graph)
    assert unbudgeted.peak_bytes > unbudgeted.sequential_peak_bytes  # the DP's own schedule breaks the budget
    assert budgeted.peak_bytes <= budgeted.sequential_peak_bytes
    assert kept.schedule.memory is not None and kept.schedule.memory.budget_bytes == budgeted.sequential_peak_bytes
    assert kept.schedule.memory.peak_bytes == budgeted.peak_bytes


@pytest.mark.parametrize("options, named", [
    ({"on_miss": "measure"}, "on_miss must be one of fallback, search, not 'measure'"),
    ({"schedules": 42}, "schedules must be a folder or a list of Schedule objects, not 42"),
    ({"store": 123}, r"store must be a path \(str or Path\) or None, not 123"),
    ({"check_rounds": "many"}, "check_rounds must be a whole number, not 'many'"),
    ({"fallback": "tvm"}, "fallback must be one of eager, inductor, not 'tvm'"),
    ({"schedule": "x"}, "ios_ray.backend has no option 'schedule'"),
    ({"on_miss": "search", "store": None}, "on_miss='search' stores what it measures"),
    ({"follow_weights": "yes"}, "follow_weights must be True or False"),
])
def test_bad_options_are_one_sentence_naming_the_option(options: dict[str, Any], named: str) -> None:
    with pytest.raises(UserError, match=named) as error:
        ios_ray.backend(**options)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("compile_options, named", [
    ({"mode": "reduce-overhead"}, "mode='reduce-overhead' is not taken"),
    ({"options": {"on_miss": "never"}}, "on_miss must be one of"),
])
def test_errors_inside_compilation_are_one_sentence_without_dynamo_frames(
    compile_options: dict[str, Any], named: str,
) -> None:
    from ios_ray.app.compile.backend import ios_ray as registered

    model = broken()
    with torch.no_grad(), pytest.raises(CompileError, match=named) as error:
        torch.compile(model, backend=registered, **compile_options)(torch.randn(2, *INPUT_SHAPE))
    assert isinstance(error.value, UserError) and "\n" not in str(error.value)
    frames = [f.filename for f in traceback.extract_tb(error.value.__traceback__)]
    inside = [f for f in frames if "_dynamo" in Path(f).parts]
    assert all(Path(f).name == "eval_frame.py" for f in inside), frames  # Dynamo's re-raise, nothing deeper


def test_options_through_torch_compile_reach_the_backend(tmp_path: Path) -> None:
    from ios_ray.app.compile.backend import ios_ray as registered

    model, x = broken(), torch.randn(2, *INPUT_SHAPE)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(model, backend=registered, options={"schedules": str(tmp_path / "given")})(x)
    torch.testing.assert_close(out, model(x))
    assert any(str(tmp_path / "given") in str(w.message) for w in caught)


def test_the_entry_point_registers_the_backend_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A distribution's metadata declaring pyproject's entry points, as ``pip install`` writes it, makes
    ``backend="ios_ray"`` resolve to the backend."""
    import tomllib
    from torch._dynamo.backends import registry

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    info = tmp_path / "ios_ray_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ios-ray-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) for group, points in declared.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    for table in (registry._BACKENDS, registry._COMPILER_FNS):
        monkeypatch.setitem(table, "ios_ray", table.get("ios_ray"))
        del table["ios_ray"]
    registry._discover_entrypoint_backends.cache_clear()
    try:
        registry._discover_entrypoint_backends()
        from ios_ray.app.compile.backend import ios_ray as registered

        assert registry.lookup_backend("ios_ray") is registered
    finally:
        registry._discover_entrypoint_backends.cache_clear()
    model, x = broken(), torch.randn(2, *INPUT_SHAPE)
    monkeypatch.chdir(tmp_path)  # the default schedules folder and store: none here
    out, said = compiled(model, "ios_ray", x)
    torch.testing.assert_close(out, model(x))
    assert sum(MISSING in s for s in said) == 2


COMPILE_AGAIN = """
import json, sys, warnings, torch, ios_ray
from tests.helpers import ios_ray_here
from tests.compile_models import broken
model, store, out = broken(), sys.argv[1], sys.argv[2]
backend = ios_ray.backend(schedules=out if out != "-" else None, store=store)
x = torch.randn(int(sys.argv[3]), *model.input_shape)
with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    y = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(y, model(x))
runs = [dict(g.runs) for g in backend.graphs]
ray = "ray" in sys.modules and sys.modules["ray"].is_initialized()
print(json.dumps({"runs": runs, "warnings": [str(w.message) for w in caught], "ray": ray}))
"""


def compile_in_a_fresh_process(store: Path, out: Path | None, batch: int) -> dict[str, Any]:
    """Compile :func:`broken` with these schedules and store in a new process; what ran, what it warned, whether it
    started Ray."""
    done = subprocess.run([sys.executable, "-c", COMPILE_AGAIN, str(store), str(out or "-"), str(batch)],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(store: Path) -> int:
    """The latency rows a store holds."""
    return LatencyStore(store, create=False).query().num_rows


@pytest.fixture(scope="module")
def searched(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(store, schedules folder) of ``ios-ray search --torch-compile`` on this CPU at batch 2."""
    where = tmp_path_factory.mktemp("searched")
    store, out = where / "s.duckdb", where / "schedules"
    done = ios_ray_here("search", "--model", "tests.compile_models:broken", "--devices", "cpu", "--batches", "2",
                        "--torch-compile", "--check-rounds", "0", "--store", str(store), "--out", str(out),
                        *GIVEN_KERNELS, cwd=where)
    assert done.returncode == 0, done.stderr
    assert "graph0" in done.stdout and "graph1" in done.stdout
    return store, out


@pytest.mark.slow
def test_a_search_ahead_of_time_serves_a_compile_that_measures_nothing(searched: tuple[Path, Path]) -> None:
    store, out = searched
    assert len(list(out.rglob("bs2.json"))) == 2
    measured = rows(store)
    again = compile_in_a_fresh_process(store, out, 2)
    assert not again["ray"] and not any(MISSING in s for s in again["warnings"]), again
    assert all(origin.startswith(str(out)) for runs in again["runs"] for origin in runs), again["runs"]
    assert rows(store) == measured


@pytest.mark.slow
def test_the_stores_latencies_alone_give_the_dp_schedule(
    searched: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, _ = searched
    monkeypatch.setattr("ios_ray.app.search.api.search", lambda *a, **k: pytest.fail("a compile searched"))
    model, x = broken(), torch.randn(2, *INPUT_SHAPE)
    backend = ios_ray.backend(schedules=None, store=store, on_miss="search")
    out, said = compiled(model, backend, x)
    torch.testing.assert_close(out, model(x))
    assert not said and all(set(g.runs) == {f"the DP over {store}"} for g in graphs(backend))


@pytest.mark.slow
def test_the_graph_before_a_data_dependent_branch_runs_its_schedule(searched: tuple[Path, Path]) -> None:
    store, _ = searched  # Branching's graph before its branch computes what Broken's first graph computes
    model = Branching().eval()
    model.load_state_dict(broken().state_dict())
    backend = ios_ray.backend(schedules=None, store=store)
    for x in (torch.randn(2, *INPUT_SHAPE), -torch.randn(2, *INPUT_SHAPE)):
        out, _ = compiled(model, backend, x)
        torch.testing.assert_close(out, model(x))
    before = graphs(backend)[0]
    assert before.call.tail is not None and set(before.runs) == {f"the DP over {store}"}, dict(before.runs)


@pytest.mark.slow
def test_on_miss_search_searches_and_the_next_process_measures_nothing(searched: tuple[Path, Path]) -> None:
    store, out = searched
    model, x = broken(), torch.randn(3, *INPUT_SHAPE)
    backend = ios_ray.backend(schedules=out, store=store, on_miss="search", check_rounds=0, kernels=NAMED_KERNELS,
                              progress=False)
    y, said = compiled(model, backend, x)
    torch.testing.assert_close(y, model(x))
    assert not any(MISSING in s for s in said)
    assert [g.searches for g in graphs(backend)] == [1, 1]
    assert all(origin.startswith(str(out)) for g in graphs(backend) for origin in g.runs)
    measured = rows(store)
    assert len(list(out.rglob("bs3.json"))) == 2
    again = compile_in_a_fresh_process(store, out, 3)
    assert not again["ray"] and not any(MISSING in s for s in again["warnings"])
    assert all(origin.startswith(str(out)) for runs in again["runs"] for origin in runs), again["runs"]
    assert rows(store) == measured


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_outputs_outlive_the_next_call(ray_local: None, tmp_path: Path) -> None:
    model = broken().cuda()
    backend = ios_ray.backend(schedules=tmp_path / "out", store=tmp_path / "s.duckdb", on_miss="search",
                              check_rounds=0, progress=False)
    fast = torch.compile(model, backend=backend)
    x, z = torch.randn(2, *INPUT_SHAPE, device="cuda"), torch.randn(2, *INPUT_SHAPE, device="cuda")
    with torch.no_grad():
        first = fast(x)
        kept = first.clone()
        fast(z)
        torch.testing.assert_close(first, kept)
        torch.testing.assert_close(first, model(x), rtol=1e-3, atol=1e-3)
    assert all(g.runs[FALLBACK] == 0 for g in graphs(backend))
