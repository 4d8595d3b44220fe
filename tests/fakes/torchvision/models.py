"""Fake ``torchvision.models``: ``list_models``, ``get_model``, ``get_model_builder``, ``get_model_weights`` and a
weights enum, as in torchvision's ``models/_api.py``: a builder takes ``weights`` (None: random weights), a
segmentation builder also ``weights_backbone`` (by default ImageNet weights for its backbone), and the enum's members
carry ``transforms``, a preset whose ``crop_size`` (for segmentation, ``resize_size``) is a one-element list."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from tests.idiom_models import ResNetStyle, SegmentationStyle, ShuffleNetStyle


class ImageClassification:
    """The preprocessing preset of classification weights (only what its constructor records)."""

    def __init__(self, *, crop_size: int, resize_size: int = 256) -> None:
        self.crop_size = [crop_size]
        self.resize_size = [resize_size]


@dataclass
class Weights:
    """Pretrained weights: where they live, their preprocessing, their metadata."""

    url: str
    transforms: Callable[..., Any]
    meta: dict[str, Any]


class WeightsEnum(enum.Enum):
    """An enum of weights whose members show the fields of their Weights, as torchvision's does."""

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_value_"), name)


class ResNetStyle_Weights(WeightsEnum):
    IMAGENET1K_V1 = Weights("https://example.invalid/resnet_style.pth",
                            functools.partial(ImageClassification, crop_size=48), {"min_size": (1, 1)})
    DEFAULT = IMAGENET1K_V1


def resnet_style(*, weights: ResNetStyle_Weights | None = None, progress: bool = True) -> nn.Module:
    """A small ResNet; pretrained weights would be downloaded, which tests never want."""
    if weights is not None:
        raise RuntimeError("the fake torchvision downloads nothing")
    return ResNetStyle()


class FixedSizeStyle(ResNetStyle):
    """A model that fixes its input size when built, as torchvision's vision transformers do (``image_size``)."""

    image_size = 40

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.shape[2] == self.image_size, f"Wrong image height! Expected {self.image_size}")
        return super().forward(x)


class FixedSizeStyle_Weights(WeightsEnum):
    IMAGENET1K_SWAG_E2E_V1 = Weights("https://example.invalid/fixed_size_style.pth",
                                     functools.partial(ImageClassification, crop_size=96), {"min_size": (96, 96)})
    DEFAULT = IMAGENET1K_SWAG_E2E_V1


def fixed_size_style(*, weights: FixedSizeStyle_Weights | None = None, progress: bool = True) -> nn.Module:
    """Built without weights it takes 40x40 inputs; its default weights' preset crops 96x96."""
    if weights is not None:
        raise RuntimeError("the fake torchvision downloads nothing")
    return FixedSizeStyle()


class SemanticSegmentation:
    """The preprocessing preset of segmentation weights: it resizes, and crops nothing."""

    def __init__(self, *, resize_size: int) -> None:
        self.resize_size = [resize_size]


class SegmentationStyle_Weights(WeightsEnum):
    COCO_WITH_VOC_LABELS_V1 = Weights("https://example.invalid/segmentation_style.pth",
                                      functools.partial(SemanticSegmentation, resize_size=40), {})
    DEFAULT = COCO_WITH_VOC_LABELS_V1


def segmentation_style(*, weights: SegmentationStyle_Weights | None = None, progress: bool = True,
                       weights_backbone: ResNetStyle_Weights | None = ResNetStyle_Weights.IMAGENET1K_V1,
                       **kwargs: Any) -> nn.Module:
    """A small DeepLabV3 returning ``{"out": logits}``; as torchvision's, it loads ImageNet weights into its backbone
    unless ``weights_backbone=None``."""
    if weights is not None or weights_backbone is not None:
        raise RuntimeError("the fake torchvision downloads nothing")
    return SegmentationStyle()


def shufflenet_style(*, weights: None = None, progress: bool = True) -> nn.Module:
    """A small ShuffleNet without weights (and so without a preset)."""
    return ShuffleNetStyle()


BUILTIN_MODELS: dict[str, Callable[..., nn.Module]] = {"resnet_style": resnet_style,
                                                       "shufflenet_style": shufflenet_style,
                                                       "fixed_size_style": fixed_size_style,
                                                       "segmentation_style": segmentation_style}
_WEIGHTS = {"resnet_style": ResNetStyle_Weights, "fixed_size_style": FixedSizeStyle_Weights,
            "segmentation_style": SegmentationStyle_Weights}


def list_models(module: Any = None) -> list[str]:
    return sorted(BUILTIN_MODELS)


def get_model_builder(name: str) -> Callable[..., nn.Module]:
    if name.lower() not in BUILTIN_MODELS:
        raise ValueError(f"Unknown model {name}")
    return BUILTIN_MODELS[name.lower()]


def get_model(name: str, **config: Any) -> nn.Module:
    return get_model_builder(name)(**config)


def get_model_weights(name: str) -> type[WeightsEnum]:
    if name not in _WEIGHTS:
        raise ValueError("The WeightsEnum class for the specific method couldn't be retrieved.")
    return _WEIGHTS[name]
