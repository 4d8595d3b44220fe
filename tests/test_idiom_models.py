"""Models written in torchvision's and timm's idioms (``tests/idiom_models.py``) import into clean units.

* No opaque unit is an activation, an eval-mode identity or a size computation; a squeeze-excitation gate adds at
  most two units beyond its convs; a channel shuffle is one unit.
* Every idiom model equals eager (fp32, relative error <= 1e-5) at batch 1 and 4 under the sequential schedule and
  the DP's, with eager and with fused kernels (the zoo models are checked the same way in
  ``test_runtime_models.py``).
* A residual sum of a tensor the conv's input was computed from is the conv's own (so fused kernels add it inside
  the convolution); one of a branch the schedule may run beside the conv stays a unit.
* The torchvision-style Inception V3 has no opaque unit and plans exactly as many distinct candidate stages as the
  zoo's ``inception_v3``.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import dataclasses

import pytest
import torch
from torch import nn

from ios_ray.blocks import count_states, find_blocks
from ios_ray.frontend import Imported, import_model, import_module, opaque_report, output_tensor
from ios_ray.frontend.activations import ACTIVATIONS
from ios_ray.frontend.report import op_kind, unit_ops
from ios_ray.ir import Graph
from ios_ray.runtime import Program, ScheduleRunner
from ios_ray.scheduler import BlockDag, SearchParams, plan_graph
from tests.test_runtime_schedules import dp_blocks
from tests.helpers import randomise_batchnorm, relative_error
from tests.idiom_models import (
    SMALL,
    MobileNetStyle,
    ResNetStyle,
    SqueezeExcitation,
    SqueezeExcite,
    attention_style,
    inception_v3_style,
    multi_resolution_style,
    rep_style,
    shufflenet_style,
    std_conv_style,
    tf_same_style,
)
from tests.test_runtime_schedules import BUILDERS, make_schedule

BATCHES = (1, 4)
#: What an opaque unit must never be: an activation, an eval-mode identity, a size computation.
NEVER_OPAQUE = {*ACTIVATIONS, "ReLU", "ReLU6", "LeakyReLU", "Hardtanh", "Hardswish", "Hardsigmoid", "SiLU",
                "Sigmoid", "GELU", "Tanh", "relu_", "sigmoid_", "Dropout", "Dropout2d", "AlphaDropout", "dropout",
                "Identity", "stochastic_depth", "drop_path", "contiguous", "size", "getattr", "floordiv", "dim"}


def assert_clean(graph: Graph) -> None:
    """No opaque unit runs an activation, an eval identity or a size computation; every unit computes a tensor."""
    assert all(u.shape for u in graph.units), [u.id for u in graph.units if not u.shape]
    ops = [op_kind(op) for u in graph.units if u.kind == "opaque" for op in unit_ops(u.attrs)]
    assert not NEVER_OPAQUE & set(ops), ops


class Case:
    """One idiom model with randomised batch-norms, its inputs and eager outputs per batch size, and its import."""

    def __init__(self, factory: Callable[[], nn.Module]) -> None:
        torch.manual_seed(0)
        self.model = randomise_batchnorm(factory())
        generator = torch.Generator().manual_seed(1)
        self.inputs = {b: torch.randn(b, *factory.input_shape, generator=generator) for b in BATCHES}  # type: ignore
        with torch.no_grad():
            self.expected = {b: output_tensor(self.model(x.clone())) for b, x in self.inputs.items()}
        self.imported: Imported = import_module(self.model, self.inputs[1])

    def check_schedules(self) -> None:
        """The sequential and the DP's schedules, run as deployed with eager and with fused kernels, give the eager
        outputs."""
        for kernels in ("eager", "fused"):
            program = Program.from_imported(self.imported, "cpu", kernels)
            for strategy in ("sequential", "dp"):
                for batch, x in self.inputs.items():
                    schedule = make_schedule(self.imported.graph, BUILDERS[strategy], batch, kernels=kernels)
                    runner = ScheduleRunner(program, schedule, torch.device("cpu"))
                    with torch.no_grad():
                        assert relative_error(runner(x), self.expected[batch]) <= 1e-5, (kernels, strategy, batch)


#: The op kinds that stay opaque, by model: only what no rule knows.
OPAQUE_OPS = {"convnext": {"permute", "LayerNorm", "layer_norm"}, "attention": {"reshape", "permute"}}


@pytest.mark.parametrize("name", list(SMALL))
def test_idiom_model_imports_clean_and_equals_eager(name: str) -> None:
    case = Case(SMALL[name])
    assert_clean(case.imported.graph)
    assert {op for op, _ in opaque_report(case.imported.graph).ops} == OPAQUE_OPS.get(name, set())
    case.check_schedules()


@pytest.mark.parametrize("gate", [
    lambda: SqueezeExcitation(16, 4, nn.ReLU, nn.Hardsigmoid), lambda: SqueezeExcitation(16, 4, nn.SiLU, nn.Sigmoid),
    lambda: SqueezeExcite(16, 4),
])
def test_squeeze_excitation_adds_at_most_two_units_beyond_its_convs(gate: Callable[[], nn.Module]) -> None:
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), gate()).eval()
    kinds = Counter(u.kind for u in import_module(model, torch.randn(1, 3, 8, 8)).graph.units)
    assert kinds["conv"] == 3 and sum(kinds.values()) - kinds["conv"] <= 2, kinds


def test_every_gate_of_a_model_is_one_scale_unit() -> None:
    model = MobileNetStyle(efficientnet=True).eval()
    gates = sum(isinstance(m, SqueezeExcitation) for m in model.modules())
    kinds = Counter(u.kind for u in import_module(model, torch.randn(1, 3, 32, 32)).graph.units)
    assert kinds["scale"] == gates == 2


def test_each_block_of_branches_summed_is_one_conv_unit() -> None:
    graph = import_module(rep_style(), torch.randn(1, 3, 32, 32)).graph
    assert [(u.kind, u.attrs.get("kernel"), u.attrs.get("act")) for u in graph.units][:6] == \
        [("conv", (3, 3), "relu")] * 6  # six blocks, depthwise or not, strided or not, with an identity or not
    assert len(graph.units) == 8, "then the pooled mean and the head"


def test_each_channel_shuffle_is_one_unit() -> None:
    graph = import_module(shufflenet_style(), torch.randn(1, 3, 32, 32)).graph
    kinds = Counter(u.kind for u in graph.units)
    assert kinds["shuffle"] == 3 and kinds["concat"] == 0 and kinds["opaque"] == 0


def test_tf_same_layers_are_conv_or_pool_units_padding_themselves_where_they_can() -> None:
    graph = import_module(tf_same_style(), torch.randn(1, 3, 33, 30)).graph
    kinds = Counter(u.kind for u in graph.units)
    # stem, depthwise and pointwise convs; both pools and the head's mean; one pad, where "SAME" pads unevenly
    assert (kinds["conv"], kinds["pool"], kinds["pad"], kinds["opaque"]) == (3, 3, 1, 0), kinds
    # 33x30 -> 17x15 (stem: W pads 0 left and 1 right, H 1 and 1: F.pad takes (left, right, top, bottom)), then the
    # cell's 17x15 -> 9x8 pads evenly (k=5: 2 on every side; k=3: 1), so each layer pads itself (1x1: nothing)
    [pad] = [u for u in graph.units if u.kind == "pad"]
    assert pad.attrs == {"pads": (0, 1, 1, 1), "value": 0.0}
    padding = {u.id.split("_")[0]: u.attrs["padding"] for u in graph.units if "padding" in u.attrs}
    assert padding == {"stem": (0, 0), "depthwise": (2, 2), "max": (1, 1), "avg": (1, 1), "pointwise": (0, 0)}


def test_convs_on_weights_computed_from_parameters_are_conv_units_with_their_batch_norm_folded() -> None:
    graph = import_module(std_conv_style(), torch.randn(1, 3, 32, 32)).graph
    convs = [u for u in graph.units if u.kind == "conv"]
    assert len(convs) == 3 and opaque_report(graph).opaque == 0, [(u.id, u.kind) for u in graph.units]
    functional = next(u for u in convs if u.attrs["kernel"] == (3, 3) and u.attrs["stride"] == (1, 1))
    assert "bn" in functional.refs and functional.attrs["act"] == "relu"


@pytest.mark.parametrize("capture", ["export", "fx"])
def test_tensors_with_the_batch_folded_into_another_dimension_stay_inside_the_unit_that_reads_them(
        capture: str) -> None:
    graph = import_module(attention_style(), torch.randn(1, 3, 32, 32), capture=capture).graph
    opaque = [u for u in graph.units if u.kind == "opaque"]
    # the attention from the (B * heads, ...) reshapes to the reshape back to (B, C, H, W) is one unit
    attention = next(u for u in opaque if any("softmax" in step for step in u.attrs.get("after", ())))
    assert sum("matmul" in step for step in attention.attrs["after"]) == 2
    if capture == "fx":  # a trace reads the batch back from dimension 1 of a (H * W, B, C) tensor: a size of the
        back = next(u for u in opaque if "permute" in u.refs.get("sized", {}))  # batch, not a literal (export's
        assert back.refs["sized"] == {"permute": ((256, 1, 16), (False, True, False))}  # shapes read the input's)
    # every unit's output holds the batch in dimension 0: channels first (16, 48 for q, k and v, 10 classes), never a
    # per-head layout such as (256, 4)
    assert all(u.shape[0] in (16, 48, 10) for u in graph.units), [(u.id, u.shape) for u in graph.units]


def test_a_traced_model_runs_again_at_another_batch_size_only_where_an_op_may_move_the_batch() -> None:
    convs = import_module(SMALL["timm"](), torch.randn(1, 3, 32, 32), capture="fx").module
    assert not any("batch_dims" in node.meta for node in convs.graph.nodes)
    attention = import_module(attention_style(), torch.randn(1, 3, 32, 32), capture="fx").module
    assert any(node.meta.get("batch_dims") == (False, True, False) for node in attention.graph.nodes)


def test_a_captured_model_never_runs_on_real_tensors_and_its_batch_layout_comes_from_its_symbolic_shapes() -> None:
    model, inputs = attention_style(), []
    model.register_forward_pre_hook(lambda module, args: inputs.append(type(args[0])))
    attention = import_module(model, torch.randn(1, 3, 32, 32), capture="export").module
    assert inputs and all(kind is not torch.Tensor for kind in inputs)  # fake tensors only: shapes, no values
    assert any(node.meta.get("batch_dims") == (False, True, False) for node in attention.graph.nodes)


def test_a_submodule_torch_fx_cannot_trace_runs_as_one_opaque_unit() -> None:
    model = import_model("tests.user_models:untraceable")
    assert [(u.id, u.kind) for u in model.graph.units] == [("stem", "conv"), ("gate", "opaque")]
    assert [op for op, _ in opaque_report(model.graph).ops] == ["_DataDependent"]
    x = torch.randn(2, *model.graph.input_shape)
    with torch.no_grad():
        assert relative_error(Program.from_imported(model).run(x), model.module(x)) <= 1e-6


@pytest.mark.slow
def test_torchvision_style_inception_plans_as_many_stages_as_the_zoos() -> None:
    case = Case(inception_v3_style)
    graph = case.imported.graph
    assert opaque_report(graph).opaque == 0
    params = SearchParams(r=3, s=8)
    zoo = import_model("inception_v3").graph
    assert (len(graph.units), len(graph.blocks)) == (len(zoo.units), len(zoo.blocks))
    assert len(plan_graph(graph, params).stages) == len(plan_graph(zoo, params).stages) == 3711
    case.check_schedules()


def test_a_block_with_too_many_states_runs_as_parts_cut_at_depth_levels_with_the_branches_side_by_side() -> None:
    case = Case(multi_resolution_style)
    graph = case.imported.graph
    [wide] = [b for b in graph.blocks if len(b.units) > 1]
    units = [graph.unit(u) for u in wide.units]
    assert count_states(units, 10_000) == 216  # 5 states per branch (none to all four convs), fuse convs, mean
    split = dataclasses.replace(graph, blocks=find_blocks(graph.units, graph.output, max_states=40))
    parts = [b for b in split.blocks if set(b.units) <= set(wide.units)]
    assert len(parts) > 1 and sorted(u for p in parts for u in p.units) == sorted(wide.units)
    for part in parts:
        assert count_states([graph.unit(u) for u in part.units], 40) <= 40
        BlockDag.of(split, part)  # listed in topological order, or this raises
    # every cut is between depth levels, so the first part holds the start of all three branches
    assert {u.split(".")[1] for u in parts[0].units if u.startswith("branches.")} == {"0", "1", "2"}
    assert any(len(stage.groups) > 1 for block in dp_blocks(split) for stage in block.stages)
    case.imported = dataclasses.replace(case.imported, graph=split)
    case.check_schedules()


def test_a_residual_sum_is_the_convs_own_only_where_its_input_came_from_the_tensor_added() -> None:
    graph = import_module(ResNetStyle().eval(), torch.randn(1, 3, 32, 32)).graph
    residual = [u for u in graph.units if u.attrs.get("residual")]
    # blocks 0 and 2 add their own input: their second conv reads it and applies the block's ReLU after the sum;
    # block 1 adds its downsampling branch's conv, which may run beside conv2: that sum stays an add unit
    assert [u.id for u in residual] == ["layers.0.conv2", "layers.2.conv2"]
    assert all(u.attrs["act"] == "relu" and len(u.inputs) == 2 for u in residual)
    assert [u.kind for u in graph.units].count("add") == 1
