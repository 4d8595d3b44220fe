"""Half precision without a GPU: dtype names, a module's own dtype, programs and deployment in float16 and bfloat16,
and choosing a schedule by the input's dtype (CPU; the search in a dtype is in tests/test_api.py)."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from ios_ray.app.cli.bench import find_schedule
from ios_ray.runtime.accuracy import HALF_TOLERANCE, output_tolerance, relative_error
from ios_ray.dtypes import dtype_name, example_input, module_dtype, torch_dtype
from ios_ray.errors import UserError
from ios_ray.frontend import import_module
from ios_ray.ir import Graph
from ios_ray.runtime import Program, ScheduledModule
from ios_ray.runtime.schedule_set import select_schedule
from ios_ray.runtime.units import fold
from ios_ray.schedule import BlockSchedule, Schedule, save_schedule
from ios_ray.scheduler import greedy_stages, sequential_stages
from ios_ray.zoo.inception_v3 import InceptionV3
from tests.api_model import INPUT_SHAPE, TwoBranch
from tests.helpers import randomise_batchnorm

HALVES = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("given, name", [
    ("float32", "float32"), ("fp16", "float16"), ("half", "float16"), ("BF16", "bfloat16"),
    ("torch.float16", "float16"), (torch.bfloat16, "bfloat16"), (torch.float32, "float32"),
])
def test_dtype_names_accept_the_usual_spellings(given: str | torch.dtype, name: str) -> None:
    assert dtype_name(given) == name
    assert torch_dtype(name) == getattr(torch, name)


@pytest.mark.parametrize("given", ["int8", "float64", torch.float64, ""])
def test_other_dtypes_are_refused_in_one_sentence(given: str | torch.dtype) -> None:
    with pytest.raises(UserError, match="dtype must be one of float32, float16, bfloat16"):
        dtype_name(given)


def test_a_module_has_the_dtype_of_its_parameters() -> None:
    assert module_dtype(TwoBranch()) == "float32"
    assert module_dtype(TwoBranch().half()) == "float16"
    assert module_dtype(nn.ReLU()) == "float32"  # no parameters
    mixed = TwoBranch()
    mixed.head.half()
    with pytest.raises(UserError, match="parameters are float16 and float32.*pass dtype="):
        module_dtype(mixed)
    with pytest.raises(UserError, match="parameters are float64"):
        module_dtype(TwoBranch().double())


def test_an_example_input_follows_the_module() -> None:
    x = example_input(TwoBranch().to(torch.bfloat16), INPUT_SHAPE, batch=2)
    assert x.shape == (2, *INPUT_SHAPE) and x.dtype == torch.bfloat16 and x.device.type == "cpu"
    assert torch.equal(x.float(), example_input(TwoBranch(), INPUT_SHAPE, batch=2).to(torch.bfloat16).float())


def test_folding_rounds_once_to_the_conv_dtype() -> None:
    """Folded in float32 and rounded once: a half conv and batch-norm fold to exactly what their float32 copies
    fold to, rounded."""
    torch.manual_seed(0)
    half_conv = nn.Conv2d(8, 16, 3).half()
    half_bn = randomise_batchnorm(nn.Sequential(nn.BatchNorm2d(16))).eval()[0].half()
    folded = fold(half_conv, half_bn, {})
    wide = fold(copy.deepcopy(half_conv).float(), copy.deepcopy(half_bn).float(), {})
    assert folded.weight.dtype == torch.float16 and folded.bias is not None and wide.bias is not None
    assert torch.equal(folded.weight, wide.weight.half())
    assert torch.equal(folded.bias, wide.bias.half())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", HALVES)
def test_a_program_in_half_precision_matches_the_half_model(dtype: torch.dtype) -> None:
    """A model imported in ``dtype`` computes what it computes eagerly there, within the tolerance ``ios-ray run``
    holds half outputs to; and close to float32."""
    torch.manual_seed(0)
    model = randomise_batchnorm(InceptionV3()).eval()
    half = copy.deepcopy(model).to(dtype)
    program = Program.from_imported(import_module(half, example_input(half, (3, 139, 139))))
    x = torch.randn(2, 3, 139, 139)  # Inception V3's structure at a quarter of the arithmetic of 299x299
    with torch.inference_mode():
        ours = program.run(x.to(dtype))
        eager = half(x.to(dtype))
        full = model(x)
    assert ours.dtype == dtype
    error = relative_error(ours, eager)
    assert error <= HALF_TOLERANCE[dtype] / 3, error
    assert relative_error(ours, full) <= HALF_TOLERANCE[dtype], relative_error(ours, full)
    assert output_tolerance(torch.device("cpu"), dtype) == HALF_TOLERANCE[dtype]


def _schedules(graph: Graph) -> tuple[Schedule, Schedule]:
    """A float32 and a float16 schedule of a graph for the CPU, differing in their stages (greedy, sequential)."""
    greedy = tuple(BlockSchedule(b.index, greedy_stages(graph, b)) for b in graph.blocks)
    plain = tuple(BlockSchedule(b.index, sequential_stages(graph, b)) for b in graph.blocks)
    float32 = Schedule("TwoBranch", graph.fingerprint, "cpu", 4, greedy, input_shape=graph.input_shape)
    return float32, dataclasses.replace(float32, blocks=plain, dtype="float16")


def test_the_schedule_made_for_the_input_dtype_is_chosen_else_another() -> None:
    graph = import_module(TwoBranch(), example_input(TwoBranch(), INPUT_SHAPE)).graph
    float32, float16 = _schedules(graph)
    both = [float32, float16]
    assert select_schedule(both, "cpu", 4, dtype="float16") is float16
    assert select_schedule(both, "cpu", 4, dtype="float32") is float32
    assert select_schedule([float32], "cpu", 4, dtype="bfloat16") is float32
    assert select_schedule(both, "cuda", 4, dtype="float16") is None


@pytest.mark.parametrize("dtype", HALVES)
def test_a_half_model_deploys_with_its_own_schedule_and_warns_on_another(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = TwoBranch().eval().to(dtype)
    graph = import_module(model, example_input(model, INPUT_SHAPE)).graph
    float32, half = _schedules(graph)
    half = dataclasses.replace(half, dtype=dtype_name(dtype))
    x = torch.randn(4, *INPUT_SHAPE).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fast = ScheduledModule(model, [float32, half])
        assert fast.schedule_for(x) is half
        with torch.inference_mode():
            assert relative_error(fast(x), model(x)) <= HALF_TOLERANCE[dtype]
    alone = ScheduledModule(model, [float32])
    with pytest.warns(UserWarning, match=f"no schedule for {dtype_name(dtype)} inputs on cpu; running the one made "
                                         "for float32"):
        assert alone.schedule_for(x) is float32
    with torch.inference_mode():
        assert relative_error(alone(x), model(x)) <= HALF_TOLERANCE[dtype]


def test_bench_finds_the_schedule_of_its_dtype_or_says_what_to_search(tmp_path: Path) -> None:
    folder = tmp_path
    graph = import_module(TwoBranch(), example_input(TwoBranch(), INPUT_SHAPE)).graph
    float32, float16 = _schedules(graph)
    save_schedule(float32, folder / "TwoBranch" / "cpu" / "bs4.json")
    assert find_schedule(folder, graph, "cpu", 4).stages == float32.stages
    with pytest.raises(UserError, match="no bfloat16 schedule of .* --dtype bfloat16 --out"):
        find_schedule(folder, graph, "cpu", 4, "bfloat16")
    save_schedule(float16, folder / "TwoBranch" / "cpu" / "bs4-float16.json")
    found = find_schedule(folder, graph, "cpu", 4, "float16")
    assert (found.dtype, found.stages) == ("float16", float16.stages) and found.stages != float32.stages
