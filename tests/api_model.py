"""A small two-branch CNN, used two ways by tests/test_api.py.

Run as a script (``python tests/api_model.py STORE OUT``) its class is defined in ``__main__``, as in a notebook: it
searches the object with ``ios_ray.search``, deploys it, runs ``ios_ray.optimize``, and prints one JSON line of what
it found. Imported (``--model tests.api_model:build``), it is the same architecture for the CLI.
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn

INPUT_SHAPE = (3, 16, 16)


class TwoBranch(nn.Module):
    """A stem, three parallel convs joined by a concat, and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.a = nn.Conv2d(16, 16, 1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        self.c = nn.Conv2d(16, 8, 3, padding=1)
        self.head = nn.Linear(40, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        y = torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x)), torch.relu(self.c(x))], 1)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class DtypeCast(TwoBranch):
    """TwoBranch with a term cast to its weights' dtype, as timm's EdgeNeXt casts its positional encoding: the traced
    graph holds that dtype, so the model imports to another graph in float16 than in float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = x + (x.float() * 0.5).to(self.stem.weight.dtype)
        y = torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x)), torch.relu(self.c(x))], 1)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def build() -> nn.Module:
    """Factory for ``--model tests.api_model:build``."""
    return TwoBranch()


build.input_shape = INPUT_SHAPE  # type: ignore[attr-defined]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|."""
    return float((actual - expected).abs().max() / expected.abs().max())


def main(store: str, out: str) -> None:
    """Search, deploy, save and optimize a TwoBranch defined in ``__main__``; print what came out as JSON."""
    import ios_ray
    from ios_ray.paired import least_rounds
    from tests.helpers import NAMED_KERNELS

    torch.manual_seed(0)
    model = TwoBranch().eval()
    result = ios_ray.search(model, devices=["cpu"], batches=[1], input_shape=INPUT_SHAPE, store=store,
                            check_rounds=0, kernels=NAMED_KERNELS, progress=False)
    result.save(out)
    ray_after_search = _ray_address()
    x = torch.randn(4, *INPUT_SHAPE)
    with torch.no_grad():
        expected = model(x)
        deployed = relative_error(result.deploy(model)(x), expected)
        optimized = ios_ray.optimize(model, x, store=store, check_rounds=least_rounds(), kernels=NAMED_KERNELS,
                                     progress=False)
        found = relative_error(optimized(x), expected)
    ray_after_optimize = _ray_address()
    [outcome] = result.outcomes
    print(json.dumps({
        "class_module": type(model).__module__, "model": result.model, "measured": outcome.measured,
        "stages": [s.to_json() for s in outcome.schedule.stages], "deployed_error": deployed,
        "optimized_error": found, "optimized_type": type(optimized).__name__,
        "optimized_batches": [s.batch for s in optimized.schedules],
        "ray_after_search": ray_after_search, "ray_after_optimize": ray_after_optimize,
    }))


def _ray_address() -> str:
    """The GCS address of the Ray this process is connected to ("" when none)."""
    import ray

    return ray.get_runtime_context().gcs_address if ray.is_initialized() else ""


if __name__ == "__main__":
    main(*sys.argv[1:3])
