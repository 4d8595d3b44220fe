"""The callable of a unit that runs the model's own code (ios_ray/runtime/units.py, ``CodeCall``): its fx nodes,
turned into Python once, compute from the unit's inputs, the constants they read and the sizes of tensors the unit
does not take what the nodes themselves compute."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch import nn

from ios_ray.runtime.units import CodeCall, unit_code


def patches_graph() -> tuple[fx.GraphModule, dict[str, fx.Node]]:
    """A graph whose tail reads a tensor constant, a number, a layer and the size of a tensor from elsewhere:
    ``(norm(x * w) * k).reshape(far.size(0), x.size(1), -1) + x.size(2)``."""
    graph = fx.Graph()
    x, far = graph.placeholder("x"), graph.placeholder("far")
    w = graph.get_attr("w")
    k = graph.call_function(operator.add, (2, 1))
    scaled = graph.call_function(operator.mul, (x, w))
    normed = graph.call_module("norm", (scaled,))
    times_k = graph.call_function(operator.mul, (normed, k))
    rows, channels = graph.call_method("size", (far, 0)), graph.call_method("size", (x, 1))
    reshaped = graph.call_method("reshape", (times_k, rows, channels, -1))
    width = graph.call_method("size", (x, 2))
    out = graph.call_function(operator.add, (reshaped, width))
    graph.output(out)
    root = nn.Module()
    root.norm = nn.LayerNorm(4)
    root.w = torch.randn(4)
    module = fx.GraphModule(root, graph)
    return module, {n.name: n for n in module.graph.nodes}


def test_a_units_code_computes_from_its_inputs_constants_and_the_sizes_of_tensors_it_does_not_take() -> None:
    module, nodes = patches_graph()
    names = ["mul", "norm", "mul_1", "size", "size_1", "reshape", "size_2", "add_1"]
    constants = {"w": torch.randn(4), "add": 3}  # the import's values, not the module's own attribute
    # a size read of ``far`` reads a tensor of its shape at the input's batch size; ``x`` is an input, read as it is
    sized = {"far": ((1,), (True,)), "x": ((7, 7), (False, False))}
    call = CodeCall(tuple(nodes[n] for n in names), module, ("x",), constants, sized)
    for batch in (2, 3):
        x = torch.randn(batch, 5, 4)
        expected = (module.norm(x * constants["w"]) * 3).reshape(batch, 5, -1) + 4
        assert torch.equal(call([x]), expected)
    with torch.no_grad():
        module.norm.weight.mul_(2)  # the code calls the module's own layer, not a copy of it
    assert torch.equal(call([x]), (module.norm(x * constants["w"]) * 3).reshape(3, 5, -1) + 4)


def test_a_units_code_takes_its_inputs_then_the_constants_it_reads_then_its_sized_tensors() -> None:
    module, nodes = patches_graph()
    code, held = unit_code((nodes["mul"], nodes["norm"], nodes["mul_1"], nodes["size"]), module, ("x",), ("far",))
    assert held == ("w", "add")
    placeholders = [n for n in code.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 4 and list(code.graph.nodes)[-1].op == "output"
    assert code.layer_0 is module.norm  # the layer it calls is the module's own
    assert code(torch.ones(2, 5, 4), torch.ones(4), 2, torch.empty(6, device="meta")) == 6
