"""Measurement jobs (what the driver sends out: stages, or whole schedules to check, and the model they come from)
and latency rows (what comes back, in the store's columns)."""

from __future__ import annotations

import dataclasses
import json
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal, Mapping

from ios_ray.errors import UserError
from ios_ray.ir import Graph
from ios_ray.profiler.fingerprint import fingerprint_of
from ios_ray.profiler.protocol import Timing
from ios_ray.schedule import Schedule
from ios_ray.stage import Stage
from ios_ray.vocabulary import (DEFAULT_CHECK_CONFIDENCE, DEFAULT_CHECK_ROUNDS, DEFAULT_CHECK_SECONDS, DEFAULT_DTYPE,
                                EAGER_KERNELS, KERNEL_VERSIONS)

Source = Literal["measured", "simulated"]

@dataclass(frozen=True)
class ModelSource:
    """A model an actor can rebuild: a spec to build, or a Ray object reference to the driver's ``nn.Module``."""

    name: str
    input_shape: tuple[int, ...]
    spec: str | None = None
    module_ref: Any = None

    @property
    def key(self) -> str:
        """What identifies the model on an actor (for caching what was built from it)."""
        if self.spec is not None:
            return self.spec
        if self.module_ref is None:
            raise ValueError(f"model {self.name!r} has neither a spec nor an object to rebuild it from")
        return f"object:{self.module_ref.hex()}"


def refuse_another_graph(model: str, built: str, driver: str, host: str) -> None:
    """UserError where model ``model``, built on ``host``, imported to another graph fingerprint (``built``) than on
    the driver (``driver``): that node runs other code."""
    if built != driver:
        raise UserError(f"model {model!r} imports to a different graph on {host} than on the driver; install the same "
                        "ios-ray, torch and model code on every node.")


@dataclass(frozen=True)
class MeasureJob:
    """One stage to measure: its key and canonical description, the graph it comes from, batch, dtype and the kernels
    its units run with (:mod:`~ios_ray.runtime.kernels`).

    ``model`` says where the actor gets the model whose code the stage's callables run (its name is stored with
    the row).
    """

    key: str
    stage: Stage
    description: str
    graph: Graph
    model: ModelSource
    batch: int
    dtype: str = DEFAULT_DTYPE
    kernels: str = EAGER_KERNELS

    @property
    def measurement(self) -> tuple[str, int, str, str]:
        """What makes two jobs the same measurement on one device: stage key, batch, dtype and kernels."""
        return (self.key, self.batch, self.dtype, self.kernels)


@dataclass(frozen=True)
class CheckJob:
    """Whole schedules of one model, by name, to time end to end in rounds at one batch size and dtype against the
    one named ``baseline`` (the search's check: :func:`~ios_ray.runtime.compare.contest`), until the interval of the
    ratio of the best of them over the baseline decides at ``confidence`` (shared among the candidates), after at
    most ``rounds`` rounds, or at the look past which ``max_seconds`` would run out. Each schedule runs with its own
    kernels. Then the schedule kept runs against the model as is for at most ``as_is_rounds`` rounds (0: not at
    all, as by default; a simulated device never does). Regions of ``inductor`` kernels compile before the first
    round beside ``compile_workers`` worker processes (None: as many as the host offers,
    :func:`~ios_ray.runtime.ahead.default_workers`)."""

    model: ModelSource
    graph: Graph
    schedules: dict[str, Schedule]
    baseline: str
    batch: int
    rounds: int = DEFAULT_CHECK_ROUNDS
    warmup: int = 2
    dtype: str = DEFAULT_DTYPE
    confidence: float = DEFAULT_CHECK_CONFIDENCE
    max_seconds: float | None = DEFAULT_CHECK_SECONDS
    as_is_rounds: int = 0
    compile_workers: int | None = None


@dataclass(frozen=True)
class DeviceIdentity:
    """Who measured: the device label, its fingerprint and info, the host, and whether it is simulated."""

    label: str
    fingerprint: str
    info: Mapping[str, Any]
    host: str
    source: Source

    @property
    def kernels(self) -> str:
        """The kernels the device runs stages with."""
        return str(self.info.get("kernels", EAGER_KERNELS))

    def running(self, kernels: str) -> "DeviceIdentity":
        """The device running stages with ``kernels``: its info says so, with the kernels' version where it is not
        the first (eager: not at all, so rows measured before kernels keep their fingerprint), and its fingerprint
        follows."""
        info = {k: v for k, v in self.info.items() if k not in ("kernels", "kernels_version")}
        if kernels != EAGER_KERNELS:
            info["kernels"] = kernels
        if kernels in KERNEL_VERSIONS:
            info["kernels_version"] = KERNEL_VERSIONS[kernels]
        return dataclasses.replace(self, fingerprint=fingerprint_of(info), info=info)


def local_identity(label: str, fingerprint: str, info: Mapping[str, Any], source: Source) -> DeviceIdentity:
    """The identity of a device measured by this process, on this host."""
    return DeviceIdentity(label, fingerprint, info, socket.gethostname(), source)


def make_row(job: MeasureJob, timing: Timing, device: DeviceIdentity) -> dict[str, Any]:
    """One latency row, with exactly the store's columns (:data:`~ios_ray.store.schema.STORE_SCHEMA`, their one home).

    A GPU stage timed uncaptured (it could not be captured into a CUDA graph) says so in its ``device_info``, under
    ``uncaptured`` (why); the fingerprint stays the device's, so the row is reused like any other: the same stage
    on the same device and software would fail to capture again.
    """
    info = dict(device.info) if timing.uncaptured is None else {**device.info, "uncaptured": timing.uncaptured}
    return {
        "stage_key": job.key,
        "device": device.label,
        "device_fingerprint": device.fingerprint,
        "device_info": json.dumps(info, sort_keys=True),
        "batch": job.batch,
        "dtype": job.dtype,
        "strategy": job.stage.strategy,
        "source": device.source,
        "median_ms": timing.median_ms,
        "p10_ms": timing.p10_ms,
        "p90_ms": timing.p90_ms,
        "samples": timing.samples,
        "warmup": timing.warmup,
        "repeat": timing.repeat,
        "host": device.host,
        "measured_at": datetime.now(timezone.utc),
        "stage": job.description,
        "model": job.model.name,
    }
