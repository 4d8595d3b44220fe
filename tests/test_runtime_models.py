"""Every zoo model under every schedule strategy: ScheduledModule's output equals the eager module's.

NASNet-A is checked with one cell per stack (``cell_repeats=1``): the large one is too slow on a CPU, and its
cells repeat the same structure. BatchNorm statistics are randomised so that folding is exercised; inputs are
random. The DP's schedules (under the search's synthetic latencies) are used where the DP is quick.
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn

from ios_ray.frontend import import_module
from ios_ray.runtime import ScheduledModule
from tests.helpers import randomise_batchnorm, relative_error
from tests.test_runtime_schedules import BUILDERS, make_schedule
from ios_ray.zoo import ZOO
from ios_ray.zoo.nasnet_a import nasnet_a

BATCHES = (1, 4)
MODELS: dict[str, Callable[[], nn.Module]] = {
    "inception_v3": ZOO["inception_v3"].build,
    "squeezenet": ZOO["squeezenet"].build,
    "nasnet_a": lambda: nasnet_a(cell_repeats=1),
    "randwire": ZOO["randwire"].build,
}


class Case:
    """One model with randomised batch-norms, its random inputs and eager outputs, per batch size."""

    def __init__(self, name: str) -> None:
        torch.manual_seed(0)
        self.name = name
        self.model = randomise_batchnorm(MODELS[name]())
        generator = torch.Generator().manual_seed(1)
        shape = ZOO[name].input_shape
        self.inputs = {b: torch.randn(b, *shape, generator=generator) for b in BATCHES}
        with torch.no_grad():
            self.expected = {b: self.model(x) for b, x in self.inputs.items()}
        self.graph = import_module(self.model, self.inputs[1]).graph


#: The models whose import and schedules take seconds each: run by `.ci/run` after the default suite, which keeps
#: SqueezeNet.
SLOW = ("inception_v3", "nasnet_a", "randwire")


@pytest.fixture(scope="module",
                params=[pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in MODELS])
def case(request: pytest.FixtureRequest) -> Case:
    return Case(request.param)


@pytest.mark.parametrize("strategy", list(BUILDERS))
def test_scheduled_equals_eager(case: Case, strategy: str) -> None:
    schedules = [make_schedule(case.graph, BUILDERS[strategy], b, model=case.name) for b in BATCHES]
    scheduled = ScheduledModule(case.model, schedules)
    for batch, x in case.inputs.items():
        assert scheduled.schedule_for(x).batch == batch
        with torch.no_grad():
            assert relative_error(scheduled(x), case.expected[batch]) <= 1e-5


@pytest.mark.parametrize("strategy", ["ios_like", "dp"])
def test_scheduled_with_fused_kernels_equals_eager(case: Case, strategy: str) -> None:
    schedules = [make_schedule(case.graph, BUILDERS[strategy], b, model=case.name, kernels="fused") for b in BATCHES]
    scheduled = ScheduledModule(case.model, schedules)
    for batch, x in case.inputs.items():
        with torch.no_grad():
            assert relative_error(scheduled(x), case.expected[batch]) <= 1e-5
