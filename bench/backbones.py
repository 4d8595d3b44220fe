"""Backbones that return several feature maps, as model specs for ``bench/model_libraries.py --backbones``
(``bench.backbones:<factory>``): timm's ``features_only`` models (a list of five maps) and torchvision's ResNet-50
FPN (an ``OrderedDict`` of five), with random weights; each needs its library."""

from __future__ import annotations

from torch import nn


def timm_resnet50_features() -> nn.Module:
    """timm's ResNet-50 as a backbone: the maps at strides 2 to 32."""
    import timm

    return timm.create_model("resnet50", features_only=True, pretrained=False)


def timm_efficientnet_b0_features() -> nn.Module:
    """timm's EfficientNet-B0 as a backbone."""
    import timm

    return timm.create_model("efficientnet_b0", features_only=True, pretrained=False)


def timm_convnext_tiny_features() -> nn.Module:
    """timm's ConvNeXt-T as a backbone."""
    import timm

    return timm.create_model("convnext_tiny", features_only=True, pretrained=False)


def torchvision_resnet50_fpn() -> nn.Module:
    """torchvision's ResNet-50 with a feature pyramid (the backbone of its Faster R-CNN), nothing downloaded."""
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    return resnet_fpn_backbone(backbone_name="resnet50", weights=None)


#: The factories, by spec.
BACKBONES = tuple(f"bench.backbones:{factory.__name__}" for factory in (
    timm_resnet50_features, timm_efficientnet_b0_features, timm_convnext_tiny_features, torchvision_resnet50_fpn))
for _spec in BACKBONES:
    globals()[_spec.partition(":")[2]].input_shape = (3, 224, 224)  # type: ignore[attr-defined]
