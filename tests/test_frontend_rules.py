"""The frontend's rules one at a time, on small modules: each rewrite pass, each pattern, epilogues and prologues.

Every test runs twice, once on the graph torch.export captures and once on a torch.fx trace (the fallback where
export fails): every rule holds on both. Every import is also run unit by unit (``Program.run``) against the module
itself at batch 1 and 4, so a rule that groups nodes wrongly fails on values, not only on counts.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ios_ray import ImportRefused
from ios_ray.frontend import Imported, capture_forward, import_module, opaque_report
from ios_ray.frontend.activations import activation_fn
from ios_ray.frontend.rewrites import drop_eval_identities, functionalize
from ios_ray.runtime import Program
from tests.helpers import randomise_batchnorm, relative_error
from tests.idiom_models import DropPath, SplitAttention, StochasticDepth, channel_shuffle

SHAPE = (8, 6, 6)
CAPTURE = {"method": "export"}


@pytest.fixture(autouse=True, params=("export", "fx"))
def capture(request: pytest.FixtureRequest) -> str:
    """How every import of the test captures the forward: torch.export, or the torch.fx fallback."""
    CAPTURE["method"] = request.param
    return request.param


def scale(x: torch.Tensor, factor: float, inplace: bool = False) -> torch.Tensor:
    """``x`` times ``factor``, written into ``x`` where told to: a function the torch.fx trace keeps as one call (as
    it keeps timm's activations), which then takes ``inplace`` by position."""
    return x.mul_(factor) if inplace else x * factor


fx.wrap("scale")


class Lambda(nn.Module):
    """A module whose forward is ``fn(self, x)``, with a conv ``c``, a second conv ``d`` and a batch-norm ``bn``."""

    def __init__(self, fn: Callable[..., torch.Tensor], channels: int = 8) -> None:
        super().__init__()
        self.fn = fn
        self.c = nn.Conv2d(channels, channels, 3, padding=1)
        self.d = nn.Conv2d(channels, channels, 1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self, x)


class Apply(nn.Module):
    """A function as a module (traced through)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def imported(module: nn.Module, shape: tuple[int, ...] = SHAPE) -> Imported:
    """Import ``module`` and check that unit-by-unit execution equals it at batch 1 and 4."""
    torch.manual_seed(0)
    module = randomise_batchnorm(module)
    result = import_module(module, torch.randn(1, *shape), capture=CAPTURE["method"])
    program = Program.from_imported(result)
    for batch in (1, 4):
        x = torch.randn(batch, *shape)
        with torch.no_grad():
            assert relative_error(program.run(x), module(x.clone())) <= 1e-5
    return result


def captured(module: nn.Module, shape: tuple[int, ...] = SHAPE) -> fx.GraphModule:
    """The module's forward as the rewrite passes receive it, from the capture the test runs with."""
    return capture_forward(module.eval(), torch.randn(1, *shape), "module", CAPTURE["method"])[0]


def kinds(result: Imported) -> Counter:
    return Counter(u.kind for u in result.graph.units)


# ---------------------------------------------------------------------------------------------------- rewrites


def test_functionalize_makes_in_place_ops_out_of_place_and_keeps_eager_values() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        y.add_(1.0)
        z = m.relu(y)         # nn.ReLU(inplace=True): later readers of y see the result
        return F.relu(x, inplace=True) + y * 2 + scale(z, 2.0, True)   # inplace by keyword, by position
    module = Lambda(fn)
    module.relu = nn.ReLU(inplace=True)
    gm = functionalize(captured(module))
    assert not any(n.kwargs.get("inplace") or any(a is True for a in n.args) or str(n.target).endswith("_")
                   for n in gm.graph.nodes)
    assert module.relu.inplace, "the user's module is never changed"
    imported(module)


def test_eval_identities_vanish() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        x = m.drop(m.alpha(m.ident(m.c(x))))
        x = F.dropout(x, 0.5, training=False) + F.dropout2d(x, 0.3, m.training)
        x = m.depth(m.path(x.contiguous()))
        return x
    module = Lambda(fn)
    module.drop, module.alpha, module.ident = nn.Dropout2d(0.5), nn.AlphaDropout(0.2), nn.Identity()
    module.depth, module.path = StochasticDepth(0.3), DropPath(0.3)
    gm = drop_eval_identities(captured(module))
    left = {str(n.target) for n in gm.graph.nodes}
    assert not any(word in name for name in left for word in ("drop", "alpha", "ident", "depth", "path",
                                                              "contiguous")), left


def test_training_dropout_is_not_an_identity() -> None:
    gm = drop_eval_identities(captured(Lambda(lambda m, x: F.dropout(m.c(x), 0.5))))
    assert any(n.target in (F.dropout, torch.ops.aten.dropout.default) for n in gm.graph.nodes)


def test_sizes_fold_into_literals_but_the_batch_size_stays(capture: str) -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.size()
        y = m.c(x).reshape(b, 2, c // 2, h * w).sum(2)     # opaque: reads the batch size
        return y.view(y.size(0), -1) + x.shape[1] * 0
    result = imported(Lambda(fn))
    assert kinds(result) == Counter({"conv": 1, "opaque": 1, "flatten": 1}), "no unit is a size computation"
    reshape = next(u for u in result.graph.units if u.kind == "opaque")
    # export reads the batch size as x.size(0), a trace as it is written: item 0 of x.size()
    batch = "size(tensor(8, 6, 6), 0)" if capture == "export" else "getitem(size(tensor(8, 6, 6)), 0)"
    assert reshape.attrs["args"] == f"(('x', {batch}, 2, 4, 36), {{}})"


# ------------------------------------------------------------------------------------------------- activations

SPELLINGS: dict[str, list[Callable[[torch.Tensor], torch.Tensor]]] = {
    "relu": [nn.ReLU(), nn.ReLU(inplace=True), F.relu, lambda x: F.relu(x, inplace=True), torch.relu,
             lambda x: x.relu(), lambda x: x.relu_()],
    "relu6": [nn.ReLU6(inplace=True), F.relu6, lambda x: F.hardtanh(x, 0.0, 6.0)],
    "leaky_relu(0.2)": [nn.LeakyReLU(0.2, inplace=True), lambda x: F.leaky_relu(x, 0.2)],
    "hardtanh(-2.0, 2.0)": [nn.Hardtanh(-2, 2), lambda x: F.hardtanh(x, -2.0, 2.0)],
    "hardswish": [nn.Hardswish(inplace=True), F.hardswish],
    "hardsigmoid": [nn.Hardsigmoid(), lambda x: F.hardsigmoid(x, inplace=True)],
    "silu": [nn.SiLU(inplace=True), F.silu],
    "sigmoid": [nn.Sigmoid(), torch.sigmoid, lambda x: x.sigmoid()],
    "gelu('tanh')": [nn.GELU(approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")],
    "tanh": [nn.Tanh(), torch.tanh, lambda x: x.tanh()],
    "mish": [nn.Mish(inplace=True), F.mish],
    "elu(0.5)": [nn.ELU(0.5), lambda x: F.elu(x, 0.5)],
    "softplus(2.0, 20.0)": [nn.Softplus(beta=2.0), lambda x: F.softplus(x, beta=2)],
}


@pytest.mark.parametrize("text, spelling", [(t, s) for t, spellings in SPELLINGS.items() for s in spellings])
def test_every_spelling_of_an_activation_fuses_into_the_conv(text: str, spelling: Callable) -> None:
    module = Lambda(lambda m, x: m.act(m.bn(m.c(x))))
    module.act = spelling if isinstance(spelling, nn.Module) else Apply(spelling)
    result = imported(module)
    assert [(u.kind, u.attrs["act"]) for u in result.graph.units] == [("conv", text)]
    assert activation_fn(text)(torch.tensor([-3.0, 0.5])).shape == (2,)


def test_a_residual_sum_and_its_activation_are_the_convs_where_its_input_came_from_the_tensor_added() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        out = m.bn(m.c(torch.sigmoid(x)))
        out += x                    # c's input came from x: the sum and the ReLU after it are c's
        out = F.relu(out, inplace=True)
        return m.d(torch.sigmoid(out)) + out    # d's input came from out: this sum is d's too (no activation)
    result = imported(Lambda(fn))
    assert [(u.id, u.kind, u.attrs.get("residual"), u.attrs["act"], len(u.inputs)) for u in result.graph.units] == [
        ("c", "conv", True, "relu", 2), ("d", "conv", True, None, 2)]
    assert result.graph.unit("d").inputs[1] == result.graph.unit("d").inputs[0]  # the same tensor, twice


def test_activation_after_a_sum_of_two_branches_fuses_into_the_add() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        return F.relu(m.bn(m.c(x)) + m.d(torch.sigmoid(x)))  # neither conv's input came from the other's output
    result = imported(Lambda(fn))
    add = [u for u in result.graph.units if u.kind == "add"]
    assert add[0].attrs["epilogue"] == ("relu",) and kinds(result)["opaque"] == 0
    assert not any(u.attrs.get("residual") for u in result.graph.units)


def test_activation_read_by_one_conv_is_its_pre_activation() -> None:
    result = imported(Lambda(lambda m, x: m.d(torch.relu(m.c(x) + torch.sigmoid(x)))))  # a sum of two branches
    assert [u.attrs["pre_act"] for u in result.graph.units if u.id == "d"] == ["relu"]
    result = imported(Lambda(lambda m, x: m.d(torch.relu(m.c(m.bn(x)) + x))))  # a residual sum: c's, with the ReLU
    assert [(u.id, u.attrs["act"], u.attrs["pre_act"]) for u in result.graph.units] == [("c", "relu", None),
                                                                                       ("d", None, None)]


# ----------------------------------------------------------------------------------- epilogues and prologues


def test_elementwise_chain_read_by_one_unit_is_its_epilogue() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = F.avg_pool2d(m.c(x), 3, 1, 1)
        return torch.clamp(F.relu6(y + 3.0) / 6.0 * m.gamma, 0.0, 1.0)
    module = Lambda(fn)
    module.gamma = nn.Parameter(torch.rand(8, 1, 1))
    result = imported(module)
    pool = next(u for u in result.graph.units if u.kind == "pool")
    assert pool.attrs["epilogue"] == ("add(x, 3.0)", "relu6", "div(x, 6.0)", "mul(x, const(8, 1, 1))",
                                      "clamp(x, 0.0, 1.0)")
    assert len(result.graph.units) == 2


def test_activation_of_a_tensor_read_elsewhere_is_an_elementwise_unit() -> None:
    result = imported(Lambda(lambda m, x: m.c(x) + F.silu(x)))
    assert kinds(result)["elementwise"] == 1 and kinds(result)["opaque"] == 0


def test_pre_activation_batch_norm_is_the_convs_prologue() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([x, m.c(x)], 1)
        return m.conv(F.relu(m.norm(y)))
    module = Lambda(fn)
    module.norm, module.conv = nn.BatchNorm2d(16), nn.Conv2d(16, 8, 3, padding=1)
    result = imported(module)
    conv = result.graph.unit("conv")
    assert conv.attrs["pre_norm"] is True and conv.attrs["pre_act"] == "relu" and len(conv.inputs[0].parts) == 2
    assert len(result.graph.units) == 2


def test_batch_norm_read_by_two_convs_is_no_prologue() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.bn(x)
        return torch.cat([m.c(y), m.d(y)], 1)
    result = imported(Lambda(fn))
    assert not any("pre_norm" in u.attrs for u in result.graph.units)
    assert kinds(result)["elementwise"] == 1


def test_functional_batch_norm_folds_like_the_module() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = F.batch_norm(m.c(x), m.bn.running_mean, m.bn.running_var, m.bn.weight, m.bn.bias, False, 0.1, 1e-3)
        return F.silu(y)
    result = imported(Lambda(fn))
    assert [(u.kind, u.attrs["act"], "bn" in u.refs) for u in result.graph.units] == [("conv", "silu", True)]


SCALINGS: list[Callable[[torch.Tensor], torch.Tensor]] = [
    lambda x: x * 0.5, lambda x: 0.5 * x, lambda x: x.mul(0.5), lambda x: torch.mul(x, 0.5), lambda x: x / 2,
    lambda x: x.mul_(0.5)]


@pytest.mark.parametrize("spelling", SCALINGS)
def test_multiplies_by_a_number_before_and_after_a_conv_fold_into_its_weights(spelling: Callable) -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(spelling(F.relu(x)))                    # c: its pre-activation, then the multiply
        return F.relu(spelling(m.bn(m.d(y))) + x)       # d: after its batch-norm; the sum after it is d's too
    result = imported(Lambda(fn))
    assert [(u.id, u.attrs.get("in_scale"), u.attrs.get("out_scale"), u.attrs["pre_act"], u.attrs.get("residual"),
             u.attrs["act"]) for u in result.graph.units] == [("c", 0.5, None, "relu", None, None),
                                                              ("d", None, 0.5, None, True, "relu")]


@pytest.mark.parametrize("fn", [
    lambda m, x: m.c(x) * 100.0,                            # beyond what the weights absorb: a step
    lambda m, x: m.c(x) * m.gamma,                          # a constant tensor: a step
    lambda m, x: (lambda y: y * 0.5 + y)(m.c(x)),           # the conv's output read by more than the multiply
    lambda m, x: (lambda z: m.c(z) * z)(x * 0.5),           # the product read by more than the conv
], ids=["large", "tensor", "output-read-twice", "product-read-twice"])
def test_a_multiply_that_the_weights_cannot_absorb_alone_stays_a_step(fn: Callable) -> None:
    module = Lambda(fn)
    module.gamma = nn.Parameter(torch.rand(8, 1, 1))
    result = imported(module)
    assert not any({"in_scale", "out_scale"} & set(u.attrs) for u in result.graph.units)


def test_a_multiply_by_one_is_dropped_where_it_keeps_the_dtype() -> None:
    def multiplies(fn: Callable) -> int:
        gm = drop_eval_identities(captured(Lambda(fn)))
        return sum(n.op in ("call_function", "call_method") and "mul" in str(n.target) for n in gm.graph.nodes)
    assert multiplies(lambda m, x: m.c(x) * 1.0 + m.d(x).mul(1)) == 0
    assert multiplies(lambda m, x: (m.c(x) > 0) * 1.0 + x) == 1  # a bool tensor times 1.0 is a float one
    imported(Lambda(lambda m, x: m.c(x) * 1.0 + (m.d(x) > 0) * 1.0))


class SamePaddedConv(nn.Conv2d):
    """A conv subclass that only sets its padding, as Hugging Face's EfficientNet depthwise conv does."""

    def __init__(self, channels: int, kernel: int, padding: str, dilation: int = 1) -> None:
        super().__init__(channels, channels, kernel, padding=padding, dilation=dilation, groups=channels)


class LinearSubclass(nn.Linear):
    """A linear layer whose ``forward`` calls ``F.linear`` itself (Hugging Face's, timm's and others' style)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def test_convs_padded_same_or_valid_are_conv_units() -> None:
    """Issue 46, item 17: a string padding kept a conv opaque (51 of 95 units of Hugging Face's EfficientNet-B0)."""
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.odd(x) + m.even(x) + m.dilated(x) + m.depthwise(x)                # "same": one more after, for 4
        y = y + F.conv2d(x, m.c.weight, m.c.bias, 1, "same") + m.valid(F.pad(x, (1, 1, 1, 1)))
        return F.relu(y)
    module = Lambda(fn)
    module.odd, module.even = nn.Conv2d(8, 8, 3, padding="same"), nn.Conv2d(8, 8, 4, padding="same")
    module.dilated = nn.Conv2d(8, 8, 3, padding="same", dilation=2)
    module.depthwise, module.valid = SamePaddedConv(8, 5, "same"), nn.Conv2d(8, 8, 3, padding="valid")
    result = imported(module)
    assert kinds(result)["conv"] == 6 and kinds(result)["opaque"] == 0
    assert sorted(u.attrs["padding"] for u in result.graph.units if u.kind == "conv") == \
        [(0, 0), (0, 0), (1, 1), (1, 1), (2, 2), (2, 2)]  # the even kernel's pad is a pad unit before its conv


def test_a_linear_subclass_calling_f_linear_is_a_linear_unit() -> None:
    module = Apply(lambda x: x)
    module.head = LinearSubclass(8 * 6 * 6, 10)
    module.fn = lambda x: module.head(torch.flatten(F.relu(x), 1))
    result = imported(module)
    [linear] = [u for u in result.graph.units if u.kind == "linear"]
    assert linear.attrs == {"in_features": 288, "out_features": 10, "bias": True} and kinds(result)["opaque"] == 0


class Tokens(nn.Module):
    """Self-attention over six tokens of eight features (``nn.MultiheadAttention``, batch first), then a linear layer
    on the tokens laid out batch second by ``order`` (which ``back`` undoes)."""

    def __init__(self, order: tuple[int, ...], features: int) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.order, self.back = order, tuple(order.index(d) for d in range(len(order)))
        self.linear = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x, x, x, need_weights=False)[0]
        return self.linear(x.permute(*self.order)).permute(*self.back) * 2


def test_a_linear_layer_on_a_tensor_whose_batch_a_transpose_moved_runs_before_it(capture: str) -> None:
    result = imported(Tokens((1, 0, 2), 8), shape=(6, 8))  # batch second, features last: the linear moves
    linears = [u for u in result.graph.units if u.kind == "linear"]
    if capture == "export":  # the attention's in-projection too (torch.fx keeps nn.MultiheadAttention one call)
        assert sorted(u.attrs["out_features"] for u in linears) == [8, 24]
        in_projection = next(u.id for u in linears if u.attrs["out_features"] == 24)
        assert sum(in_projection in u.sources for u in result.graph.units) == 3  # query, key and value read it
    else:
        assert [u.attrs["out_features"] for u in linears] == [8]
    moved = imported(Tokens((2, 0, 1), 6), shape=(6, 8))  # features first: the linear stays where it is
    assert all(u.attrs["out_features"] != 6 for u in moved.graph.units if u.kind == "linear")


class TableBias(nn.Module):
    """A linear layer on a buffer, as Swin V2 computes its position bias (``cpb_mlp(relative_coords_table)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(6, 4))
        self.mlp = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.table).t()


def test_a_linear_layer_on_a_constant_is_no_batch_move() -> None:
    result = imported(TableBias(), shape=(8, 6))
    assert kinds(result)["linear"] == 0  # computed from constants alone: a constant, no unit


class MixedConv(nn.Module):
    """timm's ``MixedConv2d`` in small: the input's channels split into parts (``splits``), each part convolved with a
    kernel of its own size (``kernels``), concatenated, then a batch-norm and an activation (``act``) and a 1x1 conv."""

    def __init__(self, act: nn.Module, splits: tuple[int, int] = (3, 5), kernels: tuple[int, int] = (3, 5),
                 read_again: bool = False) -> None:
        super().__init__()
        self.splits, self.read_again = list(splits), read_again
        self.parts = nn.ModuleList(nn.Conv2d(c, c, k, padding=k // 2, bias=False) for c, k in zip(splits, kernels))
        self.bn, self.act, self.out = nn.BatchNorm2d(8), act, nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        split = torch.split(x, self.splits, 1)
        parts = [conv(split[i]) for i, conv in enumerate(self.parts)]  # as timm indexes them (a trace cannot iterate)
        y = self.out(self.act(self.bn(torch.cat(parts, 1))))
        return y + parts[0].mean() if self.read_again else y


def fused_equals(result: Imported, module: nn.Module) -> bool:
    """Whether the import's program with fused kernels computes what the module does, at batch 4."""
    x = torch.randn(4, *SHAPE)
    with torch.no_grad():
        return relative_error(Program.from_imported(result, "cpu", "fused").run(x), module(x)) <= 1e-5


@pytest.mark.parametrize("act", [nn.ReLU(), nn.SiLU(inplace=True), nn.Identity()], ids=["relu", "silu", "none"])
def test_a_batch_norm_and_activation_after_concatenated_convs_fold_into_each_conv(act: nn.Module) -> None:
    module = MixedConv(act)
    result = imported(module)
    convs = [u for u in result.graph.units if u.kind == "conv"]
    text = None if isinstance(act, nn.Identity) else type(act).__name__.lower()
    assert [("bn" in u.refs, u.attrs["act"]) for u in convs[:2]] == [(True, text)] * 2
    assert "pre_norm" not in convs[2].attrs and convs[2].attrs["pre_act"] is None and kinds(result)["conv"] == 3
    assert kinds(result)["elementwise"] == 0 and kinds(result)["opaque"] == 0, kinds(result)
    assert module.bn.num_features == 8, "the user's batch-norm stays as it was"
    assert fused_equals(result, module)


def test_a_batch_norm_after_a_concatenation_of_convs_read_elsewhere_stays_whole() -> None:
    result = imported(MixedConv(nn.ReLU(), read_again=True))
    assert not any("bn" in u.refs for u in result.graph.units if u.kind == "conv")


def test_alike_convs_on_equal_channel_slices_concatenated_are_one_grouped_conv() -> None:
    module = MixedConv(nn.ReLU(), splits=(4, 4), kernels=(3, 3))
    result = imported(module)
    assert [(u.kind, u.attrs["groups"], u.attrs["in_channels"], "bn" in u.refs, u.attrs["act"])
            for u in result.graph.units] == [("conv", 2, 8, True, "relu"), ("conv", 1, 8, False, None)]
    assert fused_equals(result, module)
    for unlike in (MixedConv(nn.ReLU(), splits=(4, 4), kernels=(3, 5)), MixedConv(nn.ReLU(), splits=(3, 5),
                                                                                    kernels=(3, 3))):
        assert kinds(imported(unlike))["conv"] == 3, "kernels or slices that differ stay convs of their own"


@pytest.mark.parametrize("paths", [2, 3])
@pytest.mark.parametrize("stacked", [True, False], ids=["stack", "reshape"])
def test_split_attentions_sums_over_paths_are_sums_of_the_paths(stacked: bool, paths: int) -> None:
    result = imported(SplitAttention(stacked, paths), shape=(3, 6, 6))
    spatial = [u.id for u in result.graph.units if len(u.shape) == 4 and u.shape[2:] != (1, 1)]
    assert spatial == []  # no tensor of paths made, none summed: the paths' slices, products and sums
    assert kinds(result)["scale"] == paths  # each path times its attention
    with torch.no_grad():  # the same values, in float64
        model, x = SplitAttention(stacked, paths).double().eval(), torch.randn(3, 3, 6, 6, dtype=torch.float64)
        program = Program.from_imported(import_module(model, x[:1], capture=CAPTURE["method"]))
        assert relative_error(program.run(x), model(x)) <= 1e-12


def test_paths_read_by_anything_but_a_sum_stay_one_tensor() -> None:
    result = imported(SplitAttention(stacked=False, largest_too=True), shape=(3, 6, 6))
    assert [u.shape for u in result.graph.units if len(u.shape) == 4 and u.shape[2:] != (1, 1)] == [(2, 4, 6, 6)]


# ---------------------------------------------------------------------------------- parallel conv branches


class Branches(nn.Module):
    """A block of parallel branches on one input, summed, then an activation: RepVGG's (a 3x3 conv and a 1x1 conv,
    each with its batch-norm, and a batch-norm of the input), MobileOne's (three depthwise 3x3 convs and a depthwise
    1x1 each with its batch-norm, the input's batch-norm, summed in place as timm does) and others."""

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style = style
        groups = 8 if style == "mobileone" else 1
        if style == "asymmetric":  # ACNet: 3x3, 1x3 and 3x1 on one input
            shapes = [((3, 3), (1, 1)), ((1, 3), (0, 1)), ((3, 1), (1, 0))]
        elif style == "dilated":
            shapes = [((3, 3), (2, 2)), ((1, 1), (0, 0))]
        else:
            shapes = [((3, 3), (1, 1))] * (3 if style == "mobileone" else 1) + [((1, 1), (0, 0))]
        stride, dilation = (2 if style == "strided" else 1), (2 if style == "dilated" else 1)
        self.convs = nn.ModuleList(nn.Conv2d(8, 8, k, stride, p, dilation, groups,
                                             bias=style == "plain") for k, p in shapes)
        self.norms = nn.ModuleList(nn.BatchNorm2d(8) for _ in shapes)
        self.identity = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "plain":  # convs with biases and the input itself
            return F.relu(self.convs[0](x) + self.convs[1](x) + x)
        if self.style == "difference":
            return self.convs[0](x) - self.norms[1](self.convs[1](x))
        out = self.norms[0](self.convs[0](x))
        for i in range(1, len(self.convs)):
            out += self.norms[i](self.convs[i](x))
        if self.style in ("repvgg", "mobileone"):
            out += self.identity(x)
        return F.relu(out)


@pytest.mark.parametrize("style", ["repvgg", "mobileone", "plain", "difference", "strided", "asymmetric", "dilated"])
def test_parallel_conv_branches_on_one_input_summed_are_one_conv(style: str) -> None:
    module = Branches(style)
    result = imported(module)
    assert [u.kind for u in result.graph.units] == ["conv"], kinds(result)
    unit = result.graph.units[0]
    assert unit.attrs["act"] == (None if style == "difference" else "relu")
    assert unit.attrs["kernel"] == (3, 3) and unit.attrs["groups"] == (8 if style == "mobileone" else 1)
    assert fused_equals(result, module)
    assert all(c.weight.shape[2:] == c.kernel_size for c in module.convs), "the user's convs stay as they were"


@pytest.mark.parametrize("fn, convs", [
    (lambda m, x: m.c(x) + m.d(F.relu(x)), 2),                     # on two inputs
    (lambda m, x: (lambda y: y + m.d(x) + y.mean())(m.c(x)), 2),   # a branch read elsewhere too
    (lambda m, x: m.bn(m.c(x)) + m.d(x) + m.gamma, 1),             # a term that is no branch: added after
    (lambda m, x: m.c(x) + m.dilated(x), 2),                       # dilations differ
], ids=["two-inputs", "read-elsewhere", "other-term", "dilations"])
def test_branches_that_are_no_one_conv_stay_convs(fn: Callable, convs: int) -> None:
    module = Lambda(fn)
    module.gamma = nn.Parameter(torch.rand(8, 1, 1))
    module.dilated = nn.Conv2d(8, 8, 3, padding=2, dilation=2)
    result = imported(module)
    assert kinds(result)["conv"] == convs, kinds(result)
    assert fused_equals(result, module)


@pytest.mark.parametrize("spelling", [lambda y, g: y * g, lambda y, g: g.reshape(1, -1, 1, 1) * y,
                                      lambda y, g: y.mul(g), lambda y, g: y * 0.5, lambda y, g: y / 4])
def test_branches_weighed_by_a_number_or_a_layer_scale_are_one_conv(spelling: Callable) -> None:
    """FastViT's token mixer: ``x + gamma * (mixer(x) - norm(x))``, the mixer a sum of branches, the norm a
    batch-norm of x; gamma a layer scale of shape (C, 1, 1) or a number."""
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        return x + spelling(m.bn(m.c(x)) + m.d(x) - m.norm(x), m.gamma)
    module = Lambda(fn)
    module.gamma, module.norm = nn.Parameter(torch.rand(8, 1, 1)), nn.BatchNorm2d(8)
    result = imported(module)
    assert [u.kind for u in result.graph.units] == ["conv"] and result.graph.units[0].inputs[0].parts == (("@input",),)
    assert fused_equals(result, module)


def test_a_conv_weighed_by_a_layer_scale_is_one_conv_with_the_residual_sum() -> None:
    """FastViT's and ConvNeXt's ``x + gamma * conv(h)``, h computed from x: the layer scale folds into the conv's
    weights, so the sum is the conv's residual sum; a multiply by a number alone stays the conv's ``out_scale``."""
    module = Lambda(lambda m, x: x + m.gamma * m.d(F.relu(m.c(x))))
    module.gamma = nn.Parameter(torch.rand(8, 1, 1))
    result = imported(module)
    assert [(u.kind, u.attrs.get("residual"), u.attrs.get("epilogue")) for u in result.graph.units] == [
        ("conv", None, None), ("conv", True, None)]
    assert fused_equals(result, module)
    result = imported(Lambda(lambda m, x: x + m.d(F.relu(m.c(x))) * 0.5))
    assert [u.attrs.get("out_scale") for u in result.graph.units] == [None, 0.5]


def test_an_add_of_zero_is_dropped_where_it_keeps_the_dtype() -> None:
    gm = drop_eval_identities(captured(Lambda(lambda m, x: (m.c(x) + 0) - 0 + (0 + m.d(x)) + ((x > 0) + 0.0))))
    assert sum(n.op in ("call_function", "call_method") and "add" in str(n.target) for n in gm.graph.nodes) == 3
    assert sum(n.op in ("call_function", "call_method") and "sub" in str(n.target) for n in gm.graph.nodes) == 0


# ------------------------------------------------------------------------------ shuffles, slices and SE gates


def test_channel_shuffle_is_one_unit() -> None:
    result = imported(Lambda(lambda m, x: channel_shuffle(m.c(x), 2)))
    assert kinds(result) == Counter({"conv": 1, "shuffle": 1})
    module = Lambda(lambda m, x: m.shuffle(m.c(x)))
    module.shuffle = nn.ChannelShuffle(4)
    assert kinds(imported(module)) == Counter({"conv": 1, "shuffle": 1})


def test_channel_slices_are_slice_units() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        a, b = m.c(x).chunk(2, dim=1)
        c = torch.split(x, [3, 5], dim=1)[1]
        return torch.cat([m.d(torch.cat([a, b], 1)), c[:, 1:4], x.narrow(1, 2, 1)], 1)
    result = imported(Lambda(fn))
    assert kinds(result)["slice"] == 5 and kinds(result)["opaque"] == 0


@pytest.mark.parametrize("dim, channels", [(1, True), (-3, True), (-2, False), (3, False)])
def test_only_a_concatenation_along_the_channels_folds_into_the_next_unit(dim: int, channels: bool) -> None:
    # dim -2 is the height of an NCHW tensor: folded as a channel concatenation, the next unit read a wrong shape
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        return m.pool(torch.cat([m.c(x), m.d(x)], dim))
    module = Lambda(fn)
    module.pool = nn.MaxPool2d(2)
    result = kinds(imported(module))
    assert result == (Counter({"conv": 2, "pool": 1}) if channels else Counter({"conv": 2, "opaque": 1, "pool": 1}))


@pytest.mark.parametrize("flat, dim, channels", [(False, 1, True), (False, -3, True), (True, -2, True),
                                                 (False, -2, False)])
def test_a_narrow_is_a_channel_slice_along_the_channels_only(flat: bool, dim: int, channels: bool) -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x).flatten(2) if flat else m.c(x)  # (B, C, H*W): its channels are dimension -2
        return y.narrow(dim, 2, 3).sum(-1)
    assert (kinds(imported(Lambda(fn)))["slice"] == 1) == channels


@pytest.mark.parametrize("then, factor", [(lambda y: y, None), (lambda y: y * 2.0 * 0.2, 0.4),
                                          (lambda y: (y / 2).mul_(3) + 1, 1.5)], ids=["none", "two", "then-add"])
def test_squeeze_excitation_is_its_pool_and_convs_plus_one_scale(then: Callable, factor: float | None) -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        gate = torch.sigmoid(m.up(F.relu(m.down(y.mean((2, 3), keepdim=True)))))
        return then(y * gate)                   # the multiplies by numbers after the scaling: its factor
    module = Lambda(fn)
    module.down, module.up = nn.Conv2d(8, 2, 1), nn.Conv2d(2, 8, 1)
    result = imported(module)
    assert kinds(result) == Counter({"conv": 3, "pool": 1, "scale": 1})
    [scaling] = [u for u in result.graph.units if u.kind == "scale"]
    assert scaling.attrs.get("factor") == pytest.approx(factor) and fused_equals(result, module)


@pytest.mark.parametrize("then", [lambda m, x, y, z: F.relu(z * 2.0 + y), lambda m, x, y, z: x + z],
                         ids=["its-conv's-output", "the-block's-input"])
def test_a_residual_sum_after_a_scaling_is_the_scalings(then: Callable) -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        return then(m, x, y, y * torch.sigmoid(m.up(F.relu(m.down(y.mean((2, 3), keepdim=True))))))
    module = Lambda(fn)
    module.down, module.up = nn.Conv2d(8, 2, 1), nn.Conv2d(2, 8, 1)
    result = imported(module)
    [scaling] = [u for u in result.graph.units if u.kind == "scale"]
    assert scaling.attrs["residual"] is True and len(scaling.inputs) == 3 and kinds(result)["add"] == 0
    assert fused_equals(result, module)


def test_a_sum_of_a_scaling_and_another_branch_stays_an_add() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        return y * torch.sigmoid(m.up(F.relu(m.down(y.mean((2, 3), keepdim=True))))) + m.d(x)
    module = Lambda(fn)
    module.down, module.up = nn.Conv2d(8, 2, 1), nn.Conv2d(2, 8, 1)
    result = imported(module)
    assert kinds(result)["add"] == 1 and not any("residual" in u.attrs for u in result.graph.units)


@pytest.mark.parametrize("gate", ["product", "spatial", "channel"])
def test_a_product_of_two_branches_or_a_spatial_gate_is_one_scale_with_its_factor_where_small(gate: str) -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        by = {"product": lambda: F.relu(m.d(x)), "spatial": lambda: torch.sigmoid(m.point(y)),
              "channel": lambda: torch.sigmoid(m.d(y.mean((2, 3), keepdim=True)))}[gate]()
        return y * by * 2.0
    module = Lambda(fn)
    module.point = nn.Conv2d(8, 1, 1)
    result = imported(module)
    assert kinds(result)["scale"] == 1 and kinds(result)["opaque"] == 0, kinds(result)
    [scaling] = [u for u in result.graph.units if u.kind == "scale"]
    # a number after a gate smaller than x scales the gate; after a product of two branches it is an epilogue step
    assert ("factor" in scaling.attrs) == (gate != "product") and fused_equals(result, module)


@pytest.mark.parametrize("gate", [lambda y: y[:, :, :1], lambda y: y.mean(0, keepdim=True)],
                         ids=["one-column", "batch-mean"])
def test_a_product_with_a_tensor_of_another_shape_or_without_the_batch_stays_opaque(gate: Callable) -> None:
    result = imported(Lambda(lambda m, x: (y := m.c(x)) * gate(y)))
    assert kinds(result)["scale"] == 0


def test_a_sum_keeps_its_expand_and_folds_into_the_conv_that_reads_it() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        return m.d(y + torch.sigmoid(y.mean((2, 3), keepdim=True)).expand_as(y))
    result = imported(Lambda(fn))
    assert [op for op, _ in opaque_report(result.graph).ops] == ["expand_as"], opaque_report(result.graph).ops


def eca_gate(conv: nn.Conv1d, spelling: str) -> Callable:
    """Efficient channel attention after ``m.c``, as timm (``mean``, ``view``) or ECA-Net's code (an adaptive pool,
    ``squeeze``, ``transpose``, ``unsqueeze``) spells it, with ``conv`` across the channels."""
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        if spelling == "timm":
            g = conv(y.mean((2, 3)).view(y.shape[0], 1, -1))
            g = torch.sigmoid(g).view(y.shape[0], -1, 1, 1)
        else:
            g = conv(F.adaptive_avg_pool2d(y, 1).squeeze(-1).transpose(-1, -2)).transpose(-1, -2).unsqueeze(-1)
            g = g.sigmoid()
        return y * g.expand_as(y)
    return fn


@pytest.mark.parametrize("spelling", ["timm", "eca-net"])
@pytest.mark.parametrize("options", [dict(kernel_size=3, padding=1, bias=False), dict(kernel_size=5, padding=2),
                                     dict(kernel_size=3, padding=2, dilation=2), dict(kernel_size=4, padding="same")],
                         ids=["k3", "k5-bias", "dilated", "same"])
def test_efficient_channel_attention_is_a_pool_a_conv_and_a_scale(spelling: str, options: dict) -> None:
    module = Lambda(lambda m, x: eca_gate(m.across, spelling)(m, x))
    module.across = nn.Conv1d(1, 1, **options)
    result = imported(module)
    assert kinds(result) == Counter({"conv": 2, "pool": 1, "scale": 1}), kinds(result)
    assert [u.attrs["act"] for u in result.graph.units if u.kind == "conv"][1] == "sigmoid"
    assert fused_equals(result, module) and isinstance(module.across, nn.Conv1d), "the user's conv stays as it was"


@pytest.mark.parametrize("options", [dict(kernel_size=3), dict(kernel_size=3, padding=1, stride=2)],
                         ids=["shorter", "strided"])
def test_a_conv1d_that_does_not_keep_the_channels_line_stays_opaque(options: dict) -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        g = m.across(m.c(x).mean((2, 3)).view(x.shape[0], 1, -1))
        return g.flatten(1)
    module = Lambda(fn)
    module.across = nn.Conv1d(1, 1, **options)
    assert "opaque" in kinds(imported(module))


def test_the_band_of_a_conv1d_computes_what_it_computes_across_the_channels() -> None:
    from ios_ray.frontend.gates import _banded
    generator = torch.Generator().manual_seed(0)
    for kernel, dilation, padding, channels in [(1, 1, 0, 5), (3, 1, 1, 7), (5, 2, 4, 16), (4, 1, "same", 9),
                                                 (7, 3, 9, 12), (2, 2, "same", 6)]:
        conv = nn.Conv1d(1, 1, kernel, padding=padding, dilation=dilation).double()
        line = torch.randn(3, 1, channels, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            got = _banded(conv, channels)(line.view(3, channels, 1, 1)).view(3, 1, channels)
            torch.testing.assert_close(got, conv(line), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------- opaque units


def test_opaque_chain_of_single_reader_ops_is_one_unit() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x).permute(0, 2, 3, 1)
        return m.norm(y).permute(0, 3, 1, 2) * 2.0
    module = Lambda(fn)
    module.norm = nn.LayerNorm(8)
    result = imported(module)
    opaque = [u for u in result.graph.units if u.kind == "opaque"]
    assert len(opaque) == 1 and len(opaque[0].attrs["then"]) == 3
    assert opaque_report(result.graph).ops == (("permute", 2), ("LayerNorm", 1))


def test_tuple_results_are_computed_by_the_unit_that_takes_an_item() -> None:
    result = imported(Lambda(lambda m, x: torch.max(m.c(x), dim=1)[0] * 2.0))
    opaque = [u for u in result.graph.units if u.kind == "opaque"]
    assert len(opaque) == 1 and opaque[0].shape == (6, 6) and len(opaque[0].refs["nodes"]) == 3


def test_describe_args_leave_names_out_of_stage_keys() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(m.c(x).permute(0, 2, 3, 1), (8,), m.w, None)
    module = Lambda(fn)
    module.w = nn.Parameter(torch.ones(8))
    unit = next(u for u in imported(module).graph.units if u.kind == "opaque")
    assert "const(8,)" in unit.attrs["then"][0] and ".w" not in unit.attrs["then"][0]


# ------------------------------------------------------------------------------------------- shared weights


def test_a_module_called_twice_is_two_units_sharing_its_weights() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(F.relu(m.c(x)))                             # PolyNet-style: one module, two places
        return torch.cat([y, m.c(x)], 1)
    module = Lambda(fn)
    result = imported(module)
    convs = [u for u in result.graph.units if u.kind == "conv"]
    assert [u.id for u in convs] == ["c", "c@1", "c@2"]
    assert all(result.module.get_submodule(u.refs["conv"]) is module.c for u in convs)  # shared, not copied


# ------------------------------------------------------------------------- decoders: upsampling, pads, norms


def test_upsampling_is_an_upsample_unit_in_every_spelling() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.up(m.c(x))                                                   # nn.Upsample, nearest
        z = F.interpolate(m.d(x), size=(12, 12), mode="bilinear", align_corners=False)
        return y + z
    module = Lambda(fn)
    module.up = nn.Upsample(scale_factor=2)
    result = imported(module)
    ups = {u.id: u.attrs for u in result.graph.units if u.kind == "upsample"}
    assert sorted(a["mode"] for a in ups.values()) == ["bilinear", "nearest"] and kinds(result)["opaque"] == 0


def test_pads_and_crops_are_pad_units_and_a_pad_then_crop_is_one() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        shifted = m.pad(m.c(x))[:, :, 1:, 1:]                              # NASNet: pad, then crop: a shift
        padded = F.pad(m.d(x), (1, 1, 2, 2), value=0.5)[:, :, 2:-2, 1:-1]  # a crop read by nothing else: one unit
        return shifted + padded + F.pad(x, (0, 0, 0, 0)) + x[:, :, :, :]
    module = Lambda(fn)
    module.pad = nn.ZeroPad2d((0, 1, 0, 1))
    result = imported(module)
    pads = sorted(u.attrs["pads"] for u in result.graph.units if u.kind == "pad")
    assert pads == [(-1, 1, -1, 1), (0, 0, 0, 0), (0, 0, 0, 0)] and kinds(result)["opaque"] == 0


def test_pads_by_reflection_replication_or_circularly_are_pad_units_and_their_convs_conv_units() -> None:
    """Image-to-image models pad by reflection: with pad layers (CycleGAN's generator) or ``padding_mode=``."""
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.reflect(x) + m.circular(x) + m.replicate(x) + m.same(x)
        crops = F.pad(y, (1, 1, 1, 1), mode="replicate")[:, :, 1:-1, 1:-1] + m.pad(y)[:, :, 2:, 2:]
        return m.valid(m.pad(F.relu(y))) + crops
    module = Lambda(fn)
    module.reflect, module.circular = nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect"), \
        nn.Conv2d(8, 8, 3, padding=2, dilation=2, padding_mode="circular")
    module.replicate = nn.Conv2d(8, 8, (3, 5), padding=(1, 2), padding_mode="replicate")
    module.same, module.pad = nn.Conv2d(8, 8, 3, padding="same", padding_mode="reflect"), nn.ReflectionPad2d(1)
    module.valid = nn.Conv2d(8, 8, 3)
    result = imported(module)
    assert kinds(result)["conv"] == 5 and kinds(result)["opaque"] == 0, kinds(result)
    assert all(u.attrs["padding"] == (0, 0) for u in result.graph.units if u.kind == "conv")
    modes = sorted((u.attrs.get("mode", "constant"), u.attrs["pads"]) for u in result.graph.units if u.kind == "pad")
    assert modes == [("circular", (2, 2, 2, 2)), ("constant", (-2, 0, -2, 0)), ("constant", (-1, -1, -1, -1)),
                     ("reflect", (1, 1, 1, 1)), ("reflect", (1, 1, 1, 1)), ("reflect", (1, 1, 1, 1)),
                     ("reflect", (1, 1, 1, 1)), ("replicate", (1, 1, 1, 1)), ("replicate", (2, 2, 1, 1))], modes


def test_prelu_and_group_and_instance_norms_after_a_conv_are_its_epilogue() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        a = m.prelu(m.norm(m.c(x)))
        b = F.prelu(F.group_norm(m.d(x), 2, m.gamma, m.beta), m.slope)
        return a + m.inorm(m.e(x)) + b
    module = Lambda(fn)
    module.norm, module.prelu, module.inorm = nn.GroupNorm(2, 8), nn.PReLU(8), nn.InstanceNorm2d(8, affine=True)
    module.e = nn.Conv2d(8, 8, 1)
    module.gamma, module.beta, module.slope = (nn.Parameter(torch.rand(8) + 0.5) for _ in range(3))
    result = imported(module)
    epilogues = {u.id: u.attrs.get("epilogue") for u in result.graph.units if u.kind == "conv"}
    steps = ("group_norm(x, 2, const(8,), const(8,), 1e-05)", "prelu(x, const(8,))")
    assert epilogues["c"] == epilogues["d"] == steps, epilogues  # a layer reads as its functional form
    assert epilogues["e"][0].startswith("instance_norm") and kinds(result)["opaque"] == 0


def test_a_transposed_conv_is_a_unit_with_its_batch_norm_and_activation_as_epilogue() -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(m.bn(m.up(m.c(x))))
    module = Lambda(fn)
    module.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
    result = imported(module)
    [up] = [u for u in result.graph.units if u.kind == "conv_transpose"]
    assert up.attrs["stride"] == (2, 2) and up.attrs["epilogue"] == ("batch_norm", "relu") and up.shape == (8, 12, 12)
    assert up.flops == 2 * 8 * 6 * 6 * 8 * 4 and kinds(result)["opaque"] == 0


class Volume(nn.Module):
    """A small 3-d net: conv, batch-norm, ReLU, pools, a second conv and a transposed conv, as 3-d U-Nets are built."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv3d(2, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU())
        self.b = nn.Conv3d(4, 4, 1)
        self.pool, self.avg = nn.MaxPool3d(2), nn.AvgPool3d(2)
        self.up = nn.ConvTranspose3d(4, 2, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.up(self.b(self.pool(y)) + self.avg(y))


def test_3d_convs_and_pools_are_units_and_a_3d_net_computes_what_it_computes() -> None:
    result = imported(randomise_batchnorm(Volume()), (2, 4, 6, 6))
    convs = [u for u in result.graph.units if u.kind == "conv3d"]
    assert [u.attrs["epilogue"] if "epilogue" in u.attrs else () for u in convs] == [("batch_norm", "relu"), ()]
    assert convs[0].flops == 2 * 4 * 4 * 6 * 6 * 2 * 27
    pools = {u.attrs["mode"]: u.attrs["kernel_size"] for u in result.graph.units if u.kind == "pool"}
    assert pools == {"max": (2, 2, 2), "avg": (2, 2, 2)} and kinds(result)["conv_transpose"] == 1
    assert kinds(result)["opaque"] == 0


def test_only_writes_through_a_view_make_the_capture_functionalize(capture: str) -> None:
    from ios_ray.frontend.capture import _writes_through_aliases, export

    if capture == "fx":
        pytest.skip("torch.fx cannot trace item assignment; only torch.export captures it")

    def written(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        y[:, :2] = 0.0  # a write into a view of y: other readers must see it
        return y + m.d(x)

    def dropped(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(m.c(x).flatten(1), 0.2, False, True)  # in place, on a view, but writes nothing
    def ghost(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([m.c(x), m.d(x)], 1)[:, :5]  # GhostNet: nothing reads the cat after the write below
        y += x[:, :5]
        return y

    def ghost_read_later(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        both = torch.cat([m.c(x), m.d(x)], 1)
        y = both[:, :5]
        y += x[:, :5]
        return both * 2.0  # reads the write through the cat
    example = torch.randn(1, *SHAPE)
    assert _writes_through_aliases(export(Lambda(written).eval(), example))
    assert not _writes_through_aliases(export(Lambda(dropped).eval(), example))
    assert not _writes_through_aliases(export(Lambda(ghost).eval(), example))
    assert _writes_through_aliases(export(Lambda(ghost_read_later).eval(), example))
    for forward in (written, ghost, ghost_read_later):
        imported(Lambda(forward))  # and the import computes what the module computes


def test_writes_into_the_models_own_tensors_are_refused(capture: str) -> None:
    def counted(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        m.calls.add_(1.0)  # eager mode counts its calls: each computes with another count
        return m.c(x) * m.calls

    def running_mean(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        m.mean.copy_(0.9 * m.mean + 0.1 * y.mean((0, 2, 3), keepdim=True))
        return y - m.mean

    def decayed(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        m.d.weight.mul_(0.99)
        return m.d(m.c(x))
    for forward, tensor in ((counted, "calls"), (running_mean, "mean"), (decayed, "d.weight")):
        module = Lambda(forward)
        module.register_buffer("calls", torch.zeros(()))
        module.register_buffer("mean", torch.zeros(1, 8, 1, 1))
        with pytest.raises(ImportRefused, match=f"writes into .*`{tensor}` in place.*update it outside forward"):
            import_module(module.eval(), torch.randn(1, *SHAPE), capture=capture)


def test_in_place_ops_of_any_name_become_out_of_place(capture: str) -> None:
    def fn(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        z = m.d(y)
        y.lerp_(z, 0.25)
        y.masked_fill_(z > 0.5, 0.0)
        y.clamp_(min=-0.2)
        w = y.view(y.shape[0], -1)   # a view of y taken after the writes reads their result
        return m.d(y) + z + w.sum(1).view(-1, 1, 1, 1)
    module = Lambda(fn)
    gm = functionalize(captured(module))
    assert not [n.target for n in gm.graph.nodes if str(n.target).endswith("_")]
    imported(module)


def test_writes_through_views_are_followed_by_torch_export_and_refused_in_a_trace(capture: str) -> None:
    def clamped(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        y[:, 1:3].clamp_(min=0.0)  # a write into a view of y, which is read afterwards
        return m.d(y)

    def viewed_before(m: Lambda, x: torch.Tensor) -> torch.Tensor:
        y = m.c(x)
        v = y.flatten(1)
        y.relu_()                  # v sees the write
        return m.d(y) + v.sum(1).view(-1, 1, 1, 1)
    for forward in (clamped, viewed_before):
        if capture == "export":
            imported(Lambda(forward))
        else:
            with pytest.raises(ImportRefused, match="shares memory with another, and reads the other afterwards"):
                imported(Lambda(forward))
