"""Channels-last (NHWC) models: format names, a module's own format, the graph and stage keys that carry it, stages
measured in it, merged convs kept in it, and a channels-last model searched, stored, saved and deployed (CPU)."""

from __future__ import annotations

import json
import operator
from pathlib import Path

import pytest
import torch
from torch import nn

import ios_ray
from ios_ray.app.cli.bench import find_schedule
from ios_ray.runtime.accuracy import relative_error
from ios_ray.dtypes import converted, in_memory_format, memory_format_name, module_memory_format
from ios_ray.errors import UserError
from ios_ray.frontend import import_model, import_module
from ios_ray.ir import Graph
from ios_ray.profiler.real import random_inputs
from ios_ray.runtime import Program, ScheduledModule
from ios_ray.runtime.merge import merge_convs
from ios_ray.runtime.units import FoldedConv
from ios_ray.schedule import BlockSchedule, Schedule, check_schedule, read_schedule, save_schedule
from ios_ray.scheduler import sequential_stages
from ios_ray.stage import Stage, StageKeys
from ios_ray.store import LatencyStore
from ios_ray.paired import least_rounds
from tests.api_model import INPUT_SHAPE, TwoBranch
from tests.helpers import GIVEN_KERNELS, NAMED_KERNELS, ios_ray_here

NHWC = torch.channels_last


def nhwc_only(tensor: torch.Tensor) -> bool:
    """Laid out NHWC and not also NCHW (a 1x1 or single-channel tensor is both)."""
    return tensor.is_contiguous(memory_format=NHWC) and not tensor.is_contiguous()


def imported(model: nn.Module) -> Graph:
    return import_module(model, torch.randn(1, *INPUT_SHAPE)).graph


@pytest.mark.parametrize("given, name", [
    ("contiguous", "contiguous"), ("channels_last", "channels_last"), ("NHWC", "channels_last"),
    ("nchw", "contiguous"), (torch.channels_last, "channels_last"), (torch.contiguous_format, "contiguous"),
    ("torch.channels_last", "channels_last"),
])
def test_memory_format_names_accept_the_usual_spellings(given: str | torch.memory_format, name: str) -> None:
    assert memory_format_name(given) == name


@pytest.mark.parametrize("given", ["channels_last_3d", torch.channels_last_3d, torch.preserve_format, ""])
def test_other_memory_formats_are_refused_in_one_sentence(given: str | torch.memory_format) -> None:
    with pytest.raises(UserError, match="memory format must be one of contiguous, channels_last"):
        memory_format_name(given)


def test_a_module_has_the_memory_format_of_its_4d_parameters() -> None:
    assert module_memory_format(TwoBranch()) == "contiguous"
    assert module_memory_format(TwoBranch().to(memory_format=NHWC)) == "channels_last"
    assert module_memory_format(nn.Sequential(nn.Conv2d(3, 8, 1), nn.Linear(2, 2))) == "contiguous"  # 1x1: both
    mixed = TwoBranch()
    mixed.b.to(memory_format=NHWC)
    with pytest.raises(UserError, match="partly contiguous .* and partly channels_last"):
        module_memory_format(mixed)


def test_converting_copies_only_where_the_format_or_dtype_differs() -> None:
    model = TwoBranch()
    assert converted(model, "float32", "contiguous") is model
    nhwc = converted(model, "float32", "channels_last")
    assert nhwc is not model and nhwc_only(nhwc.b.weight) and not nhwc_only(model.b.weight)
    assert converted(nhwc, "float32", "channels_last") is nhwc
    five_d = TwoBranch()
    five_d.table = nn.Parameter(torch.randn(1, 2, 3, 4, 5))  # as timm's lambda layers hold; .to(memory_format=) fails
    held = converted(five_d, "float32", "channels_last")
    assert nhwc_only(held.b.weight) and held.table.is_contiguous() and isinstance(held.table, nn.Parameter)
    x = torch.randn(2, 3, 5, 5)
    assert nhwc_only(in_memory_format(x, "channels_last")) and in_memory_format(x, "contiguous") is x
    assert in_memory_format(torch.randn(2, 3), "channels_last").is_contiguous()


def test_the_graph_and_its_stage_keys_carry_the_memory_format() -> None:
    nchw, nhwc = imported(TwoBranch()), imported(TwoBranch().to(memory_format=NHWC))
    assert (nchw.memory_format, nhwc.memory_format) == ("contiguous", "channels_last")
    assert nchw.fingerprint != nhwc.fingerprint and nchw.units == nhwc.units
    assert "memory_format" not in nchw.to_json()  # so graphs and stage keys of NCHW models are as they were
    assert Graph.from_json(json.loads(json.dumps(nhwc.to_json()))) == nhwc
    stage = Stage("concurrent", tuple((u.id,) for u in nchw.units[1:3]))
    assert StageKeys(nchw).key(stage) != StageKeys(nhwc).key(stage)
    assert "memory_format" not in StageKeys(nchw).describe(stage)
    assert StageKeys(nhwc).describe(stage)["memory_format"] == "channels_last"
    assert import_model("squeezenet", memory_format="channels_last").graph.memory_format == "channels_last"


def test_stages_of_a_channels_last_graph_are_measured_on_nhwc_inputs() -> None:
    for model, layout in ((TwoBranch(), "contiguous"), (TwoBranch().to(memory_format=NHWC), "channels_last")):
        graph = imported(model)
        stage = Stage("concurrent", tuple((u.id,) for u in graph.units if u.kind == "conv")[1:3])
        [x] = random_inputs(graph, stage, 2, torch.float32, torch.device("cpu")).values()
        assert x.dim() == 4 and nhwc_only(x) == (layout == "channels_last")


def test_a_merged_conv_keeps_the_models_memory_format_and_its_outputs() -> None:
    torch.manual_seed(0)
    for model in (TwoBranch().eval(), TwoBranch().eval().to(memory_format=NHWC)):
        program = Program.from_imported(import_module(model, torch.randn(1, *INPUT_SHAPE)))
        convs = [u.id for u in program.graph.units if u.kind == "conv"]
        merged = merge_convs(program, convs[1:4])
        assert nhwc_only(merged.conv.weight) == (program.graph.memory_format == "channels_last")
        x = in_memory_format(torch.randn(2, 16, *INPUT_SHAPE[1:]), program.graph.memory_format)
        with torch.no_grad():
            together = merged(x)
            for unit_id in convs[1:4]:
                assert relative_error(together[unit_id], program.fns[unit_id]([x])) < 1e-5


def _schedule(graph: Graph, batch: int = 2) -> Schedule:
    blocks = tuple(BlockSchedule(b.index, sequential_stages(graph, b)) for b in graph.blocks)
    return Schedule("TwoBranch", graph.fingerprint, "cpu", batch, blocks, input_shape=graph.input_shape,
                    memory_format=graph.memory_format)


def test_a_schedule_records_its_memory_format_and_refuses_a_model_in_another(tmp_path: Path) -> None:
    nchw, nhwc = imported(TwoBranch()), imported(TwoBranch().to(memory_format=NHWC))
    path = tmp_path / "bs2.json"
    save_schedule(_schedule(nhwc), path)
    assert read_schedule(path).memory_format == "channels_last"
    data = json.loads(path.read_text())
    del data["memory_format"]  # a file written before memory formats
    path.write_text(json.dumps(data))
    assert read_schedule(path).memory_format == "contiguous"
    with pytest.raises(UserError, match="made for the model in channels_last memory format, and this 'TwoBranch' is "
                                        r"contiguous; convert the model \(model.to\(memory_format=torch.channels_last"):
        check_schedule(_schedule(nhwc), nchw)
    folder = tmp_path / "schedules"
    save_schedule(_schedule(nhwc), folder / "TwoBranch" / "cpu" / "bs2-channels_last.json")
    with pytest.raises(UserError, match="those there are for models in channels_last memory format, and this one is "
                                        "contiguous"):
        ScheduledModule(TwoBranch(), folder)
    nchw_only = tmp_path / "nchw"
    save_schedule(_schedule(nchw), nchw_only / "TwoBranch" / "cpu" / "bs2.json")
    with pytest.raises(UserError, match="--memory-format channels_last --out"):
        find_schedule(nchw_only, nhwc, "cpu", 2)


def test_a_channels_last_model_deploys_in_nhwc_and_matches_eager() -> None:
    torch.manual_seed(0)
    model = TwoBranch().eval().to(memory_format=NHWC)
    graph = imported(model)
    fast = ScheduledModule(model, [_schedule(graph, 4)])
    for x in (torch.randn(4, *INPUT_SHAPE), in_memory_format(torch.randn(4, *INPUT_SHAPE), "channels_last")):
        with torch.inference_mode():
            assert relative_error(fast(x), model(x)) <= 1e-5
    program = Program.from_imported(import_module(model, torch.randn(1, *INPUT_SHAPE)))
    weights = [f.weight for f in program.fns.values() if isinstance(f, FoldedConv)]
    assert weights and all(nhwc_only(w) for w in weights if w.shape[-1] == 3)  # folding kept the layout


def test_a_module_converted_after_wrapping_runs_the_schedules_of_its_new_format(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TwoBranch().eval()
    nchw, nhwc = imported(model), imported(converted(model, "float32", "channels_last"))
    save_schedule(_schedule(nchw, 4), tmp_path / "TwoBranch" / "cpu" / "bs4.json")
    save_schedule(_schedule(nhwc, 4), tmp_path / "TwoBranch" / "cpu" / "bs4-channels_last.json")
    fast = ScheduledModule(model, tmp_path)
    x = torch.randn(4, *INPUT_SHAPE)
    assert fast.schedule_for(x).memory_format == "contiguous"
    fast.to(memory_format=NHWC)
    assert fast.graph.memory_format == "channels_last" and fast.schedule_for(x).memory_format == "channels_last"
    with torch.inference_mode():
        assert relative_error(fast(in_memory_format(x, "channels_last")), model(x)) <= 1e-5
    only_nchw = ScheduledModule(TwoBranch().eval(), [_schedule(nchw, 4)]).to(memory_format=NHWC)
    with pytest.warns(UserWarning, match="no schedule given was made for this model as it is now \\(in channels_last"):
        assert only_nchw.schedule_for(x) is None
    with torch.inference_mode():
        assert relative_error(only_nchw(x), only_nchw.module(x)) == 0


@pytest.mark.slow
def test_a_channels_last_model_object_is_searched_stored_and_deployed_in_nhwc(ray_local: None, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TwoBranch().eval().to(memory_format=NHWC)
    store = tmp_path / "s.duckdb"
    options = {"input_shape": INPUT_SHAPE, "store": store, "check_rounds": least_rounds(), "warmup": 1, "repeat": 3,
               "progress": False, "kernels": NAMED_KERNELS}
    result = ios_ray.search(model, "cpu", 2, **options)
    [outcome] = result
    assert outcome.schedule.memory_format == "channels_last" and outcome.measured > 0
    assert "input 3x16x16, float32 channels_last" in repr(result)
    stored = LatencyStore(store, create=False).query(device="cpu")
    assert {json.loads(s).get("memory_format") for s in stored["stage"].to_pylist()} == {"channels_last"}
    [path] = result.save(tmp_path / "out")
    assert path.name == "bs2-channels_last.json" and read_schedule(path).memory_format == "channels_last"
    x = in_memory_format(torch.randn(2, *INPUT_SHAPE), "channels_last")
    with torch.inference_mode():
        assert relative_error(result.deploy(model)(x), model(x)) <= 1e-5

    # The same model searched in NCHW: other stage keys, none of the NHWC rows reused or replaced.
    order = operator.itemgetter("stage_key", "device_fingerprint")
    nhwc_rows = sorted(stored.to_pylist(), key=order)
    nchw = ios_ray.search(model, "cpu", 2, memory_format="contiguous", **options)
    assert nchw["cpu", 2].schedule.memory_format == "contiguous" and nchw["cpu", 2].cached == 0
    after = LatencyStore(store, create=False).query(device="cpu").to_pylist()
    assert [row for row in sorted(after, key=order) if row["stage_key"] in {r["stage_key"] for r in nhwc_rows}] \
        == nhwc_rows
    # Searched in NHWC again, it finds every NHWC row (on a busy machine it may measure a stored outlier again and
    # then a stage more: the lazy search's table changed, which is not what this test is about).
    again = ios_ray.search(model, "cpu", 2, **options)
    assert again["cpu", 2].cached == outcome.measured


@pytest.mark.slow
def test_the_cli_searches_runs_and_shows_a_channels_last_model(ray_local: None, tmp_path: Path) -> None:
    common = ["--model", "squeezenet", "--input-shape", "3x64x64"]
    done = ios_ray_here("search", *common, "--devices", "cpu", "--memory-format", "nhwc", "--store", "s.duckdb",
                        "--out", "out", "--warmup", "0", "--repeat", "1", "--check-rounds", str(least_rounds()),
                        *GIVEN_KERNELS, cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    assert "squeezenet in channels_last" in done.stdout
    path = tmp_path / "out" / "squeezenet" / "cpu" / "bs1-channels_last.json"
    assert read_schedule(path).memory_format == "channels_last"
    ran = ios_ray_here("run", *common, "--schedules", "out", "--memory-format", "channels_last", "--repeat", "2",
                       cwd=tmp_path)
    assert ran.returncode == 0 and "float32 channels_last" in ran.stdout and "(ok, " in ran.stdout, ran.stdout
    refused = ios_ray_here("run", *common, "--schedules", "out", "--repeat", "2", cwd=tmp_path)
    assert refused.returncode != 0 and "those there are for models in channels_last" in " ".join(refused.stderr.split())
    shown = ios_ray_here("show", str(path), cwd=tmp_path)
    kernels = read_schedule(path).kernels
    assert shown.returncode == 0 and f"(batch 1, float32, channels_last, {kernels} kernels, measured)" in shown.stdout


@pytest.mark.parametrize("args, message", [
    (["--devices", "cpu", "--memory-format", "channels_last_3d"], "memory format must be one of contiguous, "
                                                                  "channels_last, not 'channels_last_3d'"),
    (["--devices", "sim:v100", "--memory-format", "channels_last"], "the sim model covers contiguous only, so "
                                                                    "sim:v100 cannot be searched in channels_last"),
])
def test_a_bad_memory_format_fails_in_one_sentence(args: list[str], message: str, tmp_path: Path) -> None:
    done = ios_ray_here("search", "--model", "squeezenet", *args, "--store", "s.duckdb", cwd=tmp_path)
    assert done.returncode != 0 and message in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
    assert not (tmp_path / "s.duckdb").exists()

