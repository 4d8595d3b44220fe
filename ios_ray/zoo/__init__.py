"""The model zoo: the CNNs of the IOS paper as plain, fx-traceable torch modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from ios_ray.zoo.inception_v3 import inception_v3
from ios_ray.zoo.nasnet_a import nasnet_a
from ios_ray.zoo.randwire import randwire
from ios_ray.zoo.squeezenet import squeezenet


@dataclass(frozen=True)
class ZooModel:
    """A named model factory with the per-sample input shape it expects."""

    name: str
    build: Callable[[], nn.Module]  # a fresh model in eval mode, default random init
    input_shape: tuple[int, int, int]  # per-sample (C, H, W)
    description: str


ZOO: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("inception_v3", inception_v3, (3, 299, 299),
             "Inception V3 (Szegedy et al. 2016): 11 Inception blocks, no auxiliary classifier"),
    ZooModel("squeezenet", squeezenet, (3, 224, 224),
             "SqueezeNet 1.0 with simple bypass (Iandola et al. 2016)"),
    ZooModel("nasnet_a", nasnet_a, (3, 331, 331),
             "NASNet-A Large 6@4032 (Zoph et al. 2018): 3 stacks of 6 normal cells, 2+2 reduction cells"),
    ZooModel("randwire", randwire, (3, 224, 224),
             "RandWire-WS(32, 4, 0.75) small regime, C=78, seed 0 (Xie et al. 2019)"),
)}

