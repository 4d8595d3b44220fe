"""Models of outside libraries by name, for model specs: ``torchvision:resnet50``, ``timm:efficientnet_b0``,
``smp:FPN`` or ``smp:FPN/efficientnet-b0`` (segmentation-models-pytorch: an architecture over an encoder, resnet34
unless named), ``ultralytics:yolov8n`` (an Ultralytics YOLO built from its own ``yolov8n.yaml``).

A library is imported only when a spec names it. The model is built in eval mode with random weights (nothing is
downloaded: torchvision's ``weights=None``, with ``weights_backbone=None`` where a model takes a backbone; timm's
``pretrained=False``; smp's ``encoder_weights=None``; Ultralytics builds from its config, offline), and the
per-sample input shape comes from the library's own configuration where it has one: for torchvision, the
``image_size`` a model built without weights fixes (its vision transformers), else the crop size of its default
weights (``get_model_weights(name).DEFAULT.transforms().crop_size``; for segmentation models, which crop nothing,
the ``resize_size``); the ``input_size`` of timm's pretrained config (``timm.get_pretrained_cfg(name)``, or a
model's ``pretrained_cfg``/``default_cfg``); Ultralytics' default image size (640, classifiers 224); smp has none,
so 3x512x512 (its sizes must divide by 32). A missing library or an unknown name is one sentence.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
from types import ModuleType
from typing import Any, Callable

import torch
from torch import nn

from ios_ray.errors import UserError, first_line

#: The spec prefixes this module resolves.
LIBRARIES = ("torchvision", "timm", "smp", "ultralytics")
#: The input of an smp model, which names none: a common segmentation size, divisible by its output stride.
SMP_INPUT_SHAPE = (3, 512, 512)


def library_model(library: str, name: str) -> tuple[Callable[[], nn.Module], tuple[int, ...] | None]:
    """The factory of model ``name`` of ``library`` (one of :data:`LIBRARIES`) and the per-sample input shape its
    configuration gives (None where it gives none)."""
    return {"torchvision": _torchvision, "timm": _timm, "smp": _smp, "ultralytics": _ultralytics}[library](name)


def _torchvision(name: str) -> tuple[Callable[[], nn.Module], tuple[int, ...] | None]:
    """A torchvision model by the name ``torchvision.models.get_model`` knows."""
    models = _import("torchvision.models", "torchvision")
    if not hasattr(models, "get_model"):
        raise UserError("torchvision:NAME specs need torchvision 0.14 or later (torchvision.models.get_model); "
                        "upgrade it, or give package.module:factory.")
    known = list(models.list_models())
    if name not in known:
        raise UserError(f"torchvision has no model {name!r}{_close(name, known)}; "
                        "torchvision.models.list_models() lists them.")

    no_weights = {"weights": None}
    if "weights_backbone" in inspect.signature(models.get_model_builder(name)).parameters:
        no_weights["weights_backbone"] = None  # segmentation and detection models load an ImageNet backbone else

    def build() -> nn.Module:
        return models.get_model(name, **no_weights).eval()
    return build, _built_image_size(build) or _torchvision_shape(models, name)


def _built_image_size(build: Callable[[], nn.Module]) -> tuple[int, ...] | None:
    """3 x size x size where the model, built on the meta device, fixes its input size (``image_size``): a
    torchvision ViT built without weights takes 224 even where its default weights were trained at 518."""
    try:
        with torch.device("meta"):
            size = getattr(build(), "image_size", None)
    except Exception:  # noqa: BLE001 - a model that cannot be built on meta fails later, in one sentence
        return None
    return (3, size, size) if isinstance(size, int) and size > 0 else None


def _torchvision_shape(models: ModuleType, name: str) -> tuple[int, ...] | None:
    """3 x crop x crop from the preprocessing of the model's default weights, where it has them; a segmentation
    model's preprocessing crops nothing, so there the size it resizes to."""
    try:
        transforms = models.get_model_weights(name).DEFAULT.transforms()
    except (AttributeError, ValueError, KeyError, TypeError):
        return None
    crop = getattr(transforms, "crop_size", None) or getattr(transforms, "resize_size", None)
    if isinstance(crop, (list, tuple)) and crop:
        crop = list(crop) * 2 if len(crop) == 1 else list(crop)
        return (3, int(crop[0]), int(crop[1]))
    return (3, int(crop), int(crop)) if isinstance(crop, int) else None


def _timm(name: str) -> tuple[Callable[[], nn.Module], tuple[int, ...] | None]:
    """A timm model by the name ``timm.create_model`` knows (an architecture, optionally ``.tag``)."""
    timm = _import("timm", "timm")
    if ":" in name or not timm.is_model(name):
        raise UserError(f"timm has no model {name!r}{_close(name, list(timm.list_models()))}; "
                        "timm.list_models() lists them.")

    def build() -> nn.Module:
        return timm.create_model(name, pretrained=False).eval()
    return build, _timm_shape(timm, name)


def _timm_shape(timm: ModuleType, name: str) -> tuple[int, ...] | None:
    """The ``input_size`` of the model's pretrained config: ``timm.get_pretrained_cfg``, else the ``pretrained_cfg``
    (older timm: ``default_cfg``) of the model built on the meta device (no memory, no weights)."""
    try:
        if hasattr(timm, "get_pretrained_cfg"):
            config: Any = timm.get_pretrained_cfg(name)
        else:
            with torch.device("meta"):
                model = timm.create_model(name, pretrained=False)
            config = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    except Exception:  # noqa: BLE001 - no config is not an error: the default shape applies
        return None
    size = config.get("input_size") if isinstance(config, dict) else getattr(config, "input_size", None)
    return tuple(int(n) for n in size) if size else None


def _smp(name: str) -> tuple[Callable[[], nn.Module], tuple[int, ...] | None]:
    """A segmentation-models-pytorch architecture (``FPN``, ``Unet``...) over an encoder (``/efficientnet-b0``;
    resnet34 where none is named)."""
    smp = _import("segmentation_models_pytorch", "smp", "segmentation-models-pytorch")
    arch, _, encoder = name.partition("/")
    architectures = {key.lower(): key for key in getattr(smp, "MODEL_ARCHITECTURES_MAPPING", {})}
    if arch.lower() not in architectures:
        raise UserError(f"smp has no architecture {arch!r}{_close(arch.lower(), list(architectures))}; it has "
                        f"{', '.join(sorted(architectures))}.")
    encoder = encoder or "resnet34"
    encoders = list(smp.encoders.get_encoder_names())
    if encoder not in encoders:
        raise UserError(f"smp has no encoder {encoder!r}{_close(encoder, encoders)}; "
                        "smp.encoders.get_encoder_names() lists them.")

    def build() -> nn.Module:
        return smp.create_model(arch.lower(), encoder_name=encoder, encoder_weights=None).eval()
    return build, SMP_INPUT_SHAPE


def _ultralytics(name: str) -> tuple[Callable[[], nn.Module], tuple[int, ...] | None]:
    """An Ultralytics model of the task its config names (detection, segmentation, pose, oriented boxes,
    classification), from ``NAME.yaml`` in Ultralytics' own configs."""
    os.environ.setdefault("YOLO_OFFLINE", "1")  # never a download or an update check
    os.environ.setdefault("YOLO_VERBOSE", "False")
    tasks = _import("ultralytics.nn.tasks", "ultralytics")
    config = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    try:
        tasks.yaml_model_load(config)
    except FileNotFoundError:
        raise UserError(f"ultralytics has no model config {config!r}; name one of its yaml configs, such as "
                        "yolov8n, yolo11n or yolo11n-seg.") from None
    task = tasks.guess_model_task(config)
    models = {"detect": "DetectionModel", "segment": "SegmentationModel", "pose": "PoseModel", "obb": "OBBModel",
              "classify": "ClassificationModel"}
    if task not in models:
        raise UserError(f"ultralytics:{name} is a {task} model; ios-ray builds {', '.join(models)} models.")
    model_class = getattr(tasks, models[task])

    def build() -> nn.Module:
        return model_class(config, verbose=False).eval()
    return build, (3, 224, 224) if task == "classify" else (3, 640, 640)


def _import(module: str, library: str, package: str | None = None) -> ModuleType:
    """Import a library's module; a missing or broken library is one sentence (``package``: its name for pip)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"model specs {library}:NAME need {library}, which is not installed here; install it "
                        f"(pip install {package or library}) or give package.module:factory.") from None
    except Exception as exc:  # noqa: BLE001 - a library that fails to load (say, against another torch)
        raise UserError(f"{library} is installed but cannot be imported ({type(exc).__name__}: {first_line(exc)}); "
                        f"install a {library} that matches this torch.") from exc


def _close(name: str, known: list[str]) -> str:
    """`` (did you mean ...?)`` with the closest known names, or nothing."""
    close = difflib.get_close_matches(name, known, n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""
