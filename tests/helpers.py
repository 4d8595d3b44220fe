"""Helpers shared by the tests: randomised models, error measures, zoo graphs and plans, the CLI in this process, what
a captured forward holds."""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import nn
from typer.testing import CliRunner

from ios_ray.runtime.accuracy import relative_error
from ios_ray.app.search.budgets import BudgetRule, MemoryBudget
from ios_ray.devices import parse_device
from ios_ray.frontend import import_model
from ios_ray.ir import Graph
from ios_ray.profiler.jobs import ModelSource
from ios_ray.runtime.cuda_graph import CapturedForward, GraphKey
from ios_ray.scheduler import SearchParams, plan_graph
from ios_ray.scheduler.correction import plausible
from ios_ray.scheduler.plan import Plan
from ios_ray.schedule import CandidateRun
from ios_ray.store import LatencyStore

__all__ = ["GIVEN_KERNELS", "HANG_S", "NAMED_KERNELS", "ios_ray_here", "open_store", "randomise_batchnorm", "relative_error", "tf32"]

#: How long a test waits for a command or process it started before calling it hung: a guard against hangs, never a
#: speed target (those live in bench/), so generous enough for a 2-core machine that others load many times over.
HANG_S = 900

#: The kernels a CPU search names where the test is not about choosing them: ``auto`` would time the sequential
#: schedule with each kernels and, where Inductor's are kept, compile every candidate of the check (tests/test_kernels.py
#: and the README's examples test the choice). ``GIVEN_KERNELS`` is the same as the CLI's option.
NAMED_KERNELS = "fused"
GIVEN_KERNELS = ("--kernels", NAMED_KERNELS)


def processes_holding(text: str, part: str) -> list[int]:
    """The other processes running whose ``/proc/<pid>/<part>`` (``cmdline``, ``environ``: NUL-separated strings)
    holds ``text`` (where ``text`` ends in a NUL, the last string counts as ended by one too)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if text.encode() in (entry / part).read_bytes() + b"\0":
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def open_store(path: str | os.PathLike[str], create: bool = True) -> LatencyStore:
    """The latency store at ``path``, created where missing if ``create`` (the library's ``LatencyStore``)."""
    return LatencyStore(path, create=create)


@contextmanager
def tf32(conv: bool, matmul: bool) -> Iterator[None]:
    """TF32 allowed or not in cuDNN convolutions and cuBLAS matmuls inside the block, restored after it (set and
    read directly: torch serves the matmul flag from a ``__getattr__``, and pytest 9.2's monkeypatch, finding it
    in no ``__dict__``, undoes it with a ``delattr`` that fails)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = conv, matmul
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def ios_ray_here(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``ios-ray ARGS`` in this process (on the session's Ray, torch already imported), in ``cwd``, as a
    subprocess would; an exception that escapes the command (a traceback, for a user) fails the test."""
    from ios_ray.app.cli import app

    here = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, list(args), prog_name="ios-ray")
    finally:
        os.chdir(here)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"ios-ray {' '.join(args)} raised instead of failing in one sentence") \
            from result.exception
    return subprocess.CompletedProcess(["ios-ray", *args], result.exit_code, result.stdout, result.stderr)


def randomise_batchnorm(module: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm random running statistics and affine parameters, so that folding is exercised."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for bn in module.modules():
            if isinstance(bn, nn.BatchNorm2d) and bn.running_mean is not None:  # none: batch statistics
                size = bn.num_features
                bn.running_mean.copy_(torch.rand(size, generator=generator) - 0.5)
                bn.running_var.copy_(torch.rand(size, generator=generator) + 0.5)
                if bn.affine:
                    bn.weight.copy_(torch.rand(size, generator=generator) + 0.5)
                    bn.bias.copy_(torch.rand(size, generator=generator) - 0.5)
    return module.eval()


@lru_cache(maxsize=None)
def zoo_graph(name: str) -> Graph:
    """A zoo model's graph, imported once per test session."""
    return import_model(name).graph


@lru_cache(maxsize=None)
def zoo_plan(name: str, r: int = 3, s: int = 8) -> Plan:
    """A zoo model's plan at (r, s), made once per test session (NASNet-A's takes seconds)."""
    return plan_graph(zoo_graph(name), SearchParams(r=r, s=s))


def actor_pid(actor: object, timeout: float | None = None) -> int:
    """The process id of a Ray actor (to kill it and watch it recover)."""
    import ray

    return ray.get(actor.__ray_call__.remote(lambda _: os.getpid()), timeout=timeout)  # type: ignore[attr-defined]


def killed(actor: object) -> bool:
    """Whether a Ray actor was killed for good: polled (Ray kills asynchronously, so a call made just before it lands
    still runs) until a call fails as on a dead actor, or HANG_S."""
    import ray

    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        try:
            actor_pid(actor, timeout=HANG_S)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.05)
    return False


def spec_source(spec: str) -> ModelSource:
    """What actors rebuild a model spec from, at the spec's own input shape."""
    from ios_ray.models import resolve_model

    return ModelSource(spec, resolve_model(spec).input_shape, spec=spec)


def captured_shapes(captured: CapturedForward) -> tuple[GraphKey, ...]:
    """The (shape, dtype) of every input shape that currently has a captured graph in ``captured``."""
    return tuple(captured._graphs)


def plausible_runs(candidates: Iterable[CandidateRun]) -> int:
    """How many of a check's candidates, stored as runs, a fit of the correction uses (those measured within
    :data:`~ios_ray.scheduler.correction.PLAUSIBLE_RATIO` of their stage sum)."""
    return sum(plausible(c.predicted_ms or 0.0, c.ms) for c in candidates)


def search_budget(given: str | int | None, device: str, module: nn.Module, memory_bytes: int | None = None
                  ) -> MemoryBudget | None:
    """The budget a search keeps to on ``device`` for the budget as given, through the library's steps: parsed
    once (:meth:`BudgetRule.parse`), on the device, resolved with the memory its actor reported."""
    return BudgetRule.parse(given).on(parse_device(device)).resolve(module, memory_bytes)
