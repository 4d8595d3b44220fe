"""The Python API (``ios_ray.search``, ``ios_ray.optimize``, ``SearchResult``) as a user calls it.

The end-to-end test runs a script in a fresh process, as a notebook would: a model class defined in ``__main__``
travels to the device actors through Ray's object store, and the CLI then finds everything in the same store and
gives the same schedule for the same architecture given as a spec.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import ios_ray
from ios_ray.runtime.accuracy import HALF_TOLERANCE, relative_error
from ios_ray.dtypes import example_input
from ios_ray.errors import UserError
from ios_ray.frontend import import_module
from ios_ray.runtime import read_schedules
from ios_ray.schedule import read_schedule
from ios_ray.store import LatencyStore
from ios_ray.paired import LookPlan, least_rounds, percent
from ios_ray.vocabulary import DEFAULT_CHECK_CONFIDENCE
from tests.api_model import INPUT_SHAPE, DtypeCast, TwoBranch
from tests.helpers import GIVEN_KERNELS, HANG_S, NAMED_KERNELS, ios_ray_here, plausible_runs
from tests.test_search_cli import search_table

ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a Python command with the repository importable (for ``tests.api_model``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S)


@pytest.mark.slow
def test_a_main_module_object_searches_deploys_and_matches_the_cli(tmp_path: Path, ray_local: None) -> None:
    store = tmp_path / "store.duckdb"
    made = run([str(ROOT / "tests" / "api_model.py"), str(store), str(tmp_path / "api")], tmp_path)
    assert made.returncode == 0, made.stderr
    found = json.loads(made.stdout.strip().splitlines()[-1])
    assert found["class_module"] == "__main__" and found["model"] == "TwoBranch"
    assert found["measured"] > 0
    assert found["deployed_error"] <= 1e-5 and found["optimized_error"] <= 1e-5
    assert found["optimized_type"] == "ScheduledModule" and found["optimized_batches"] == [4]
    assert found["ray_after_search"] == found["ray_after_optimize"] != ""  # one local Ray, kept between the two
    [saved] = read_schedules(tmp_path / "api").values()
    assert [s.to_json() for s in saved.stages] == found["stages"]

    # The CLI, run in this process on the session's Ray, on the script's store.
    cli = ios_ray_here("search", "--model", "tests.api_model:build", "--devices", "cpu", "--batches", "1",
                       "--store", str(store), "--out", str(tmp_path / "cli"), "--check-rounds", "0", *GIVEN_KERNELS,
                       cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    [from_cli] = read_schedules(tmp_path / "cli").values()
    assert from_cli.graph_fingerprint == saved.graph_fingerprint
    [row] = search_table(cli.stdout)
    assert row.cached == found["measured"]  # everything the API measured is found
    if from_cli.params["measure"]["remeasured"] == 0:  # on a busy machine a stored outlier may be measured again
        assert row.measured == 0 and from_cli.predicted_latency == saved.predicted_latency
        assert [s.to_json() for s in from_cli.stages] == found["stages"]


def test_result_saves_and_deploys(ray_local: None, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TwoBranch().eval()
    result = ios_ray.search(model, "sim:v100", [1, 4], input_shape=INPUT_SHAPE, store=tmp_path / "s.duckdb",
                            progress=False)
    assert len(result) == 2 and {(o.device, o.batch) for o in result} == {("sim:v100", 1), ("sim:v100", 4)}
    assert result["sim:v100", 4].schedule.batch == 4 and result["sim:v100", 4].source == "simulated"
    with pytest.raises(KeyError, match="no outcome for"):
        result["cpu", 1]
    paths = result.save(tmp_path / "out")
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in paths) == [
        "TwoBranch/sim-v100/bs1.json", "TwoBranch/sim-v100/bs4.json"]
    assert set(read_schedules(tmp_path / "out")) == {str(p) for p in paths}
    again = ios_ray.search(model, "sim:v100", [1, 4], input_shape=INPUT_SHAPE, store=tmp_path / "s.duckdb",
                           progress=False)
    assert [o.measured for o in again] == [0, 0]
    assert [o.schedule.stages for o in again] == [o.schedule.stages for o in result]
    assert "sim:v100 batch 4" in repr(result)


def test_searching_and_deploying_leave_the_callers_mode_as_it_was(ray_local: None, tmp_path: Path) -> None:
    """Issue 46, item 4: a search and a deploy put the caller's model in eval mode without saying so."""
    torch.manual_seed(0)
    model = TwoBranch().train()
    model.a.eval()
    modes = [m.training for m in model.modules()]
    result = ios_ray.search(model, "sim:v100", [2], input_shape=INPUT_SHAPE, store=tmp_path / "s.duckdb",
                            progress=False)
    assert [m.training for m in model.modules()] == modes
    ios_ray.search(model, "sim:v100", [2], input_shape=INPUT_SHAPE, store=tmp_path / "s.duckdb", progress=False,
                   torch_compile=True)
    assert [m.training for m in model.modules()] == modes
    fast = result.deploy(model, any_device=True)
    assert [m.training for m in model.modules()] == modes and not fast.training
    x = torch.randn(2, *INPUT_SHAPE)
    with torch.no_grad(), pytest.warns(UserWarning, match="TwoBranch .or one of its submodules. is in training mode"):
        torch.testing.assert_close(fast(x), model(x))
    fast.eval()
    with torch.no_grad(), pytest.warns(UserWarning, match="as a correctness check"):
        assert relative_error(fast(x), model(x)) <= 1e-5
    assert fast.schedule_for(x) is not None


def test_a_model_object_whose_code_is_missing_on_a_node_fails_in_one_sentence(
    ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ghost = types.ModuleType("ghost_models_for_test")

    class Ghost(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv(x))

    Ghost.__module__, Ghost.__qualname__ = ghost.__name__, "Ghost"  # pickled by reference, as a library class
    ghost.Ghost = Ghost  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, ghost.__name__, ghost)
    with pytest.raises(UserError, match=r"cannot be rebuilt on node .*No module named 'ghost_models_for_test'.*"
                                        r"install it on every node"):
        ios_ray.search(Ghost(), "cpu", 1, input_shape=(3, 8, 8), store=tmp_path / "g.duckdb", progress=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"batches": [0]}, "batch sizes must be integers from 1"),
    ({"batches": []}, "batch sizes must be integers from 1"),
    ({"devices": []}, "devices must name at least one device"),
    ({"devices": ["tpu"]}, "unknown device 'tpu'"),
    ({"repeat": 0}, "repeat must be at least 1, not 0"),
    ({"check_rounds": -1}, "check_rounds must be at least 0, not -1"),
    ({"check_rounds": least_rounds() - 1},
     rf"check_rounds must be 0 \(no check\) or at least {least_rounds()}: fewer rounds give no "
     rf"{percent(DEFAULT_CHECK_CONFIDENCE)} interval"),
    ({"check_rounds": 40, "check_confidence": 1.0}, r"check_confidence must be at least 0.5 and below 1 \(e.g. 0.99\)"),
    ({"check_seconds": 0}, r"check_seconds must be above 0 \(or None: no time cap\), not 0"),
    ({"input_shape": (3, 0, 8)}, "input_shape must be positive sizes"),
    ({"r": 0}, "pruning bound r must be a positive integer"),
    ({"out": "{file}"}, "is a file; pass a folder"),
    ({"dtype": "int8"}, "dtype must be one of float32, float16, bfloat16, not 'int8'"),
    ({"dtype": "float16"}, "the sim model covers float32 only, so sim:v100 cannot be searched in float16"),
])
def test_bad_arguments_fail_in_one_sentence_before_anything_runs(
    kwargs: dict[str, object], message: str, tmp_path: Path
) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    kwargs = {k: (str(a_file) if v == "{file}" else v) for k, v in kwargs.items()}
    options = {"devices": ["sim:v100"], "batches": [1], "store": tmp_path / "s.duckdb", "progress": False, **kwargs}
    with pytest.raises(UserError, match=message):
        ios_ray.search(TwoBranch(), input_shape=options.pop("input_shape", INPUT_SHAPE), **options)
    assert not (tmp_path / "s.duckdb").exists() or kwargs.get("r") == 0


@pytest.mark.slow
def test_a_half_model_object_is_measured_stored_and_deployed_in_its_own_dtype(ray_local: None, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TwoBranch().eval().to(torch.bfloat16)
    store = tmp_path / "s.duckdb"
    options = {"input_shape": INPUT_SHAPE, "store": store, "check_rounds": least_rounds(), "warmup": 1, "repeat": 3,
               "progress": False, "kernels": NAMED_KERNELS}
    result = ios_ray.search(model, "cpu", 2, **options)
    [outcome] = result
    assert outcome.schedule.dtype == "bfloat16" and outcome.measured > 0 and outcome.end_to_end is not None
    assert "input 3x16x16, bfloat16" in repr(result)
    check = outcome.end_to_end
    assert check.ratio is not None and check.rounds >= LookPlan.planned(least_rounds()).looks[0]
    assert f"cpu batch 2: {check.decision}; " in repr(result)
    assert f"ratio {check.deciding.median:.3f} in {check.rounds} rounds" in repr(result)
    assert set(LatencyStore(store, create=False).query(device="cpu")["dtype"].to_pylist()) == {"bfloat16"}
    [path] = result.save(tmp_path / "out")
    assert path.name == "bs2-bfloat16.json" and read_schedule(path).dtype == "bfloat16"
    x = torch.randn(2, *INPUT_SHAPE).to(torch.bfloat16)
    with torch.inference_mode():
        assert relative_error(result.deploy(model)(x), model(x)) <= HALF_TOLERANCE[torch.bfloat16]

    # The same model searched in float32: other measurements, none of the bfloat16 ones reused or replaced.
    in_float32 = ios_ray.search(model, "cpu", 2, dtype="float32", **options)
    assert in_float32["cpu", 2].schedule.dtype == "float32" and in_float32["cpu", 2].cached == 0
    assert in_float32["cpu", 2].measured > 0
    again = ios_ray.search(model, "cpu", 2, **options)["cpu", 2]
    assert again.cached == outcome.measured  # every bfloat16 row found again
    if again.schedule.params["measure"]["remeasured"] == 0:  # no stored outlier (a burst of load) measured again
        assert again.measured == 0
    # the DP's prediction, from the same stored latencies, priced by the correction fitted from the schedules the
    # first search's check ran whole (the float32 search's runs are of another dtype)
    fitted = plausible_runs(outcome.end_to_end.candidates)  # a burst of load can put a run beyond belief
    assert again.correction.runs == fitted and (fitted == 0 or again.correction != outcome.correction)


@pytest.mark.slow
def test_a_model_whose_graph_depends_on_its_dtype_is_imported_in_it_everywhere(ray_local: None, tmp_path: Path) -> None:
    """Driver and actors import the model in the dtype searched, so a graph that holds the dtype agrees."""
    torch.manual_seed(0)
    model = DtypeCast().eval().half()
    assert (import_module(model, example_input(model, INPUT_SHAPE)).graph.fingerprint
            != import_module(DtypeCast(), example_input(DtypeCast(), INPUT_SHAPE)).graph.fingerprint)
    result = ios_ray.search(model, "cpu", 2, input_shape=INPUT_SHAPE, store=tmp_path / "s.duckdb",
                            check_rounds=least_rounds(), warmup=0, repeat=1, kernels=NAMED_KERNELS,
                            progress=False)
    assert result["cpu", 2].schedule.dtype == "float16" and result["cpu", 2].measured > 0
    x = torch.randn(2, *INPUT_SHAPE).half()
    with torch.inference_mode():
        assert relative_error(result.deploy(model)(x), model(x)) <= HALF_TOLERANCE[torch.float16]


def test_model_must_be_a_module_or_a_spec(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="model must be an nn.Module or a model spec string, not a int"):
        ios_ray.search(42, "sim:v100", store=tmp_path / "s.duckdb", progress=False)  # type: ignore[arg-type]


def test_an_option_search_lacks_is_a_type_error_naming_search_and_the_closest_option() -> None:
    with pytest.raises(TypeError, match=r"^search\(\) got an unexpected keyword argument 'check_round'; did you mean "
                                        r"'check_rounds'\?$"):
        ios_ray.search(TwoBranch(), "sim:v100", check_round=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^optimize\(\) got an unexpected keyword argument 'zzz'; its options are "
                                        r"store, out, .*, memory_budget, progress\.$"):
        ios_ray.optimize(TwoBranch(), torch.randn(1, *INPUT_SHAPE), zzz=1, progress=False)  # progress is search's own


def test_optimize_runs_on_this_machine_only() -> None:
    x = torch.randn(1, *INPUT_SHAPE)
    with pytest.raises(UserError, match="optimize runs on this machine"):
        ios_ray.optimize(TwoBranch(), x, device="sim:v100")
    with pytest.raises(UserError, match="optimize takes the batches from the example input"):
        ios_ray.optimize(TwoBranch(), x, batches=[2])
    with pytest.raises(UserError, match="example_input must be a batch"):
        ios_ray.optimize(TwoBranch(), torch.randn(5))
    with pytest.raises(UserError, match=r"^example_input must be a tensor \(a batch, batch size first\), not a list"):
        ios_ray.optimize(TwoBranch(), [x])  # type: ignore[arg-type]
    with pytest.raises(UserError, match="example_input is float16 and the model's parameters are float32; convert"):
        ios_ray.optimize(TwoBranch(), x.half())
    with pytest.raises(UserError, match="optimize takes the dtype from the example input"):
        ios_ray.optimize(TwoBranch(), x, dtype="float16")

