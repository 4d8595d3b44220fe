"""A stand-in for timm (tests only): ``create_model``, ``is_model``, ``list_models``, ``get_pretrained_cfg``, and the
``pretrained_cfg``/``default_cfg`` dict a created model carries, as in timm's ``_builder.py``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from tests.idiom_models import TimmStyle

__version__ = "0.0+fake"


@dataclass
class PretrainedCfg:
    """The part of timm's pretrained config ios-ray reads."""

    input_size: tuple[int, int, int] = (3, 224, 224)
    num_classes: int = 1000


_MODELS = {"timm_style": (TimmStyle, PretrainedCfg(input_size=(3, 40, 40)))}


def _arch(name: str) -> str:
    return name.partition(".")[0]


def is_model(model_name: str) -> bool:
    return _arch(model_name) in _MODELS


def list_models(filter: str = "", **kwargs: Any) -> list[str]:
    return sorted(_MODELS)


def get_pretrained_cfg(model_name: str, allow_unregistered: bool = True) -> PretrainedCfg | None:
    entry = _MODELS.get(_arch(model_name))
    return entry[1] if entry else None


def create_model(model_name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    if pretrained:
        raise RuntimeError("the fake timm downloads nothing")
    if not is_model(model_name):
        raise RuntimeError(f"Unknown model ({model_name})")
    cls, config = _MODELS[_arch(model_name)]
    model = cls(**kwargs)
    model.pretrained_cfg = asdict(config)
    model.default_cfg = model.pretrained_cfg
    return model
