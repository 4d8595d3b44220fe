"""Device labels (what the user types), the Ray resources that request them, and device fingerprints.

Labels:

* ``cpu``: the CPUs of a node, measured for real.
* ``cuda`` / ``cuda:<i>``: any GPU / GPU ``i`` of the driver's node, measured for real.
* a GPU name (``v100``, ``k80``, ``2080ti``, ``a100``, ``h100``, ``t4``, ``a10g``, ``l4``): one GPU of that model
  anywhere in the Ray cluster, measured for real.
* ``sim:<gpu>`` for the GPUs of the analytical model (``ios_ray.profiler.sim``): simulated, never measured.

A GPU label is requested through Ray by either of two resources; a node offers the label when it has either:

| label  | Ray auto-detected resource           | custom resource |
|--------|--------------------------------------|-----------------|
| v100   | accelerator_type:V100                | V100            |
| k80    | accelerator_type:K80                 | K80             |
| 2080ti | accelerator_type:GeForce-RTX-2080-Ti | 2080Ti          |
| a100   | accelerator_type:A100                | A100            |
| h100   | accelerator_type:H100                | H100            |
| t4     | accelerator_type:T4                  | T4              |
| a10g   | accelerator_type:A10G                | A10G            |
| l4     | accelerator_type:L4                  | L4              |

Ray derives ``accelerator_type`` from the NVML device name; it has no constant for a 2080 Ti and turns the name
"NVIDIA GeForce RTX 2080 Ti" into ``GeForce-RTX-2080-Ti`` (older drivers, without the "NVIDIA" prefix, give the
ambiguous ``RTX-2080``, which is not used). The custom resource is what ``cluster.yaml`` starts nodes with: its
count is the number of GPUs of that model on the node.

A device fingerprint is a short content hash of what the device really is (model, compute capability, driver,
torch/CUDA/cuDNN versions; for a CPU its model name, thread count and torch version; for a simulated GPU the
sim model's name, version and parameters). Measurements are only reused on the same fingerprint.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Mapping

from ios_ray.errors import UserError
from ios_ray.ir import content_hash

if TYPE_CHECKING:
    import torch

DeviceKind = Literal["cpu", "cuda", "gpu", "sim"]


@dataclass(frozen=True)
class GpuModel:
    """One GPU model: its label, the names NVML/torch give it, and the Ray resources that request it."""

    label: str
    title: str
    name_tokens: tuple[str, ...]
    ray_accelerator: str
    custom_resource: str

    @property
    def resources(self) -> tuple[str, ...]:
        """The Ray resources a node may offer this GPU by: Ray's auto-detected one, then the custom one."""
        return (f"accelerator_type:{self.ray_accelerator}", self.custom_resource)

    def matches(self, device_name: str) -> bool:
        """Whether a torch/NVML device name (e.g. 'Tesla V100-SXM2-16GB') is this model."""
        name = device_name.upper().replace(" ", "")
        return any(token in name for token in self.name_tokens)


GPU_MODELS: dict[str, GpuModel] = {
    g.label: g
    for g in (
        GpuModel("v100", "NVIDIA Tesla V100", ("V100",), "V100", "V100"),
        GpuModel("k80", "NVIDIA Tesla K80", ("K80",), "K80", "K80"),
        GpuModel("2080ti", "NVIDIA GeForce RTX 2080 Ti", ("2080TI",), "GeForce-RTX-2080-Ti", "2080Ti"),
        GpuModel("a100", "NVIDIA A100", ("A100",), "A100", "A100"),
        GpuModel("h100", "NVIDIA H100", ("H100",), "H100", "H100"),
        GpuModel("t4", "NVIDIA Tesla T4", ("T4",), "T4", "T4"),
        GpuModel("a10g", "NVIDIA A10G", ("A10G",), "A10G", "A10G"),
        GpuModel("l4", "NVIDIA L4", ("L4",), "L4", "L4"),
    )
}

#: The GPUs the analytical sim model knows (``sim:<gpu>``).
SIM_GPUS: tuple[str, ...] = ("v100", "k80", "2080ti", "a100", "h100")


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed device label: its kind, GPU model (if any), GPU index (``cuda:i``) and the Ray resources."""

    label: str
    kind: DeviceKind
    gpu: str | None = None
    index: int | None = None
    resources: tuple[str, ...] = ()

    @property
    def simulated(self) -> bool:
        """True for ``sim:<gpu>`` labels."""
        return self.kind == "sim"

    @property
    def gpu_model(self) -> GpuModel | None:
        """The GPU model of a GPU or sim label."""
        return GPU_MODELS.get(self.gpu) if self.gpu else None

    def torch_device(self) -> "torch.device":
        """The torch device an actor of this label measures on (under Ray, its one GPU is ``cuda:0``)."""
        import torch

        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", self.index or 0)


def known_labels() -> tuple[str, ...]:
    """Every label :func:`parse_device` accepts (``cuda:<i>`` standing for any GPU index)."""
    return ("cpu", "cuda", "cuda:<i>", *GPU_MODELS, *(f"sim:{g}" for g in SIM_GPUS))


def parse_device(label: str) -> DeviceSpec:
    """Parse a device label; an unknown one raises UserError listing the known labels."""
    text = label.strip().lower()
    if text == "cpu":
        return DeviceSpec("cpu", "cpu", resources=("CPU",))
    if text == "cuda":
        return DeviceSpec("cuda", "cuda", resources=("GPU",))
    if text.startswith("cuda:") and text[5:].isdigit():
        return DeviceSpec(text, "cuda", index=int(text[5:]), resources=("GPU",))
    if text in GPU_MODELS:
        return DeviceSpec(text, "gpu", gpu=text, resources=GPU_MODELS[text].resources)
    if text.startswith("sim:") and text[4:] in SIM_GPUS:
        gpu = text[4:]
        return DeviceSpec(text, "sim", gpu=gpu, resources=GPU_MODELS[gpu].resources)
    raise UserError(f"unknown device {label!r}; known devices are: {', '.join(known_labels())}.")


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
    return content_hash(info), info


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
    """What a GPU measurement depends on: model, compute capability, SMs, driver, torch/CUDA/cuDNN versions."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return {
        "kind": "gpu",
        "model": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "driver": _driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
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
        return f"{build} cannot initialise the {card}: {str(error).splitlines()[0]}."
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
