"""How far a schedule's output may stray from the eager model's: the relative error of an output, and the tolerance
it is held to (a floor per device and dtype, and a multiple of eager's own rounding error against float64). A wrong
schedule (a unit missed, or run on the wrong input) is off by far more than any tolerance here."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ios_ray.dtypes import copied
from ios_ray.errors import first_line
from ios_ray.frontend import output_tensor


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|, computed in float64."""
    actual, expected = actual.double(), expected.double()
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


#: The largest relative error (:func:`relative_error`) of a schedule's float32 output against eager: on a CPU; on a
#: GPU computing in float32 (cuDNN picks its algorithms per shape, Winograd and FFT ones among them, and a merged
#: convolution has shapes of its own); and on a GPU that may compute convolutions or matrix products in TF32
#: (torch's default for cuDNN convolutions on Ampere and newer: operands rounded to 10 mantissa bits, so folded
#: batch-norms and merged convolutions round differently from eager's). A wrong schedule (a unit missed or run on
#: the wrong input) is off by far more than any of them.
FLOAT32_TOLERANCE = 1e-5
GPU_FLOAT32_TOLERANCE = 1e-4
TF32_TOLERANCE = 1e-2
#: The same for half-precision outputs, about ten times what a schedule of Inception V3 (batch-norms randomised)
#: strays from eager on a CPU: 7e-4 in float16 (10 mantissa bits), 3e-3 in bfloat16 (7 bits).
HALF_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2}


def output_tolerance(device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """How far a schedule's output in ``dtype`` may stray from eager's on ``device`` with torch's current TF32
    settings, whatever the model (the floor of :func:`model_tolerance`)."""
    if dtype in HALF_TOLERANCE:
        return HALF_TOLERANCE[dtype]
    if device.type != "cuda":
        return FLOAT32_TOLERANCE
    tf32 = torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32
    return TF32_TOLERANCE if tf32 else GPU_FLOAT32_TOLERANCE


#: How many times the model's own rounding error (eager in its dtype against eager in float64) a schedule's output
#: may stray from eager: a schedule folds batch-norms, merges convolutions and orders sums otherwise than eager, so
#: it rounds about as much again, while a wrong schedule (a unit missed or run on the wrong input) is off by far more.
OWN_ERROR_MULTIPLE = 10


@dataclass(frozen=True)
class Tolerance:
    """How far a schedule's output may stray from eager: the larger of ``floor`` (:func:`output_tolerance`) and
    :data:`OWN_ERROR_MULTIPLE` times ``own``, eager's own error against float64 (None where the model could not run
    in float64: ``why_not``)."""

    floor: float
    own: float | None
    dtype: str
    note: str = ""
    why_not: str = ""

    @property
    def limit(self) -> float:
        """The largest relative error that passes."""
        return self.floor if self.own is None else max(self.floor, OWN_ERROR_MULTIPLE * self.own)

    def rule(self) -> str:
        """The rule that set the limit, in words (what ``ios-ray run`` prints after the limit)."""
        if self.own is None:
            return (f"{self.floor:.0e}{self.note}; eager could not run in float64 to measure its own error: "
                    f"{self.why_not}")
        return (f"{OWN_ERROR_MULTIPLE}x eager {self.dtype}'s own error against float64 ({self.own:.1e}), at least "
                f"{self.floor:.0e}{self.note}")


def model_tolerance(
    module: nn.Module, x: torch.Tensor, eager: torch.Tensor, floor: float, note: str = "",
) -> Tolerance:
    """The tolerance for a schedule of ``module`` on ``x``, whose eager output (a tensor) is ``eager``: eager is run
    again in float64, on a copy, to measure its own rounding error. ``note`` says what set the floor."""
    dtype = str(x.dtype).removeprefix("torch.")
    try:
        with torch.inference_mode():
            exact = output_tensor(copied(module).double()(x.double()))
    except (RuntimeError, TypeError) as exc:  # an op without float64, or a model that casts to its own dtype
        return Tolerance(floor, None, dtype, note, first_line(exc))
    return Tolerance(floor, relative_error(eager, exact), dtype, note)
