"""Models of torchvision and timm by name (``torchvision:resnet50``, ``timm:efficientnet_b0``), for model specs.

A library is imported only when a spec names it. The model is built in eval mode with random weights (nothing is
downloaded: torchvision's ``weights=None``, with ``weights_backbone=None`` where a model takes a backbone; timm's
``pretrained=False``), and the per-sample input shape comes from the library's own configuration where it has one:
for torchvision, the ``image_size`` a model built without weights fixes (its vision transformers), else the crop
size of its default weights (``get_model_weights(name).DEFAULT.transforms().crop_size``; for segmentation models,
which crop nothing, the ``resize_size``); the ``input_size`` of timm's pretrained config
(``timm.get_pretrained_cfg(name)``, or a model's ``pretrained_cfg``/``default_cfg``). A missing library or an
unknown name is one sentence.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from types import ModuleType
from typing import Any, Callable

import torch
from torch import nn

from ios_ray.errors import UserError, first_line

#: The spec prefixes this module resolves.
LIBRARIES = ("torchvision", "timm")


def library_model(library: str, name: str) -> tuple[Callable[[], nn.Module], tuple[int, ...] | None]:
    """The factory of model ``name`` of ``library`` (``torchvision`` or ``timm``) and the per-sample input shape its
    configuration gives (None where it gives none)."""
    if library == "torchvision":
        return _torchvision(name)
    return _timm(name)


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


def _import(module: str, library: str) -> ModuleType:
    """Import a library's module; a missing or broken library is one sentence."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"model specs {library}:NAME need {library}, which is not installed here; install it "
                        f"(pip install {library}) or give package.module:factory.") from None
    except Exception as exc:  # noqa: BLE001 - a library that fails to load (say, against another torch)
        raise UserError(f"{library} is installed but cannot be imported ({type(exc).__name__}: {first_line(exc)}); "
                        f"install a {library} that matches this torch.") from exc


def _close(name: str, known: list[str]) -> str:
    """`` (did you mean ...?)`` with the closest known names, or nothing."""
    close = difflib.get_close_matches(name, known, n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""
