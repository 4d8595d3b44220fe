"""The GPUs the ``sim:<gpu>`` device model knows, by their datasheet figures (used by :mod:`ios_ray.profiler.sim_model`).

Datasheet figures (FP32, boost clock; one K80 board holds two GK210 GPUs and the model is one of them, since
that is what one CUDA device, one Ray GPU, is):

| gpu    | board               | SMs | FP32 cores/SM | peak FP32 TFLOP/s | memory GB/s | launch us* | min kernel us* |
|--------|---------------------|-----|---------------|-------------------|-------------|------------|----------------|
| k80    | Tesla K80 (1 GK210) | 13  | 192           | 4.37              | 240         | 10         | 5              |
| v100   | Tesla V100 SXM2     | 80  | 64            | 15.7              | 900         | 6          | 3              |
| 2080ti | GeForce RTX 2080 Ti | 68  | 64            | 13.4              | 616         | 6          | 3              |
| a100   | A100 SXM4 40 GB     | 108 | 64            | 19.5              | 1555        | 5          | 3              |
| h100   | H100 SXM5           | 132 | 128           | 67.0              | 3350        | 4          | 2.5            |

Sources: NVIDIA Tesla K80 datasheet (2496 cores and 240 GB/s per GPU, 875 MHz boost), Tesla V100 datasheet and
Volta whitepaper, Turing (TU102) whitepaper, A100 datasheet and Ampere whitepaper, H100 datasheet and Hopper
whitepaper. (*) Launch and minimum kernel times are assumptions, not datasheet figures: the host cost of
issuing one kernel from eager PyTorch, and a kernel's fixed ramp-up and tail on the device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSheet:
    """Datasheet figures of one GPU (see the table in the module docstring)."""

    name: str
    sms: int
    cores_per_sm: int
    peak_tflops: float
    bandwidth_gbs: float
    launch_us: float
    min_kernel_us: float


#: The sim GPUs by label (``sim:<label>``).
SHEETS: dict[str, GpuSheet] = {
    s.name: s
    for s in (
        GpuSheet("k80", 13, 192, 4.37, 240, 10.0, 5.0),
        GpuSheet("v100", 80, 64, 15.7, 900, 6.0, 3.0),
        GpuSheet("2080ti", 68, 64, 13.4, 616, 6.0, 3.0),
        GpuSheet("a100", 108, 64, 19.5, 1555, 5.0, 3.0),
        GpuSheet("h100", 132, 128, 67.0, 3350, 4.0, 2.5),
    )
}
