"""Rules for the ops that resize a feature map's two spatial dimensions: upsampling, pads and crops.

* ``upsample``: ``nn.Upsample`` (and its nearest and bilinear subclasses) or ``F.interpolate`` of a 4-d tensor in
  ``nearest`` or ``bilinear`` mode, as decoders (FPN, U-Net, YOLO's neck) upsample;
* ``pad``: a pad of the spatial dimensions of a 4-d tensor, constant (``nn.ZeroPad2d``, ``nn.ConstantPad2d``,
  ``F.pad``) or by reflection, replication or circularly (``nn.ReflectionPad2d``, ``nn.ReplicationPad2d``,
  ``nn.CircularPad2d``, ``F.pad(x, pads, mode)``), a crop of them (``x[:, :, 1:, 1:]``), or a constant pad whose only
  reader crops it (NASNet's shift by one pixel, ``ZeroPad2d((0, 1, 0, 1))`` then ``[:, :, 1:, 1:]``) as one unit. Its
  ``pads`` are (left, right, top, bottom), a crop negative, so a pad and a crop with the same effect share a stage
  key; ``value`` is the padding, and ``mode`` the mode where it is not constant.

Both run the original code (the unit's ``refs['nodes']``); their attributes say what it computes.
"""

from __future__ import annotations

import operator
from typing import Any, cast

import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ios_ray.frontend.match import Match, Scope
from ios_ray.frontend.nodes import calls, full_shape, is_tensor, module_of, normalized_kwargs, only_user

_UPSAMPLE_MODULES = (nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d)
_PAD_MODULES = (nn.ZeroPad2d, nn.ConstantPad2d)
#: Pads that repeat the input's own values, by mode.
_MODE_PAD_MODULES = {nn.ReflectionPad2d: "reflect", nn.ReplicationPad2d: "replicate", nn.CircularPad2d: "circular"}
_PAD_MODES = ("constant", *_MODE_PAD_MODULES.values())
_MODES = ("nearest", "bilinear")


def match_upsample(scope: Scope, node: fx.Node) -> Match | None:
    """A nearest or bilinear upsampling of a 4-d tensor, as a module or ``F.interpolate``."""
    source = node.args[0] if node.args else None
    if not is_tensor(source) or len(full_shape(source) or ()) != 4:
        return None
    module = module_of(scope.gm, node, _UPSAMPLE_MODULES)
    if module is not None:
        settings = {"size": module.size, "scale_factor": module.scale_factor, "mode": module.mode,
                    "align_corners": module.align_corners, "recompute_scale_factor": module.recompute_scale_factor}
    elif calls(node, (F.interpolate,)):
        settings = normalized_kwargs(scope.gm, node) or {}
        if settings.get("antialias"):
            return None
    else:
        return None
    if settings.get("mode") not in _MODES or settings.get("recompute_scale_factor") or \
            any(isinstance(v, fx.Node) for k, v in settings.items() if k != "input"):
        return None
    attrs = {"mode": settings["mode"], "size": _pair(settings.get("size")),
             "scale_factor": _pair(settings.get("scale_factor"), float),
             "align_corners": bool(settings.get("align_corners"))}
    return Match.single("upsample", node, [source], attrs)


def match_pad(scope: Scope, node: fx.Node) -> Match | None:
    """A constant pad or a crop of the spatial dimensions of a 4-d tensor; a pad with a crop as its only reader is one
    unit."""
    found = _pad(scope.gm, node) or _crop(node)
    if found is None:
        return None
    source, pads, value, mode = found
    if mode != "constant":
        return Match.single("pad", node, [source], {"pads": pads, "value": value, "mode": mode})
    crop = only_user(node)
    then = _crop(crop) if scope.free(crop) and not _crop(node) else None
    if then is None or crop is None:
        return Match.single("pad", node, [source], {"pads": pads, "value": value})
    pads = tuple(a + b for a, b in zip(pads, then[1]))
    return Match("pad", node.name, [source], node, crop, [node, crop], {"pads": pads, "value": value},
                 {"node": node.name, "args": (source.name,), "nodes": (node.name, crop.name)})


def _pad(gm: fx.GraphModule, node: fx.Node) -> tuple[fx.Node, tuple[int, ...], float, str] | None:
    """(input, pads, value, mode) of a pad of a 4-d tensor's two spatial dimensions."""
    source = node.args[0] if node.args else None
    if not is_tensor(source) or len(full_shape(source) or ()) != 4:
        return None
    module = module_of(gm, node, (*_PAD_MODULES, *_MODE_PAD_MODULES))
    if module is not None:
        pads, value = tuple(module.padding), float(getattr(module, "value", 0.0))
        mode = _MODE_PAD_MODULES.get(type(module), "constant")
    elif calls(node, (F.pad,)):
        settings = normalized_kwargs(gm, node) or {}
        given, value, mode = settings.get("pad"), settings.get("value") or 0.0, settings.get("mode", "constant")
        if mode not in _PAD_MODES or not isinstance(given, (list, tuple)):
            return None
        pads = tuple(given)
    else:
        return None
    if len(pads) != 4 or not all(isinstance(p, int) for p in pads) or not isinstance(value, (int, float)):
        return None
    return source, pads, float(value), mode


def _crop(node: Any) -> tuple[fx.Node, tuple[int, ...], float, str] | None:
    """(input, pads, 0.0, "constant") of ``x[:, :, a:b, c:d]`` on a 4-d tensor (steps of 1), the pads negative."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is operator.getitem and
            is_tensor(node)):
        return None
    source, index = node.args
    shape = full_shape(source)
    if not is_tensor(source) or shape is None or len(shape) != 4 or not isinstance(index, tuple) or len(index) != 4 or \
            index[:2] != (slice(None), slice(None)) or not all(isinstance(i, slice) for i in index):
        return None
    pads: list[tuple[int, int]] = []
    for part, size in zip(cast(tuple[slice, slice], index[2:]), shape[2:]):
        start, stop, step = part.indices(size)
        if step != 1 or not all(isinstance(v, (int, type(None))) for v in (part.start, part.stop)) or stop <= start:
            return None
        pads.append((-start, stop - size))
    (top, bottom), (left, right) = pads
    return source, (left, right, top, bottom), 0.0, "constant"


def _pair(value: Any, kind: type = int) -> tuple[Any, ...] | None:
    """A size or scale setting as a pair (None stays None)."""
    if value is None:
        return None
    values = tuple(value) if isinstance(value, (list, tuple)) else (value, value)
    return tuple(kind(v) for v in values)
