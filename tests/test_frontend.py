"""The foundation: fx import, the IR (JSON, fingerprint), block detection, sequential execution, CLI errors."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import types
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from ios_ray.blocks import count_states, cut_units, find_blocks
from ios_ray.errors import UserError
from ios_ray.frontend import Imported, import_module, import_model
from ios_ray.ir import GRAPH_INPUT, Block, Graph, Unit, Value
from ios_ray.models import resolve_model
from ios_ray.runtime.program import Program
from ios_ray.scheduler import BlockDag
from tests.helpers import HANG_S, randomise_batchnorm, relative_error
from tests.user_models import BatchBranching, unknown_ops
from ios_ray.zoo import ZOO


#: Smaller inputs than the zoo's where the structure is the same and running at the zoo's own shape costs a minute
#: (NASNet-A at 331x331: each new conv shape costs oneDNN a kernel build on first use).
SMALL_INPUTS = {"nasnet_a": (3, 131, 131)}


@lru_cache(maxsize=None)
def _zoo_import(name: str) -> tuple[torch.nn.Module, Imported]:
    spec = resolve_model(name)
    torch.manual_seed(1)
    module = randomise_batchnorm(spec.build())
    return module, import_module(module, torch.randn(1, *SMALL_INPUTS.get(name, spec.input_shape)), name)


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in ("inception_v3", "nasnet_a")
                                  else name for name in ZOO])
def test_ir_execution_equals_forward(name: str) -> None:
    module, imported = _zoo_import(name)
    program = Program.from_imported(imported)
    for batch in (1, 4):
        x = torch.randn(batch, *imported.graph.input_shape)
        with torch.no_grad():
            expected = module(x)
        assert relative_error(program.run(x), expected) <= 1e-5


@pytest.mark.slow
def test_inception_blocks_found_from_wiring() -> None:
    graph = _zoo_import("inception_v3")[1].graph
    widths = [BlockDag.of(graph, b).width for b in graph.blocks]
    parallel = [b for b, w in zip(graph.blocks, widths) if w > 1]
    assert len(parallel) == 11
    assert [w for w in widths if w > 1][-2:] == [6, 6]
    assert all(graph.unit(b.exit).kind in ("concat", "pool") for b in parallel)


@pytest.mark.slow
def test_every_unit_in_exactly_one_block() -> None:
    for name in ZOO:
        graph = _zoo_import(name)[1].graph
        assert sorted(u for b in graph.blocks for u in b.units) == sorted(u.id for u in graph.units)


def _unit(uid: str, *sources: str) -> Unit:
    return Unit(uid, "opaque", tuple(Value.of(s) for s in sources), (4,), {"op": "x"})


def test_block_detection_on_hand_made_dag() -> None:
    # a -> (b, c) -> d -> e -> (f -> g, h) -> i: cuts are a, d, e, i
    units = [_unit("a", GRAPH_INPUT), _unit("b", "a"), _unit("c", "a"), _unit("d", "b", "c"), _unit("e", "d"),
             _unit("f", "e"), _unit("g", "f"), _unit("h", "e"), _unit("i", "g", "h")]
    output = Value.of("i")
    assert cut_units(units, output) == {"a", "d", "e", "i"}
    blocks = [b.units for b in find_blocks(units, output)]
    assert blocks == [("a",), ("b", "c", "d"), ("e",), ("f", "g", "h", "i")]
    graph = Graph("dag", (4,), tuple(units), output)
    assert BlockDag.of(graph, Block(0, tuple(u.id for u in units))).width == 2


def test_states_are_counted_and_a_level_too_wide_for_the_bound_is_cut_into_chunks() -> None:
    # ten independent units read one unit, a concat reads them all: states are the 2**10 - 1 non-empty sets of the
    # ten, and all eleven
    branches = [_unit(f"b{i}", "a") for i in range(10)]
    units = [_unit("a", GRAPH_INPUT), *branches, _unit("c", *(b.id for b in branches))]
    assert count_states(units[1:], 10_000) == 2 ** 10
    assert count_states(units[1:], 100) == 101  # counting stops past the limit
    blocks = [b.units for b in find_blocks(units, Value.of("c"), max_states=64)]
    # 6 independent units have 63 states, 7 have 127: the level is cut into 6 and 4, the concat joins the last
    assert blocks == [("a",), tuple(f"b{i}" for i in range(6)), (*(f"b{i}" for i in range(6, 10)), "c")]
    assert [b.units for b in find_blocks(units, Value.of("c"))] == [("a",), tuple(u.id for u in units[1:])]


def test_states_are_counted_as_listing_every_closed_set_would() -> None:
    """Against brute force on random DAGs of up to 11 units, in any order, with sources outside them, and limits."""
    rng = random.Random(0)
    for _ in range(300):
        n, p = rng.randint(1, 11), rng.choice([0.1, 0.3, 0.6])
        units = [_unit(f"u{i}", *(f"u{j}" for j in range(i) if rng.random() < p), "outside") for i in range(n)]
        rng.shuffle(units)
        sources = {u.id: {s for s in u.sources if s != "outside"} for u in units}
        closed = sum(all(sources[u.id] <= chosen for u in units if u.id in chosen)
                     for size in range(1, n + 1) for chosen in map(set, itertools.combinations(sources, size)))
        for limit in (10**6, closed, closed - 1, 3):
            assert count_states(units, limit) == min(closed, limit + 1)


def test_big_block_split_at_narrow_points() -> None:
    graph = _zoo_import("nasnet_a")[1].graph
    assert max(len(b.units) for b in graph.blocks) <= 40
    normal_cells = [b for b in graph.blocks if len(b.units) == 16]
    assert len(normal_cells) >= 12


def test_json_round_trip_and_fingerprint() -> None:
    graph = _zoo_import("inception_v3")[1].graph
    text = json.dumps(graph.to_json())
    again = Graph.from_json(json.loads(text))
    assert again == graph
    assert again.fingerprint == graph.fingerprint
    reimported = import_model("inception_v3").graph
    assert reimported.fingerprint == graph.fingerprint
    data = graph.to_json()
    data["units"][1]["attrs"]["stride"] = [3, 3]
    assert Graph.from_json(data).fingerprint != graph.fingerprint


def test_unknown_ops_become_opaque_units_that_compute() -> None:
    torch.manual_seed(2)
    module = unknown_ops()
    x = torch.randn(2, 3, 16, 16)
    imported = import_module(module, x)
    kinds = [u.kind for u in imported.graph.units]
    assert "opaque" in kinds and "conv" in kinds
    with torch.no_grad():
        assert relative_error(Program.from_imported(imported).run(x), module(x)) <= 1e-5


def test_a_forward_torch_fx_cannot_trace_is_one_sentence_naming_the_module() -> None:
    source = (Path(__file__).parent / "user_models.py").read_text().splitlines()
    line = 1 + next(i for i, text in enumerate(source) if "return x if x.sum() > 0 else -x" in text)
    with pytest.raises(UserError, match=rf"cannot capture the forward of BranchingForward: at "
                                        rf"tests/user_models.py:{line} in forward \(`return x if x.sum\(\) > 0 else -x`\) it branches on a "
                                        r"tensor's values"):
        import_model("tests.user_models:branching_forward")


@pytest.mark.parametrize("threshold", [1, 4])
def test_a_forward_that_branches_on_the_batch_size_is_refused_naming_the_line(threshold: int) -> None:
    """Batch 1 (the threshold 1) is the case a capture that took every symbolic size for at least 2 got wrong."""
    with pytest.raises(UserError, match=r"cannot capture the forward of BatchBranching: its code branches on the "
                                        r"batch size at tests/user_models.py:\d+ in forward "
                                        r"\(`if x.shape\[0\] > self.threshold:`\), so one graph cannot serve every "
                                        r"batch size"):
        import_module(BatchBranching(threshold), torch.randn(1, 3, 8, 8))


def test_a_capture_leaves_torchs_tensor_meta_recorder_as_it_found_it() -> None:
    """The capture has torch.export record no tensor_meta (for speed) through the name torch's tracer calls, which
    must still be there (or the speed-up is silently gone), and is torch's own again after."""
    from torch.fx.experimental import proxy_tensor
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    assert proxy_tensor._extract_tensor_metadata is _extract_tensor_metadata
    import_module(ZOO["squeezenet"].build(), torch.randn(1, 3, 64, 64))
    assert proxy_tensor._extract_tensor_metadata is _extract_tensor_metadata


class Options(torch.nn.Module):
    """A forward with options after its input, as notebook code often has: branches on them, and a mask."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor, return_features: bool = False, mask: torch.Tensor | None = None, *,
                scale: float = 2.0) -> torch.Tensor:
        y = self.a(x) * scale + self.b(x)
        if mask is not None:
            y = y * mask
        return (y, y) if return_features else y


class TwoInputs(Options):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.a(x) * mask


def test_options_after_the_input_are_imported_at_their_defaults() -> None:
    torch.manual_seed(0)
    module = Options().eval()
    x = torch.randn(2, 3, 8, 8)
    imported = import_module(module, x[:1])
    assert [u.kind for u in imported.graph.units] == ["conv"]  # a(x) * 2.0 + b(x): one conv, the default in it
    assert [n.op for n in imported.module.graph.nodes].count("placeholder") == 1
    with torch.no_grad():
        assert relative_error(Program.from_imported(imported).run(x), module(x)) <= 1e-6
    with pytest.raises(UserError,
                       match=r"^TwoInputs takes 2 inputs \(x, mask\); ios-ray imports models that take one "):
        import_module(TwoInputs().eval(), x[:1])


def test_an_input_shape_given_with_the_batch_size_is_named_as_such() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)).eval()
    with pytest.raises(UserError, match=r"\[1, 1, 3, 8, 8\] \(the input shape is one sample's, without "
                                        r"the batch size: 3x8x8\?\)$"):
        import_module(model, torch.randn(1, 1, 3, 8, 8))
    with pytest.raises(UserError) as error:  # a whole sample that fails is not taken for a batch
        import_module(model, torch.randn(1, 2, 8, 8))
    assert "sample" not in str(error.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ios_ray", *args], capture_output=True, text=True, timeout=HANG_S)


@pytest.mark.parametrize("model, message", [
    ("tests.user_models:branching_forward", "cannot capture the forward of BranchingForward: at tests/"),
    ("no_such_model", "unknown model 'no_such_model'"),
    ("nets/my_model.py:build", "model 'nets/my_model.py:build' names a file; name its module instead, as Python "
                               "imports it from the current folder or PYTHONPATH: nets.my_model:build."),
    # an op that fails on export's fake tensors, whose logger printed the traceback (2026-11-28)
    ("squeezenet --input-shape 3x10x10", "running squeezenet on an input of shape (1, 3, 10, 10) failed: "
                                         "RuntimeError: Given input size: (256x1x1). Calculated output size"),
])
def test_cli_bad_model_is_one_sentence(model: str, message: str) -> None:
    result = _cli("inspect", "--model", *model.split())
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_inspect_inception() -> None:
    result = _cli("inspect", "--model", "inception_v3", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    widths = [row["d"] for row in report["blocks"] if row["d"] > 1]
    assert len(widths) == 11 and widths[-2:] == [6, 6]


def test_a_model_that_cached_its_input_shape_on_a_call_imports_and_runs_its_schedule() -> None:
    """Issue 46, item 13: Ultralytics' Detect head compares the shape it cached on its last call with each call's,
    which after one eager call is a branch on the batch size; every YOLO model was refused once it had run."""
    from ios_ray.runtime import ScheduledModule
    from tests.test_runtime_schedules import BUILDERS, make_schedule
    from tests.user_models import ShapeCaching

    torch.manual_seed(0)
    model = ShapeCaching().eval()
    fresh = import_module(model, torch.randn(1, 3, 8, 8)).graph
    with torch.no_grad():
        model(torch.randn(1, 3, 8, 8))  # the natural order: run the model, then search and deploy it
    cached, grid = model.shape, model.grid
    graph = import_module(model, torch.randn(1, 3, 8, 8)).graph
    assert graph.fingerprint == fresh.fingerprint
    assert model.shape is cached and model.grid is grid  # the import leaves what the forward cached alone
    fast = ScheduledModule(model, [make_schedule(graph, BUILDERS["ios_like"], batch) for batch in (1, 3)])
    with torch.no_grad():
        for batch in (1, 3):
            x = torch.randn(batch, 3, 8, 8)
            assert fast.schedule_for(x) is not None
            assert relative_error(fast(x), model(x)) < 1e-5


class _Small(torch.nn.Module):
    """A conv and a ReLU: any capture takes it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def test_export_records_no_stack_traces_where_torch_can_and_exports_as_it_is_where_it_cannot() -> None:
    # torch 2.11 (the GPU image's) has no torch.fx.config.do_not_emit_stack_traces: every export failed on reading it
    # and every model fell back to a torch.fx trace (or was refused where only export captures it)
    from ios_ray.frontend.capture import _no_stack_traces

    with _no_stack_traces(types.SimpleNamespace()):  # torch 2.11's: nothing to switch
        pass
    config = types.SimpleNamespace(do_not_emit_stack_traces=False)
    with _no_stack_traces(config):
        assert config.do_not_emit_stack_traces is True
    assert config.do_not_emit_stack_traces is False
    model, x = _Small().eval(), torch.randn(2, 3, 8, 8)
    program = Program.from_imported(import_module(model, x[:1], capture="export"))
    with torch.no_grad():
        assert relative_error(program.run(x), model(x)) <= 1e-6


def test_a_failed_export_leaves_no_buffer_registration_hook_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    # non-strict torch.export registers a global buffer registration hook, and torch 2.11 removes it only where export
    # succeeds: after a failed capture every buffer assignment of the process ran it (the model's own eager forward
    # then failed with an AssertionError)
    from torch.nn.modules import module as nn_module

    def leaking_export(*args: object, **kwargs: object) -> None:
        torch.nn.modules.module.register_module_buffer_registration_hook(lambda module, name, buffer: None)
        raise RuntimeError("export stopped here")

    before = dict(nn_module._global_buffer_registration_hooks)
    monkeypatch.setattr(torch.export, "export", leaking_export)
    with pytest.raises(UserError):
        import_module(_Small().eval(), torch.randn(1, 3, 8, 8), capture="export")
    assert dict(nn_module._global_buffer_registration_hooks) == before
