"""Device fingerprints: what a device really is, so measurements are only reused on the same device and software.

A fingerprint is a short content hash of the device's info: for a GPU its model, compute capability, SM count,
driver, torch/CUDA/cuDNN versions, whether float32 convolutions and matrix products may run in TF32, and timing
protocol; for a CPU its model name, thread count, torch version and timing protocol; for a simulated GPU the sim
model's name, version and parameters; and, where a stage's units run other kernels than ``eager``, those kernels
(:meth:`~ios_ray.profiler.jobs.DeviceIdentity.running`: a stage run with other kernels is another measurement, and
eager rows keep the fingerprints they were stored under). A GPU's info also holds its memory, which the fingerprint leaves out
(:data:`NOT_FINGERPRINTED`: it tells a search its default memory budget, and leaving it out keeps the fingerprints of
rows stored before it was recorded). This module probes the machine (torch, CUDA, ``/proc/cpuinfo``,
``nvidia-smi``); the label grammar it starts from is :mod:`ios_ray.devices`.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from typing import Any, Mapping

from ios_ray.devices import DeviceSpec, parse_device
from ios_ray.errors import first_line
from ios_ray.ir import content_hash


def device_fingerprint(
    device: str | DeviceSpec, sim_params: Mapping[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """(fingerprint, info) of the local device behind a label; sim labels need the sim model's parameters."""
    spec = parse_device(device) if isinstance(device, str) else device
    if spec.kind == "sim":
        if sim_params is None:
            raise ValueError("sim devices are fingerprinted by their model parameters: pass sim_params")
        info: dict[str, Any] = {"kind": "sim", "gpu": spec.gpu, **sim_params}
    elif spec.kind == "cpu":
        info = cpu_info()
    else:
        info = gpu_info(spec.index or 0)
    return fingerprint_of(info), info


def fingerprint_of(info: Mapping[str, Any]) -> str:
    """The fingerprint of a device's info: its content hash, less what does not change what a measurement means."""
    return content_hash({k: v for k, v in info.items() if k not in NOT_FINGERPRINTED})


#: Device info that does not change what a measurement means (so not part of the fingerprint).
NOT_FINGERPRINTED = frozenset({"memory_bytes"})


#: The version of the CPU timing protocol, part of a CPU's fingerprint: rows timed another way are not reused.
CPU_TIMING = "primed-1"


def cpu_info() -> dict[str, Any]:
    """What a CPU measurement depends on: model name, torch's thread count, torch version, timing protocol."""
    import torch

    return {
        "kind": "cpu",
        "model": _cpu_model_name(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "timing": CPU_TIMING,
    }


def gpu_info(index: int = 0) -> dict[str, Any]:
    """What a GPU measurement depends on: model, compute capability, SMs, driver, torch/CUDA/cuDNN versions, the TF32
    settings of this process (float32 convolutions and matrix products run other kernels with TF32), timing
    protocol (:func:`~ios_ray.profiler.timing.gpu_protocol`: stages batched into CUDA graphs, timed by events inside
    them, or where this torch cannot record events inside a graph each captured into a graph of its own; rows timed
    eagerly, before the spin or another way are not reused); and its memory in bytes (not fingerprinted)."""
    import torch

    from ios_ray.profiler.timing import gpu_protocol  # loads the runtime: only where a GPU is fingerprinted

    props = torch.cuda.get_device_properties(index)
    return {
        "kind": "gpu",
        "model": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "driver": _driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "tf32_conv": torch.backends.cudnn.allow_tf32,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "timing": gpu_protocol(),
    }


def cuda_problem(spec: DeviceSpec) -> str | None:
    """Why this process's torch cannot run the label's GPU, in one sentence, or None when it can."""
    import torch

    build = f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})"
    card = spec.gpu_model.title if spec.gpu_model else f"GPU {spec.index or 0}"
    try:
        if not torch.cuda.is_available():
            return f"{build} cannot use the {card} on this node: CUDA is not available to it."
        index = spec.index or 0
        if index >= torch.cuda.device_count():
            return f"{build} sees {torch.cuda.device_count()} GPUs on this node, so there is no {spec.label}."
        name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
    except (RuntimeError, AssertionError) as error:
        return f"{build} cannot initialise the {card}: {first_line(error)}."
    if spec.gpu_model and not spec.gpu_model.matches(name):
        return f"the node offers {spec.label} but its GPU is a {name}; fix the node's resources."
    arches = torch.cuda.get_arch_list()
    if not _arch_supported(arches, major, minor):
        return (
            f"{build} has no kernels for the {name} (sm_{major}{minor}; built for {', '.join(arches)}); "
            f"install a torch build that supports sm_{major}{minor} on that node."
        )
    return None


def _arch_supported(arches: list[str], major: int, minor: int) -> bool:
    """Whether a build for ``arches`` runs on compute capability major.minor (same-major SASS or older PTX)."""
    for arch in arches:
        kind, _, number = arch.partition("_")
        if not number.isdigit():
            continue
        a_major, a_minor = int(number[:-1]), int(number[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def _cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform reports."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver_version() -> str:
    """The NVIDIA driver version from nvidia-smi, or 'unknown'."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown"
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0].strip() if out.strip() else "unknown"
