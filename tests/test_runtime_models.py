"""Every zoo model under every schedule strategy: ScheduledModule's output equals the eager module's.

NASNet-A is checked with one cell per stack (``cell_repeats=1``): the large one is too slow on a CPU, and its
cells repeat the same structure. BatchNorm statistics are randomised so that folding is exercised; inputs are
random. The DP's schedules (under the search's synthetic latencies) are used where the DP is quick. Each strategy's
schedule is made for its own batch size and deployed beside the others in one ScheduledModule, as a folder of a
search's schedules deploys.
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

#: The batch size each strategy's schedule is made for: one ScheduledModule holds them all (it picks a schedule by
#: batch size), so that each model is imported once per kernels rather than once per strategy.
BATCH_OF = {"sequential": 1, "greedy": 2, "ios_like": 3, "dp": 4}
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
        self.inputs = {b: torch.randn(b, *shape, generator=generator) for b in sorted(BATCH_OF.values())}
        with torch.no_grad():
            self.expected = {b: self.model(x) for b, x in self.inputs.items()}
        self.graph = import_module(self.model, self.inputs[1]).graph

    def errors(self, strategies: list[str], kernels: str) -> dict[str, float]:
        """Each strategy's relative error against eager, its schedule (for its own batch size, run with ``kernels``)
        deployed beside the others' in one ScheduledModule."""
        schedules = [make_schedule(self.graph, BUILDERS[s], BATCH_OF[s], model=self.name, kernels=kernels)
                     for s in strategies]
        scheduled = ScheduledModule(self.model, schedules)
        errors = {}
        for strategy in strategies:
            x = self.inputs[BATCH_OF[strategy]]
            assert scheduled.schedule_for(x).batch == BATCH_OF[strategy]
            with torch.no_grad():
                errors[strategy] = relative_error(scheduled(x), self.expected[BATCH_OF[strategy]])
        return errors


#: The models whose import and schedules take seconds each: run by `.ci/run` after the default suite, which keeps
#: SqueezeNet.
SLOW = ("inception_v3", "nasnet_a", "randwire")


@pytest.fixture(scope="module",
                params=[pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in MODELS])
def case(request: pytest.FixtureRequest) -> Case:
    return Case(request.param)


def test_scheduled_equals_eager(case: Case) -> None:
    errors = case.errors(list(BUILDERS), "eager")
    assert all(error <= 1e-5 for error in errors.values()), errors


def test_scheduled_with_fused_kernels_equals_eager(case: Case) -> None:
    errors = case.errors(["ios_like", "dp"], "fused")
    assert all(error <= 1e-5 for error in errors.values()), errors
