"""The kernels a program's units run with (ios_ray/runtime/kernels.py): fused kernels compute what eager ones do, in
every layout, dtype and activation the fused op takes; the model's own code keeps its layout; a device running other
kernels is another device for the store; and the CUDA binding runs cuDNN's fused op inside captures and streams
(against the fake torch.cuda of tests/fake_cuda.py; the real thing: tests/test_runtime_cuda.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

import ios_ray
from ios_ray.app.search import planning
from ios_ray.app.search.api import SearchResult
from ios_ray.app.search.progress import SilentProgress
from ios_ray.dtypes import MEMORY_FORMATS
from ios_ray.errors import UserError
from ios_ray.frontend import import_module
from ios_ray.frontend.activations import ACTIVATIONS, activation_fn, activation_text
from ios_ray.ir import Graph
from ios_ray.profiler.fingerprint import cpu_info, fingerprint_of
from ios_ray.paired import least_rounds
from ios_ray.profiler.jobs import local_identity
from ios_ray.runtime import Program, ScheduleRunner, ScheduledModule
from ios_ray.runtime.kernels import (AsTheyCome, CudnnConvRelu, InGraphFormat, OneDnnConv, OneDnnLinear,
                                     activation_layout, conv_binder, folded, layout_free, linear_binder, onednn_fuses)
from ios_ray.runtime.units import CodeCall, Dense, Epilogue, FoldedConv
from ios_ray.schedule import read_schedule, save_schedule, schedule_from_json
from ios_ray.scheduler import Plan
from ios_ray.store import LatencyStore
from ios_ray.vocabulary import KERNEL_VERSIONS
from tests.fake_cuda import FakeCuda
from tests.idiom_models import ResNetStyle, SplitAttention
from tests.helpers import randomise_batchnorm, relative_error
from tests.test_runtime_schedules import BUILDERS, Tiny, make_schedule, tiny

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)


def fused_and_eager(module: nn.Module, x: torch.Tensor) -> tuple[Program, Program]:
    imported = import_module(module, x[:1])
    return Program.from_imported(imported, CPU, "fused"), Program.from_imported(imported, CPU, "eager")


@pytest.mark.parametrize("strategy", list(BUILDERS))
@pytest.mark.parametrize("memory_format", ["contiguous", "channels_last"])
def test_fused_kernels_compute_what_eager_ones_do_under_every_schedule(strategy: str, memory_format: str) -> None:
    layout = MEMORY_FORMATS[memory_format]
    model, x = tiny().to(memory_format=layout), torch.randn(3, *Tiny.input_shape).contiguous(memory_format=layout)
    fused, eager = fused_and_eager(model, x)
    assert fused.layout == "channels_last" and eager.layout == memory_format
    with torch.no_grad():
        expected = model(x)
    schedule = make_schedule(fused.graph, BUILDERS[strategy], 3, kernels="fused")
    got = ScheduleRunner(fused, schedule)(x)
    assert relative_error(got, expected) <= 1e-5
    assert relative_error(fused.run(x), expected) <= 1e-5


def test_fused_kernels_bind_every_conv_to_one_onednn_call_with_its_weight_packed_once_per_input_shape(
        monkeypatch: pytest.MonkeyPatch) -> None:
    packs: list[list[int]] = []
    reorder = torch.ops.mkldnn._reorder_convolution_weight
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_convolution_weight",
                        lambda *args: packs.append(list(args[-1])) or reorder(*args))
    model, x = tiny(), torch.randn(2, *Tiny.input_shape)
    fused, _ = fused_and_eager(model, x)
    convs = [fn for fn in fused.fns.values() if folded(fn) is not None]
    assert convs and all(isinstance(fn, OneDnnConv) for fn in convs)
    runner = ScheduleRunner(fused, make_schedule(fused.graph, BUILDERS["ios_like"], 2, kernels="fused"))
    assert packs == []  # binding packs nothing: the layout oneDNN picks depends on the input's whole shape
    for batch in (5, 5, 5):
        runner(torch.randn(batch, *Tiny.input_shape))
    at_five = len(packs)
    assert 0 < at_five <= len(convs) + 1  # each conv the schedule runs (a merged one too), once
    assert {shape[0] for shape in packs} == {5}
    for batch in (2, 5, 2):
        runner(torch.randn(batch, *Tiny.input_shape))
    assert len(packs) == 2 * at_five and {shape[0] for shape in packs[at_five:]} == {2}  # batch 2: once more each


def activation_texts() -> list[str]:
    """Every activation of the vocabulary, with default and non-default parameters."""
    texts = [activation_text(name, [default for _, default in params]) for name, (_, params) in ACTIVATIONS.items()]
    return texts + ["leaky_relu(0.2)", "hardtanh(-2.0, 3.0)", "gelu('tanh')"]


#: Activations of the vocabulary that oneDNN has no post-op for: the conv runs channels-last, the activation after it.
ONEDNN_LACKS = {"mish", "elu", "softplus"}


@pytest.mark.parametrize("act", activation_texts())
def test_onednn_applies_every_activation_of_the_vocabulary_as_torch_does(act: str) -> None:
    torch.manual_seed(0)
    conv = FoldedConv(torch.randn(8, 6, 3, 3), torch.randn(8), (1, 1), (1, 1), (1, 1), 1, act=act)
    x = torch.randn(2, 6, 9, 9).contiguous(memory_format=torch.channels_last)
    fused = conv_binder("fused", CPU)(conv, (6, 9, 9))
    assert isinstance(fused, OneDnnConv) == (onednn_fuses(torch.float32) and act.partition("(")[0] not in ONEDNN_LACKS)
    assert relative_error(fused([x]), conv([x])) <= 1e-5


@pytest.mark.parametrize("act, fused_call", [(None, True), ("relu", True), ("silu", False)])
def test_a_conv_with_a_residual_sum_adds_it_inside_onednns_call_where_the_activation_after_it_allows(
        act: str | None, fused_call: bool) -> None:
    torch.manual_seed(0)
    conv = FoldedConv(torch.randn(8, 6, 3, 3), torch.randn(8), (1, 1), (1, 1), (1, 1), 1, act=act, residual=True)
    x, residual = torch.randn(2, 6, 9, 9), torch.randn(2, 8, 9, 9)
    before = residual.clone()
    expected = activation_fn(act)(F.conv2d(x, conv.weight, conv.bias, padding=1) + residual)
    fused = conv_binder("fused", CPU)(conv, (6, 9, 9))
    assert isinstance(fused, OneDnnConv) == (fused_call and onednn_fuses(torch.float32))  # oneDNN: then ReLU or none
    for pair in ([x, residual], [x.contiguous(memory_format=torch.channels_last), residual]):
        assert relative_error(fused(pair), expected) <= 1e-5
        assert relative_error(conv(pair), expected) <= 1e-5
    assert torch.equal(residual, before)  # the residual is read, never written (another unit may read it too)


@pytest.mark.parametrize("stride, padding, dilation, groups, bias", [
    ((2, 2), (0, 0), (1, 1), 1, True), ((1, 2), (2, 0), (2, 2), 1, False), ((1, 1), (1, 1), (1, 1), 6, True),
    ((2, 1), (1, 1), (1, 1), 2, False)])
def test_onednn_convs_of_every_shape_with_a_prologue_equal_eager(
        stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int], groups: int, bias: bool) -> None:
    torch.manual_seed(0)
    conv = FoldedConv(torch.randn(12, 6 // groups, 3, 3), torch.randn(12) if bias else None, stride, padding, dilation,
                      groups, act="relu", pre_act="relu", pre_scale=torch.rand(1, 6, 1, 1) + 0.5,
                      pre_shift=torch.randn(1, 6, 1, 1))
    fused = conv_binder("fused", CPU)(conv, (6, 11, 11))
    for x in (torch.randn(3, 6, 11, 11), torch.randn(1, 6, 13, 7).contiguous(memory_format=torch.channels_last),
              torch.randn(2, 8, 11, 11)[:, 1:7]):  # NCHW, NHWC of another size, a channel slice (a view)
        assert relative_error(fused([x]), conv([x])) <= 1e-5


@pytest.mark.parametrize("dtype, tolerance", [(torch.bfloat16, 3e-2), (torch.float16, 1e-2)])
def test_fused_kernels_in_half_precision_equal_eager_within_its_rounding(dtype: torch.dtype, tolerance: float) -> None:
    model, x = tiny().to(dtype), torch.randn(2, *Tiny.input_shape, dtype=dtype)
    fused, eager = fused_and_eager(model, x)
    assert all(isinstance(fn, OneDnnConv) == onednn_fuses(dtype) for fn in fused.fns.values() if folded(fn))
    assert relative_error(fused.run(x), eager.run(x)) <= tolerance


class ViewsAFeatureMap(nn.Module):
    """A head that reads a 4x4 feature map as 8 rows of 16 with ``view``, which only an NCHW tensor allows."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        return self.fc(y.view(y.size(0), 8, 16))


@torch.fx.wrap
def first_channel_rows(x: torch.Tensor) -> torch.Tensor:
    """An extension-like kernel that reads memory as NCHW: channel 0 of each sample, as its strides say it lies."""
    return torch.as_strided(x, (x.shape[0], x.shape[2] * x.shape[3]), (x.stride(0), 1)).clone()


class ReadsMemoryAsNchw(nn.Module):
    """A model whose own function assumes its input is laid out NCHW (wrong, silently, on a channels-last one)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return first_channel_rows(torch.relu(self.conv(x)))


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: a depthwise conv, then channels-last (a permute) a LayerNorm, two linear layers with a GELU
    between, a permute back and a layer scale, added to the block's input."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.depthwise = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels)
        self.up, self.act, self.down = nn.Linear(channels, 4 * channels), nn.GELU(), nn.Linear(4 * channels, channels)
        self.gamma = nn.Parameter(torch.rand(channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.norm(self.depthwise(x).permute(0, 2, 3, 1))
        y = self.down(self.act(self.up(y))).permute(0, 3, 1, 2)
        return x + self.gamma * y


@pytest.mark.parametrize("model", [ViewsAFeatureMap(), ConvNeXtBlock()], ids=["view", "convnext"])
def test_the_models_code_of_torchs_own_ops_takes_channels_last_inputs_as_they_come(model: nn.Module) -> None:
    x = torch.randn(2, 3, 4, 4) if isinstance(model, ViewsAFeatureMap) else torch.randn(2, 3, 9, 9)
    fused, _ = fused_and_eager(model.eval(), x)
    opaque = [u.id for u in fused.graph.units if u.kind == "opaque"]
    assert opaque and all(isinstance(fused.fns[u], AsTheyCome) and layout_free(fused.fns[u].body) for u in opaque)
    with torch.no_grad():
        assert relative_error(fused.run(x), model(x)) <= 1e-5


class Patches(nn.Module):
    """MobileViT's unfold: a feature map cut into 2x2 patches, (B, C, H, W) -> (B, 4, H * W / 4, C), a 4-D view
    with its dimensions permuted, read twice by the attention-like code after it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.shape
        patches = y.reshape(b * c * h // 2, 2, w // 2, 2).transpose(1, 2).reshape(b, c, -1, 4).transpose(1, 3)
        mixed = patches + self.norm(patches).softmax(-1)
        return mixed.mean((1, 2))


def test_a_permuted_view_that_the_models_code_returns_reaches_the_code_after_it_in_the_graphs_format() -> None:
    model, x = Patches().eval(), torch.randn(2, 3, 8, 8)
    fused, _ = fused_and_eager(model, x)
    as_they_come = [fused.fns[u.id] for u in fused.graph.units if isinstance(fused.fns[u.id], AsTheyCome)]
    assert len(as_they_come) >= 2  # the unfold, and the code that reads its patches
    with torch.no_grad():
        assert relative_error(fused.run(x), model(x)) <= 1e-5
    seen: list[torch.Tensor] = []
    unit = AsTheyCome(lambda inputs: seen.extend(inputs) or inputs[0], "channels_last", "contiguous")
    nhwc, nchw = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last), torch.randn(2, 8, 4, 4)
    view, rows = torch.randn(2, 4, 8, 4).transpose(1, 3), torch.randn(2, 4, 8).transpose(1, 2)
    unit([nhwc, nchw, view, rows])
    assert seen[0] is nhwc and seen[1] is nchw and seen[3] is rows  # laid out as the program or graph holds them
    assert seen[2].is_contiguous() and torch.equal(seen[2], view)  # a permuted view: copied, once, in NCHW


def test_the_models_own_function_takes_its_inputs_in_the_graphs_format() -> None:
    model, x = ReadsMemoryAsNchw().eval(), torch.randn(2, 3, 5, 5)
    fused, _ = fused_and_eager(model, x)
    opaque = [u.id for u in fused.graph.units if u.kind == "opaque"]
    assert opaque and all(isinstance(fused.fns[u], InGraphFormat) for u in opaque)
    with torch.no_grad():
        assert relative_error(fused.run(x), model(x)) <= 1e-5


@pytest.mark.parametrize("stacked", [True, False], ids=["stack", "reshape"])
def test_code_that_makes_a_five_dimensional_tensor_takes_its_inputs_in_the_graphs_format(stacked: bool) -> None:
    # the paths' largest value too, besides their sums: the import keeps the paths as one five-dimensional tensor
    model, x = SplitAttention(stacked, largest_too=True).eval(), torch.randn(2, 3, 6, 6)
    fused, _ = fused_and_eager(model, x)
    opaque = {u.id: u for u in fused.graph.units if u.kind == "opaque"}
    five = [u for u in opaque if len(opaque[u].shape) == 4]  # per sample: five with the batch
    code = {u: fn.body if isinstance(fn, (InGraphFormat, AsTheyCome)) else fn for u, fn in fused.fns.items()
            if u in opaque}
    assert five and all(layout_free(fn) for fn in code.values())  # torch's own ops, every one
    assert all(isinstance(fused.fns[u], InGraphFormat) == (u in five) for u in opaque)
    with torch.no_grad():
        assert relative_error(fused.run(x), model(x)) <= 1e-5
        for u in five:  # the split tensor reaches the sums over its paths as torch's NCHW code would make it
            inputs = [torch.randn(2, *fused.graph.unit(s).shape).contiguous(memory_format=torch.channels_last)
                      for s in opaque[u].sources]
            assert fused.fns[u](inputs).is_contiguous()


def test_code_is_layout_free_only_where_every_step_is_torchs_own_and_reads_values_alone() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    permuted = graph.call_function(torch.ops.aten.permute.default, (x, [0, 2, 3, 1]))
    norm = graph.call_module("norm", (permuted,))
    aten_view = graph.call_function(torch.ops.aten.view.default, (permuted, [-1]))
    method_view, strides = graph.call_method("view", (x, -1)), graph.call_method("stride", (x,))
    own = graph.call_function(first_channel_rows, (x,))
    custom = graph.call_module("custom", (x,))
    root = nn.Module()
    root.norm, root.custom = nn.LayerNorm(4), ConvNeXtBlock()  # a torch layer; a model's own module
    module = fx.GraphModule(root, graph)

    def code(*nodes: fx.Node) -> CodeCall:  # its inputs: what its nodes read and do not compute
        return CodeCall(nodes, module, tuple(dict.fromkeys(n.name for node in nodes for n in node.all_input_nodes
                                                           if n not in nodes)), {})
    assert layout_free(code(permuted, norm)) and layout_free(Epilogue(code(permuted), (code(norm),)))
    for reader in (aten_view, method_view, strides, own, custom):
        assert not layout_free(code(permuted, reader)) and not layout_free(Epilogue(code(permuted), (code(reader),)))
    assert not layout_free(Dense(torch.randn(2, 2), None))  # not the model's code at all


@pytest.mark.parametrize("act", [None, *activation_texts()])
def test_onednn_runs_a_linear_layer_and_its_activation_as_torch_does_packed_once_per_row_count(
        act: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    packs: list[int] = []
    reorder = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight",
                        lambda weight, rows: packs.append(rows) or reorder(weight, rows))
    torch.manual_seed(0)
    layer = Dense(torch.randn(12, 6), torch.randn(12), act)
    fused = linear_binder("fused", CPU)(layer, (6,))
    in_onednn = onednn_fuses(torch.float32) and (act or "").partition("(")[0] not in ONEDNN_LACKS
    assert isinstance(fused, OneDnnLinear) == in_onednn
    for x in (torch.randn(5, 6), torch.randn(2, 3, 4, 6), torch.randn(2, 6, 3, 4).permute(0, 2, 3, 1),
              torch.randn(5, 6)):  # rows 5, 24, 24 (a permuted view), 5 again
        assert relative_error(fused([x]), activation_fn(act)(F.linear(x, layer.weight, layer.bias))) <= 1e-5
    assert packs == ([5, 24] if in_onednn else [])


def test_a_linear_layers_activation_leaves_its_epilogue_for_the_kernels_and_float64_keeps_torchs_linear() -> None:
    model, x = ConvNeXtBlock().eval(), torch.randn(2, 3, 9, 9)
    for dtype in (torch.float32, torch.float64):
        fused, eager = fused_and_eager(model.to(dtype), x.to(dtype))
        up = fused.fns["up"]
        assert isinstance(up, OneDnnLinear) == (dtype == torch.float32 and onednn_fuses(dtype))
        plain = eager.fns["up"]
        assert getattr(up, "layer", up).act == "gelu" and isinstance(plain, Dense) and plain.act == "gelu"
        assert not any(isinstance(fn, Epilogue) for fn in (up, plain))  # the GELU was the epilogue's only step
        with torch.no_grad():
            assert relative_error(fused.run(x.to(dtype)), model(x.to(dtype))) <= 1e-5
            assert relative_error(eager.run(x.to(dtype)), model(x.to(dtype))) <= 1e-12


class Segmenter(nn.Module):
    """A model whose output is a feature map (as a segmentation model's is)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("kernels", ["fused", "inductor"])
def test_a_deployed_schedule_holding_activations_channels_last_returns_what_the_model_does_in_its_layout(
        kernels: str) -> None:
    model, x = Segmenter().eval(), torch.randn(2, 3, 8, 8)
    graph = import_module(model, x[:1]).graph
    assert activation_layout(kernels, graph.memory_format) == "channels_last" != graph.memory_format
    assert activation_layout("eager", graph.memory_format) == graph.memory_format
    scheduled = ScheduledModule(model, [make_schedule(graph, BUILDERS["sequential"], 2, kernels=kernels)])
    with torch.no_grad():
        got, expected = scheduled(x), model(x)
    assert relative_error(got, expected) <= 1e-5
    assert got.is_contiguous() and got.view(2, -1).shape == (2, 128)  # NCHW, as eager returns it


def test_kernels_change_the_device_fingerprint_and_eager_keeps_the_old_one() -> None:
    info = cpu_info()
    identity = local_identity("cpu", fingerprint_of(info), info, "measured")
    fused = identity.running("fused")
    assert fused.fingerprint != identity.fingerprint and fused.info["kernels"] == fused.kernels == "fused"
    assert identity.running("eager") == identity and "kernels" not in identity.running("eager").info
    assert fused.running("eager").fingerprint == identity.fingerprint
    # rows measured with an earlier implementation of the fused kernels (the first had no version) are not reused
    assert fused.info["kernels_version"] == KERNEL_VERSIONS["fused"] >= 4
    first = {k: v for k, v in fused.info.items() if k != "kernels_version"}
    earlier = {**fused.info, "kernels_version": KERNEL_VERSIONS["fused"] - 1}
    assert len({fingerprint_of(first), fingerprint_of(earlier), fused.fingerprint}) == 3
    assert fused.fingerprint == fused.running("fused").fingerprint
    # inductor's activations were held in the graph's format before version 2
    inductor = identity.running("inductor")
    assert inductor.info["kernels_version"] == KERNEL_VERSIONS["inductor"] >= 2 and inductor.fingerprint not in (
        fused.fingerprint, fingerprint_of({k: v for k, v in inductor.info.items() if k != "kernels_version"}))


def test_a_schedule_file_records_its_kernels_and_older_files_are_eager(tmp_path: Path) -> None:
    schedule = make_schedule(import_module(tiny(), torch.randn(1, *Tiny.input_shape)).graph, BUILDERS["greedy"], 1,
                             kernels="fused")
    save_schedule(schedule, tmp_path / "s.json")
    assert read_schedule(tmp_path / "s.json").kernels == "fused"
    older = schedule.to_json()
    del older["kernels"]
    assert schedule_from_json(older).kernels == "eager"
    assert schedule_from_json({**older, "kernels": "inductor"}).kernels == "inductor"
    with pytest.raises(ValueError, match='kernels is "tensorrt", not one of eager, fused, inductor'):
        schedule_from_json({**older, "kernels": "tensorrt"})


def test_unknown_kernels_are_refused_in_one_sentence() -> None:
    with pytest.raises(UserError, match="kernels must be one of eager, fused, inductor, not 'turbo'"):
        activation_layout("turbo", "contiguous")


def test_on_a_gpu_fused_kernels_run_cudnns_fused_relu_inside_captures_and_side_streams(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda().install(monkeypatch)
    calls: list[bool] = []

    def cudnn_convolution_relu(x, weight, bias, stride, padding, dilation, groups):  # noqa: ANN001, ANN202
        assert weight.is_contiguous(memory_format=torch.channels_last)
        calls.append(cuda.capturing is not None)
        cuda.launch(0.01)
        return F.relu(F.conv2d(x, weight, bias, stride, padding, dilation, groups))

    monkeypatch.setattr(torch, "cudnn_convolution_relu", cudnn_convolution_relu)
    model, x = tiny(), torch.randn(2, *Tiny.input_shape)
    cpu = Program.from_imported(import_module(model, x[:1]), CPU, "eager")
    bind = conv_binder("fused", CUDA)
    fns = {u.id: bind(fn, cpu.graph.value_shape(u.inputs[0])) if isinstance(fn := cpu.fns[u.id], FoldedConv) else fn
           for u in cpu.graph.units}
    relu_convs = [u.id for u in cpu.graph.units if u.kind == "conv" and u.attrs["act"] == "relu"]
    assert relu_convs and all(isinstance(fns[u], CudnnConvRelu) for u in relu_convs)
    assert all(fns[u].weight.is_contiguous(memory_format=torch.channels_last) for u in cpu.fns
               if isinstance(fns[u], FoldedConv))  # the others: torch's conv, channels-last
    program = Program(cpu.graph, fns, CUDA, "fused")
    runner = ScheduleRunner(program, make_schedule(program.graph, BUILDERS["ios_like"], 2, kernels="fused"), CUDA,
                            cuda_graph=True)
    assert runner.captured is not None
    with torch.no_grad():
        got = runner.captured(x)  # the fake device runs nothing: the tensors stay on the CPU
        expected = model(x)
    assert relative_error(got, expected) <= 1e-5
    assert calls.count(True) == len(relu_convs) and [g.captured for g in cuda.graphs] == [True]


def test_on_a_gpu_a_residual_sum_and_its_relu_run_inside_cudnns_fused_convolution(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda().install(monkeypatch)
    calls: list[bool] = []

    def cudnn_convolution_add_relu(x, weight, z, alpha, bias, stride, padding, dilation, groups):  # noqa: ANN001, ANN202
        assert weight.is_contiguous(memory_format=torch.channels_last) and alpha == 1.0
        calls.append(cuda.capturing is not None)
        cuda.launch(0.01)
        return F.relu(F.conv2d(x, weight, bias, stride, padding, dilation, groups) + alpha * z)

    monkeypatch.setattr(torch, "cudnn_convolution_add_relu", cudnn_convolution_add_relu)
    monkeypatch.setattr(torch, "cudnn_convolution_relu", lambda x, w, b, *geometry: F.relu(F.conv2d(x, w, b, *geometry)))
    model = randomise_batchnorm(ResNetStyle()).eval()
    x = torch.randn(2, 3, 32, 32)
    cpu = Program.from_imported(import_module(model, x[:1]), CPU, "eager")
    bind = conv_binder("fused", CUDA)
    fns = {u.id: bind(fn, cpu.graph.value_shape(u.inputs[0])) if isinstance(fn := cpu.fns[u.id], FoldedConv) else fn
           for u in cpu.graph.units}
    residual = [u.id for u in cpu.graph.units if u.attrs.get("residual")]
    assert residual and all(isinstance(fns[u], CudnnConvRelu) for u in residual)
    program = Program(cpu.graph, fns, CUDA, "fused")
    runner = ScheduleRunner(program, make_schedule(program.graph, BUILDERS["sequential"], 2, kernels="fused"), CUDA,
                            cuda_graph=True)
    with torch.no_grad():
        got = runner.captured(x)  # type: ignore[misc]  # the fake device runs nothing: the tensors stay on the CPU
        expected = model(x)
    assert relative_error(got, expected) <= 1e-5
    assert calls.count(True) == len(residual)  # each captured once (and run uncaptured while the capture warms up)


def search_tiny(store: Path, kernels: str, devices: tuple[str, ...] = ("cpu",),
                progress: SilentProgress | bool = False) -> SearchResult:
    """A quick search of the tiny model at batch 2 with the given kernels."""
    return ios_ray.search(tiny(), list(devices), [2], input_shape=Tiny.input_shape, store=store, kernels=kernels,
                          warmup=0, repeat=2, check_rounds=least_rounds(), progress=progress)


def test_stages_run_with_other_kernels_are_other_measurements(ray_local: None, tmp_path: Path) -> None:
    store = tmp_path / "store.duckdb"
    fused = search_tiny(store, "fused")["cpu", 2]
    assert fused.schedule.kernels == "fused" and fused.schedule.params["kernels"]["how"] == "given"
    assert fused.schedule.device_info["kernels"] == "fused" and fused.measured > 0
    eager = search_tiny(store, "eager")["cpu", 2]
    assert eager.schedule.kernels == "eager" and eager.cached == 0 and eager.measured > 0  # nothing mixed
    assert eager.schedule.device_fingerprint != fused.schedule.device_fingerprint
    rows = LatencyStore(store, create=False).query(device="cpu")
    assert set(rows.column("device_fingerprint").to_pylist()) == {eager.schedule.device_fingerprint,
                                                                  fused.schedule.device_fingerprint}
    again = search_tiny(store, "fused")["cpu", 2]
    assert again.cached == fused.measured  # each kernels' rows are reused by their own
    # (the first check's runs fitted a correction, whose costs may ask for stages the first search did not need)
    rows = LatencyStore(store, create=False).query(device="cpu")
    assert rows.num_rows == fused.measured + eager.measured + again.measured  # none measured twice


def test_a_resnet_searched_with_fused_kernels_deploys_its_residual_convs_and_equals_eager(
        ray_local: None, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = randomise_batchnorm(ResNetStyle()).eval()
    result = ios_ray.search(model, ["cpu"], [2], input_shape=(3, 32, 32), store=tmp_path / "store.duckdb",
                            kernels="fused", warmup=0, repeat=2, check_rounds=least_rounds(), progress=False)
    schedule = result["cpu", 2].schedule
    graph = import_module(model, torch.randn(1, 3, 32, 32)).graph
    assert graph.fingerprint == schedule.graph_fingerprint and schedule.kernels == "fused"
    assert sum(1 for unit in graph.units if unit.attrs.get("residual")) == 2  # the stages measured and deployed
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert relative_error(result.deploy(model)(x), model(x)) <= 1e-5


def test_auto_kernels_are_chosen_by_timing_the_sequential_schedule_whole(ray_local: None, tmp_path: Path) -> None:
    outcome = search_tiny(tmp_path / "store.duckdb", "auto")["cpu", 2]
    choice = outcome.schedule.params["kernels"]
    assert choice["how"] == "measured"
    fused, inductor = choice["timed"]  # in turns: fused against eager, then inductor against the one kept
    assert (fused["kernels"], fused["versus"]) == ("fused", "eager") and inductor["kernels"] == "inductor"
    kept = "fused" if fused["ratio_high"] is not None and fused["ratio_high"] < 1 else "eager"
    assert inductor["versus"] == kept  # a challenger is kept only where faster beyond noise
    kept = "inductor" if inductor["ratio_high"] is not None and inductor["ratio_high"] < 1 else kept
    assert outcome.schedule.kernels == choice["kernels"] == kept
    for turn in (fused, inductor):
        assert turn["rounds"] >= least_rounds() and turn["ratio_low"] <= turn["ratio"] <= turn["ratio_high"]
        assert turn["kernels_ms"] > 0 and turn["versus_ms"] > 0
    assert "compiled" not in fused and inductor["compiled"]["seconds"] > 0  # inductor's regions, before its rounds
    assert inductor["compiled"]["regions"] == 1  # the sequential schedule: one region
    assert outcome.kernels.startswith(f"{kept} kernels: measured; fused / eager ")
    assert f"inductor / {inductor['versus']} " in outcome.kernels


def test_auto_takes_the_kernels_whose_units_alone_the_store_holds_without_timing_them(
        ray_local: None, tmp_path: Path) -> None:
    store = tmp_path / "store.duckdb"
    search_tiny(store, "fused")
    again = search_tiny(store, "auto")["cpu", 2]
    units = len(import_module(tiny(), torch.randn(1, *Tiny.input_shape)).graph.units)
    assert again.schedule.kernels == "fused" and again.schedule.params["kernels"] == {
        "kernels": "fused", "how": f"as before: the store holds {units} of the model's units measured alone with them",
        "decision": f"fused kernels: as before: the store holds {units} of the model's units measured alone with them"}


class KernelsTimed(SilentProgress):
    """Says when the search begins timing kernels (:attr:`timing`), and remembers what it said."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.timing = threading.Event()

    def choosing_kernels(self, device: str, batch: int) -> None:
        self.events.append("choosing kernels")
        self.timing.set()

    def planned(self, graph: Graph, plan: Plan) -> None:
        self.events.append("planned")


def test_a_search_imports_and_plans_on_a_thread_while_its_device_starts_and_times_the_kernels(
        ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: dict[str, str] = {}
    timed_meanwhile: list[bool] = []
    progress = KernelsTimed()

    def import_model(*args: Any, **kwargs: Any) -> Any:
        threads["import"] = threading.current_thread().name
        return ios_ray.frontend.import_model(*args, **kwargs)

    class WaitingLazy(planning.Lazy):
        def __init__(self, *args: Any) -> None:
            threads["plan"] = threading.current_thread().name
            timed_meanwhile.append(progress.timing.wait(timeout=60))  # a plan in the way would wait here in vain
            super().__init__(*args)

    monkeypatch.setattr(planning, "plans_during_kernels", lambda plan: True)  # as where no device is a CPU
    monkeypatch.setattr(planning, "import_model", import_model)
    monkeypatch.setattr(planning, "Lazy", WaitingLazy)
    outcome = search_tiny(tmp_path / "store.duckdb", "auto", progress=progress)["cpu", 2]
    assert threads == {"import": "ios-ray planning", "plan": "ios-ray planning"} and timed_meanwhile == [True]
    assert progress.events == ["choosing kernels", "planned"] and outcome.kernels.startswith(
        f"{outcome.schedule.kernels} kernels: measured; ")
    assert outcome.measured > 0 and outcome.schedule.params["measure"]["mode"] == "lazy"


def test_a_search_whose_planning_fails_on_its_thread_says_why(
        ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> None:
        raise UserError("no plan for this model.")

    monkeypatch.setattr(planning, "plans_during_kernels", lambda plan: True)
    monkeypatch.setattr(planning, "Lazy", refuse)
    with pytest.raises(UserError, match="no plan for this model"):
        search_tiny(tmp_path / "store.duckdb", "eager")
    planners = [thread for thread in threading.enumerate() if thread.name == "ios-ray planning"]
    for thread in planners:  # one may still be returning from the failure it handed over
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in planners)


def test_on_a_sim_device_auto_is_eager_and_named_kernels_are_kept(ray_local: None, tmp_path: Path) -> None:
    store = tmp_path / "store.duckdb"
    auto = search_tiny(store, "auto", ("sim:v100",))["sim:v100", 2]
    assert auto.schedule.kernels == "eager" and auto.schedule.params["kernels"]["how"] == "simulated"
    named = search_tiny(store, "fused", ("sim:v100",))["sim:v100", 2]
    assert named.schedule.kernels == "fused" and named.schedule.source == "simulated"
    assert named.schedule.device_fingerprint != auto.schedule.device_fingerprint


def test_a_search_refuses_unknown_kernels_in_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="kernels must be one of auto, eager, fused, inductor, not 'fast'"):
        search_tiny(tmp_path / "store.duckdb", "fast")
