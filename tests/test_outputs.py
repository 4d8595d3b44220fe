"""Models that return their tensor in a dict, tuple or list (segmentation models' ``{"out": logits}``), or several
(a backbone's feature maps): the graph computes one tensor (several flattened and concatenated), a deployed model
returns the model's own structure, and outputs that cannot be concatenated are one sentence."""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pytest
import torch
from torch import nn

from ios_ray.app.cli.bench import eager_variants
from ios_ray.runtime.accuracy import relative_error
from ios_ray.errors import UserError
from ios_ray.frontend import import_module, output_tensor
from ios_ray.runtime import ScheduledModule
from tests.helpers import ios_ray_here
from tests.test_runtime_schedules import BUILDERS, make_schedule

SHAPE = (4, 8, 8)


class Logits(NamedTuple):
    logits: torch.Tensor
    classes: int


class Returns(nn.Module):
    """Two conv branches summed, returned through ``wrap``."""

    def __init__(self, wrap: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(4, 6, 3, padding=1), nn.Conv2d(4, 6, 1)
        self.wrap = wrap

    def forward(self, x: torch.Tensor) -> Any:
        return self.wrap(torch.relu(self.a(x)) + self.b(x))


STRUCTURES: dict[str, Callable[[torch.Tensor], Any]] = {
    "tensor": lambda y: y,
    "ordered dict": lambda y: OrderedDict(out=y),
    "dict with None": lambda y: {"out": y, "aux": None},
    "tuple": lambda y: (y,),
    "list after a number": lambda y: [3, y],
    "named tuple": lambda y: Logits(y, 6),
}


def same_structure(actual: Any, expected: Any) -> bool:
    """Same types, keys and non-tensor entries; tensors equal to 1e-5."""
    if isinstance(expected, torch.Tensor):
        return isinstance(actual, torch.Tensor) and relative_error(actual, expected) <= 1e-5
    if type(actual) is not type(expected):
        return False
    if isinstance(expected, dict):
        return list(actual) == list(expected) and all(same_structure(actual[k], expected[k]) for k in expected)
    if isinstance(expected, (tuple, list)):
        return len(actual) == len(expected) and all(map(same_structure, actual, expected))
    return actual == expected


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_a_deployed_model_returns_its_tensor_in_the_models_own_structure(structure: str) -> None:
    torch.manual_seed(0)
    model = Returns(STRUCTURES[structure]).eval()
    x = torch.randn(3, *SHAPE)
    imported = import_module(model, x[:1])
    assert imported.output.bare == (structure == "tensor")
    assert [u.kind for u in imported.graph.units].count("conv") == 2
    fast = ScheduledModule(model, [make_schedule(imported.graph, BUILDERS["ios_like"], 3, device="cpu")],
                           input_shape=SHAPE)
    with torch.no_grad():
        expected = model(x)
        assert same_structure(fast(x), expected)
        eager = eager_variants(model, torch.device("cpu"), imported)[0]
        assert relative_error(eager.forward(x), output_tensor(expected)) == 0


class Features(nn.Module):
    """A backbone that returns its feature maps at three resolutions, as timm's ``features_only`` models do (a list)
    and torchvision's FPN (an ``OrderedDict``)."""

    def __init__(self, wrap: Callable[[list[torch.Tensor]], Any]) -> None:
        super().__init__()
        self.stem = nn.Conv2d(4, 8, 3, padding=1)
        self.down = nn.ModuleList([nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.Conv2d(8, 16, 3, stride=2, padding=1)])
        self.wrap = wrap

    def forward(self, x: torch.Tensor) -> Any:
        features = [torch.relu(self.stem(x))]
        for down in self.down:
            features.append(torch.relu(down(features[-1])))
        return self.wrap(features)


@pytest.mark.parametrize("wrap", [
    lambda f: f, lambda f: OrderedDict((str(i), t) for i, t in enumerate(f)), lambda f: (f[0], None, f[2], "name"),
])
def test_a_model_returning_several_tensors_returns_each_from_one_concatenated_output(
    wrap: Callable[[list[torch.Tensor]], Any]
) -> None:
    torch.manual_seed(0)
    model = Features(wrap).eval()
    x = torch.randn(3, *SHAPE)
    imported = import_module(model, x[:1])
    flattens = [u.id for u in imported.graph.units if u.kind == "flatten"]
    [packed] = [u for u in imported.graph.units if u.kind == "concat"]  # the output: the flattened maps, concatenated
    assert imported.graph.output.sources == (packed.id,) and packed.sources == tuple(flattens) and len(flattens) >= 2
    fast = ScheduledModule(model, [make_schedule(imported.graph, BUILDERS["ios_like"], 3, device="cpu")],
                           input_shape=SHAPE)
    with torch.no_grad():
        expected, actual = model(x), fast(x)
        assert same_structure(actual, expected)
        assert relative_error(output_tensor(actual), output_tensor(expected)) <= 1e-5
        eager = eager_variants(model, torch.device("cpu"), imported)[0]
        assert relative_error(eager.forward(x), output_tensor(expected)) == 0


@pytest.mark.parametrize("wrap, message", [
    (lambda y: (y, y.mean()), r"returns a tensor of shape \(\) for a batch of B samples"),
    (lambda y: (y, y.double()), "not all batch-first feature maps of one dtype"),
    (lambda y: {"sizes": (3, 4)}, "returned no tensor"),
])
def test_outputs_that_cannot_be_concatenated_are_one_sentence(wrap: Callable[[torch.Tensor], Any],
                                                              message: str) -> None:
    with pytest.raises(UserError, match=message):
        import_module(Returns(wrap).eval(), torch.randn(2, *SHAPE))


@pytest.mark.parametrize("capture", ["export", "fx"])
@pytest.mark.parametrize("wrap, shape", [
    (lambda y: y.unsqueeze(0), "(1, B, 6, 8, 8)"),
    (lambda y: (y, y.unsqueeze(0)), "(1, B, 6, 8, 8)"),
    (lambda y: y.transpose(0, 1), "(6, B, 8, 8)"),
])
def test_an_output_whose_first_dimension_is_not_the_batch_is_one_sentence(
    wrap: Callable[[torch.Tensor], Any], shape: str, capture: str,
) -> None:
    """Issue 46, item 11: RT-DETR returns such a tensor, and the import failed with a RuntimeError."""
    with pytest.raises(UserError, match=rf"^Returns returns a tensor of shape {re.escape(shape)} for a batch of B "
                                        r"samples, whose first dimension is not the batch; .* wrap the model"):
        import_module(Returns(wrap).eval(), torch.randn(1, *SHAPE), capture=capture)


def test_inspect_says_so_of_an_output_that_is_not_batch_first(tmp_path: Path) -> None:
    done = ios_ray_here("inspect", "--model", "tests.user_models:unbatched", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "returns a tensor of shape (1, B, 8, 16, 16) for a batch of B samples" in done.stderr
