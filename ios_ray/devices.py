"""Device labels (what the user types) and the Ray resources that request them: a pure grammar.

Labels:

* ``cpu``: the CPUs of a node, measured for real.
* ``cuda`` / ``cuda:<i>``: any GPU / GPU ``i`` of the driver's node, measured for real.
* a GPU name (``v100``, ``k80``, ``2080ti``, ``a100``, ``h100``, ``t4``, ``a10g``, ``l4``): one GPU of that model
  anywhere in the Ray cluster, measured for real.
* ``sim:<gpu>`` for the GPUs of the analytical model (``ios_ray.profiler.sim_model``; their datasheets in
  ``ios_ray.gpu_sheets``): simulated, never measured.

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

How a device is fingerprinted (what it really is, so that measurements are reused only on the same
device and software) is the profiler's job: :mod:`ios_ray.profiler.fingerprint`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ios_ray.errors import DeviceUnavailable
from ios_ray.gpu_sheets import SHEETS
from ios_ray.vocabulary import SIM_PREFIX

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

#: The GPUs the analytical sim model knows (``sim:<gpu>``): those with a datasheet.
SIM_GPUS: tuple[str, ...] = tuple(SHEETS)


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
    return ("cpu", "cuda", "cuda:<i>", *GPU_MODELS, *(f"{SIM_PREFIX}{g}" for g in SIM_GPUS))


def parse_device(label: str) -> DeviceSpec:
    """Parse a device label; an unknown one raises DeviceUnavailable listing the known labels."""
    text = label.strip().lower()
    if text == "cpu":
        return DeviceSpec("cpu", "cpu", resources=("CPU",))
    if text == "cuda":
        return DeviceSpec("cuda", "cuda", resources=("GPU",))
    if text.startswith("cuda:") and text[5:].isdigit():
        return DeviceSpec(text, "cuda", index=int(text[5:]), resources=("GPU",))
    if text in GPU_MODELS:
        return DeviceSpec(text, "gpu", gpu=text, resources=GPU_MODELS[text].resources)
    if text.startswith(SIM_PREFIX) and text.removeprefix(SIM_PREFIX) in SIM_GPUS:
        gpu = text.removeprefix(SIM_PREFIX)
        return DeviceSpec(text, "sim", gpu=gpu, resources=GPU_MODELS[gpu].resources)
    raise DeviceUnavailable(f"unknown device {label!r}; known devices are: {', '.join(known_labels())}.")
