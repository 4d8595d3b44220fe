"""Device labels, their Ray resources, fingerprints, and the check that torch can run a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager
from ray.util import accelerators

from ios_ray.devices import GPU_MODELS, SIM_GPUS, known_labels, parse_device
from ios_ray.profiler.fingerprint import _arch_supported, cuda_problem, device_fingerprint
from ios_ray.errors import UserError
from ios_ray.ir import content_hash


@pytest.mark.parametrize(
    "label, kind, gpu, resources",
    [
        ("cpu", "cpu", None, ("CPU",)),
        ("cuda", "cuda", None, ("GPU",)),
        ("v100", "gpu", "v100", ("accelerator_type:V100", "V100")),
        ("K80", "gpu", "k80", ("accelerator_type:K80", "K80")),
        ("2080ti", "gpu", "2080ti", ("accelerator_type:GeForce-RTX-2080-Ti", "2080Ti")),
        ("sim:h100", "sim", "h100", ("accelerator_type:H100", "H100")),
    ],
)
def test_parse_device(label: str, kind: str, gpu: str | None, resources: tuple[str, ...]) -> None:
    spec = parse_device(label)
    assert (spec.kind, spec.gpu, spec.resources) == (kind, gpu, resources)
    assert spec.label == label.lower()


def test_cuda_index() -> None:
    spec = parse_device(" cuda:1 ")
    assert (spec.label, spec.kind, spec.index) == ("cuda:1", "cuda", 1)
    assert spec.torch_device() == torch.device("cuda", 1)
    assert parse_device("cpu").torch_device() == torch.device("cpu")


@pytest.mark.parametrize("label", ["tpu", "sim:t4", "cuda:x", "sim:", ""])
def test_unknown_label_lists_known_ones(label: str) -> None:
    with pytest.raises(UserError) as error:
        parse_device(label)
    message = str(error.value)
    assert "\n" not in message and message.endswith(".") and message.count(". ") == 0
    assert all(known in message for known in ("cpu", "cuda:<i>", "v100", "2080ti", "sim:k80"))


def test_every_known_label_parses() -> None:
    for label in known_labels():
        if label != "cuda:<i>":
            assert parse_device(label).label == label
    assert set(SIM_GPUS) == {"v100", "k80", "2080ti", "a100", "h100"}


def test_ray_accelerator_names_match_ray() -> None:
    assert GPU_MODELS["v100"].ray_accelerator == accelerators.NVIDIA_TESLA_V100
    assert GPU_MODELS["k80"].ray_accelerator == accelerators.NVIDIA_TESLA_K80
    assert GPU_MODELS["a100"].ray_accelerator == accelerators.NVIDIA_A100
    assert GPU_MODELS["h100"].ray_accelerator == accelerators.NVIDIA_H100
    derived = NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type("NVIDIA GeForce RTX 2080 Ti")
    assert GPU_MODELS["2080ti"].ray_accelerator == derived


def test_gpu_names_match_models() -> None:
    assert GPU_MODELS["v100"].matches("Tesla V100-SXM2-16GB")
    assert GPU_MODELS["2080ti"].matches("NVIDIA GeForce RTX 2080 Ti")
    assert not GPU_MODELS["k80"].matches("Tesla T4")


def test_cpu_fingerprint_is_stable() -> None:
    first, info = device_fingerprint("cpu")
    second, _ = device_fingerprint(parse_device("cpu"))
    assert first == second and len(first) == 24
    assert {"model", "threads", "torch"} <= set(info) and info["threads"] == torch.get_num_threads()


def test_sim_fingerprint_follows_parameters() -> None:
    params = {"model": "ios-ray-sim", "version": 1, "sheet": {"sms": 80}}
    first, info = device_fingerprint("sim:v100", sim_params=params)
    assert info["gpu"] == "v100" and device_fingerprint("sim:v100", sim_params=params)[0] == first
    assert device_fingerprint("sim:v100", sim_params={**params, "version": 2})[0] != first
    with pytest.raises(ValueError):
        device_fingerprint("sim:v100")


def test_a_gpus_info_holds_its_memory_and_its_fingerprint_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory tells a search its default budget; rows stored before it was recorded keep their fingerprint."""
    def board(memory: int) -> SimpleNamespace:
        return SimpleNamespace(name="NVIDIA A100-SXM4-40GB", major=8, minor=0, multi_processor_count=108,
                               total_memory=memory)

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: board(40 << 30))
    first, info = device_fingerprint("cuda:0")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: board(80 << 30))
    second, _ = device_fingerprint("cuda:0")
    assert info["memory_bytes"] == 40 << 30 and first == second
    assert first == content_hash({k: v for k, v in info.items() if k != "memory_bytes"})


def test_arch_support() -> None:
    cuda12 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    assert not _arch_supported(cuda12, 3, 7)
    assert _arch_supported(cuda12, 7, 0) and _arch_supported(cuda12, 8, 9)
    assert _arch_supported(["sm_35", "compute_35"], 3, 7)
    assert not _arch_supported(["sm_80"], 9, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_problem_names_card_and_build() -> None:
    problem = cuda_problem(parse_device("k80"))
    assert problem is not None and "Tesla K80" in problem and torch.__version__ in problem
    assert problem.endswith(".") and "\n" not in problem
