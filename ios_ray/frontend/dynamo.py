"""A graph that torch.compile hands to a backend, as a module of one input that the frontend imports: :func:`graph_call`.

Dynamo hands a backend one fx graph per graph break, of torch-level calls (``torch.conv2d``, ``F.batch_norm``,
``operator.add``), and the values it reads as placeholders, each with the *source* Dynamo read it from:

* the frame's inputs: ``L['x']``, after a graph break the locals the graph goes on from (``L['y']``), items of an
  input container (``L['x'][0]``);
* what the model holds: parameters and buffers (``L['self']._modules['c']._parameters['weight']``), other tensors
  and numbers read as attributes (``L['self'].anchors``, a batch-norm's ``eps`` where shapes are dynamic) and
  globals; the example inputs are these very objects;
* sizes where shapes are dynamic: SymInts read from a tensor (``L['x'].size()[0]``), so that the graph is
  batch-generic.

:class:`GraphCall` holds what the model holds (tensors registered as its own parameters and buffers: shared, never
copied) and calls the graph with those, the one input batch and the sizes read from it: a module like any other,
which :func:`~ios_ray.frontend.import_module` imports through the same capture and passes as a model. A graph that
cannot be such a module raises :class:`Unschedulable` saying why: it reads several frame inputs, none, a number
from the frame, an input that is not a floating batch, it runs in training mode (dropout, batch-norm statistics), it
writes into the model's own tensors (a buffer counting calls), it is compiled under ``torch.autocast`` (a schedule runs
one dtype), or autograd needs its history (gradients enabled, and its input or the model's parameters require them).

A graph may end in values that are not feature maps of the batch: the graph before a data-dependent branch returns
the branch's condition (``y.mean()``, one number for the whole batch) beside its feature map. :func:`graph_call` cuts
such a graph in two (:func:`split_tail`): the *head*, which returns feature maps only and is what imports and runs a
schedule, and the *tail*, Dynamo's own code for the rest, which :meth:`GraphCall.finish` runs on the head's outputs.

Where shapes are static (``dynamic=False``, and every first compile of ``dynamic=None``), Dynamo writes sizes read
from the input as numbers: ``x.view(x.size(0), -1)`` is ``x.view(8, -1)``, which a capture at another batch size
cannot import. Such a graph runs only at its batch size (Dynamo's guards say so), so :func:`graph_call` reads the
batch size back where a reshape of a batch-first tensor starts with it (``x.view(x.size(0), -1)`` again) and records
the batch the graph is fixed at (``GraphCall.batch``): what imports from it must compute the graph at that batch,
which the caller checks.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch import nn
from torch._dynamo.source import AttrSource, LocalSource, NNModuleSource, TensorProperty, TensorPropertySource
from torch.fx.operator_schemas import normalize_function

from ios_ray.dtypes import autocast_dtype
from ios_ray.frontend.nodes import ancestors
from ios_ray.frontend.writes import STATE, writes_into


#: Methods whose sizes may start with the batch size: :func:`batch_read_back` reads it back there.
_RESHAPES = ("view", "reshape", "expand")


class Unschedulable(Exception):
    """A graph that cannot run as one module of one input batch; the message says why, as a clause."""


class Kind(enum.Enum):
    """Where an argument of the graph comes from at each call."""

    INPUT = "input"  # the input batch
    INPUT_PROPERTY = "input property"  # a size, stride or offset of the input batch
    HELD = "held"  # a value of the model, held by the GraphCall
    HELD_PROPERTY = "held property"  # a size, stride or offset of a held tensor


@dataclass(frozen=True)
class Argument:
    """One placeholder of the graph: where its value comes from, and for properties which one (``prop``, ``index``)
    of which held value (``held``: its position among the held values)."""

    kind: Kind
    source: str
    held: int | None = None
    prop: TensorProperty | None = None
    index: int | None = None


class GraphCall(nn.Module):
    """A Dynamo graph called with the model's values it holds and one input batch (batch first)."""

    def __init__(self, graph: fx.GraphModule, arguments: Sequence[Argument], held: Sequence[Any],
                 batch: int | None = None, tail: fx.GraphModule | None = None) -> None:
        super().__init__()
        self.graph = graph
        self.arguments = tuple(arguments)
        self.batch = batch
        self.tail = tail
        self.constants: dict[int, Any] = {}
        for position, value in enumerate(held):
            if isinstance(value, nn.Parameter):
                self.register_parameter(f"held_{position}", value)
            elif isinstance(value, torch.Tensor):
                self.register_buffer(f"held_{position}", value)
            else:
                self.constants[position] = value

    @property
    def input_position(self) -> int:
        """The input batch's position among the graph's placeholders."""
        return next(i for i, a in enumerate(self.arguments) if a.kind is Kind.INPUT)

    @property
    def held_positions(self) -> tuple[int, ...]:
        """The positions, among the graph's placeholders, of the values the model holds, in held order."""
        return tuple(i for i, a in enumerate(self.arguments) if a.kind is Kind.HELD)

    def held(self) -> list[Any]:
        """The model's values this call holds, in held order."""
        count = len(self.held_positions)
        return [self.constants[i] if i in self.constants else getattr(self, f"held_{i}") for i in range(count)]

    def holding(self, args: Sequence[Any]) -> GraphCall:
        """The same graph holding the model's values of one call's arguments (another module's weights, say)."""
        return GraphCall(self.graph, self.arguments, [args[i] for i in self.held_positions], self.batch, self.tail)

    def forward(self, x: torch.Tensor) -> Any:
        """The head's outputs (a tuple of feature maps) for the input batch ``x``."""
        held = self.held()
        return self.graph(*(_value(a, x, held) for a in self.arguments))

    def finish(self, outputs: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """What Dynamo's graph returns for a call with ``args``, from the head's ``outputs`` for it."""
        return tuple(outputs) if self.tail is None else self.tail(*outputs, *args)


def graph_call(graph: fx.GraphModule, example_inputs: Sequence[Any]) -> GraphCall:
    """The graph Dynamo handed over, as a module of one input batch holding the example inputs' model values;
    Unschedulable where it cannot be one."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise Unschedulable(f"it has {len(placeholders)} placeholders for {len(example_inputs)} example inputs")
    arguments: list[Argument] = []
    held: list[Any] = []
    held_at: dict[str, int] = {}
    for node, value in zip(placeholders, example_inputs):
        source = node.meta.get("grapharg")
        source = getattr(source, "source", None)
        if source is None:
            raise Unschedulable(f"Dynamo gave no source for its placeholder {node.name!r}")
        arguments.append(_argument(source, value, held, held_at))
    inputs = [a.source for a in arguments if a.kind is Kind.INPUT]
    if not inputs:
        raise Unschedulable("it reads no input tensor (only what the model holds)")
    if len(inputs) > 1:
        raise Unschedulable(f"it reads {len(inputs)} input tensors ({', '.join(inputs)}), and a schedule runs a "
                            "graph of one input")
    x = example_inputs[next(i for i, a in enumerate(arguments) if a.kind is Kind.INPUT)]
    if x.dim() < 2 or not x.is_floating_point():
        raise Unschedulable(f"its input {inputs[0]} is a {str(x.dtype).removeprefix('torch.')} tensor of shape "
                            f"{tuple(x.shape)}, not a floating batch of samples")
    training = _training_op(graph)
    if training is not None:
        raise Unschedulable(f"it runs in training mode ({training}); schedules are for inference: call model.eval()")
    written = writes_into(graph, [n for n, a in zip(placeholders, arguments) if a.kind is Kind.HELD])
    if written is not None:
        source = arguments[placeholders.index(written[0])].source
        raise Unschedulable(f"it writes into {source} in place ({written[1]}), {STATE}")
    dtype = autocast_dtype(x.device.type)
    if dtype is not None:
        raise Unschedulable(f"torch.autocast ({dtype}) is on, and a schedule runs the one dtype it was made for, not "
                            f"autocast's mix; compile the model converted to {dtype} (`model.to(torch.{dtype})`) and "
                            "call it without autocast to run its schedules")
    if torch.is_grad_enabled() and x.requires_grad:
        raise Unschedulable(f"it computes gradients of its input {inputs[0]}; schedules are for inference")
    if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in held):
        raise Unschedulable("gradients are enabled and the model's parameters require them, and a schedule runs "
                            "without autograd (a loss computed from its output would train nothing); call the model "
                            "under torch.no_grad() or torch.inference_mode() to run its schedules")
    input_node = placeholders[next(i for i, a in enumerate(arguments) if a.kind is Kind.INPUT)]
    batch = input_node.meta.get("example_value", x).shape[0]
    head, tail = split_tail(graph, batch)
    if isinstance(batch, torch.SymInt):  # batch-generic (other sizes may be symbolic too: read at each call)
        return GraphCall(head, arguments, held, tail=tail)
    return GraphCall(batch_read_back(head, x.shape[0]), arguments, held, x.shape[0], tail)


def split_tail(graph: fx.GraphModule, batch: Any) -> tuple[fx.GraphModule, fx.GraphModule | None]:
    """(head, tail): where the graph returns values that are not feature maps of ``batch`` samples (the example
    values' size, a number or a SymInt) and computes them only from feature maps, the head returns those feature maps
    and its own feature-map outputs, and the tail, called with the head's outputs and then the graph's arguments,
    returns what the graph returns. (graph, None) where every output is a feature map, or where the other outputs
    cannot be cut off so (they feed a feature map, or read a value of the head that is not one)."""
    output = next(n for n in graph.graph.nodes if n.op == "output")
    results = list(output.args[0]) if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    maps = [r for r in results if _feature_map(r, batch)]
    others = [r for r in results if isinstance(r, fx.Node) and not _feature_map(r, batch)]
    if not others:
        return graph, None
    head_side = ancestors(maps)
    tail_nodes = ancestors(others) - head_side
    tail_nodes = {n for n in tail_nodes if n.op != "placeholder"}
    read = {i for n in tail_nodes for i in n.all_input_nodes if i not in tail_nodes and i.op != "placeholder"}
    if any(r in head_side for r in others) or not all(_feature_map(n, batch) for n in read):
        return graph, None
    returned = list(dict.fromkeys([*maps, *sorted(read, key=_order(graph))]))
    return _head(graph, returned), _tail(graph, returned, tail_nodes, results)


def _feature_map(value: Any, batch: Any) -> bool:
    """Whether a node's example value is a floating tensor of at least two dimensions led by ``batch``."""
    example = value.meta.get("example_value") if isinstance(value, fx.Node) else None
    return (isinstance(example, torch.Tensor) and example.dim() >= 2 and example.is_floating_point()
            and _size(example.shape[0]) == _size(batch))


def _size(size: Any) -> Any:
    """A size comparable across example values: an int, or a SymInt's expression."""
    return size.node.expr if isinstance(size, torch.SymInt) else size


def _order(graph: fx.GraphModule) -> Any:
    """A sort key: a node's position in ``graph``."""
    position = {n: i for i, n in enumerate(graph.graph.nodes)}
    return position.__getitem__


def _head(graph: fx.GraphModule, returned: Sequence[fx.Node]) -> fx.GraphModule:
    """A copy of ``graph`` returning ``returned`` (as a tuple) and computing only what they need; the same
    placeholders."""
    head = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    head.graph_copy(graph.graph, copies)
    head.output(tuple(copies[n] for n in returned))
    head.eliminate_dead_code()
    return fx.GraphModule(graph, head)


def _tail(graph: fx.GraphModule, returned: Sequence[fx.Node], nodes: set[fx.Node], results: Sequence[Any]
          ) -> fx.GraphModule:
    """The graph of ``nodes`` (in ``graph``'s order), called with the head's ``returned`` values and then ``graph``'s
    arguments, returning ``results`` as ``graph`` does."""
    tail = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for index, node in enumerate(returned):
        env[node] = tail.placeholder(f"head_{index}")
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            env[node] = tail.placeholder(node.name)
    for node in graph.graph.nodes:
        if node in nodes:
            env[node] = tail.node_copy(node, env.__getitem__)
    tail.output(tuple(env[r] if isinstance(r, fx.Node) else r for r in results))
    return fx.GraphModule(graph, tail)


def batch_read_back(graph: fx.GraphModule, batch: int) -> fx.GraphModule:
    """The graph with the leading ``batch`` of each reshape of a tensor of ``batch`` samples read from the tensor
    (``view(8, -1)`` as ``view(x.size(0), -1)``); the same computation at that batch size."""
    for node in list(graph.graph.nodes):
        if not (node.op == "call_method" and node.target in _RESHAPES or node.target is torch.reshape):
            continue
        tensor, *sizes = node.args
        nested = len(sizes) == 1 and isinstance(sizes[0], (tuple, list))
        sizes = list(sizes[0]) if nested else sizes
        value = tensor.meta.get("example_value") if isinstance(tensor, fx.Node) else None
        if not sizes or sizes[0] != batch or value is None or value.dim() == 0 or value.shape[0] != batch:
            continue
        with graph.graph.inserting_before(node):
            sizes[0] = graph.graph.call_method("size", (tensor, 0))
        node.args = (tensor, tuple(sizes)) if nested else (tensor, *sizes)
    graph.recompile()
    return graph


def _argument(source: Any, value: Any, held: list[Any], held_at: dict[str, int]) -> Argument:
    """Where one placeholder's value comes from; a held value is appended to ``held`` (once per source)."""
    name = source.name
    if isinstance(source, TensorPropertySource):
        base = source.base.name
        if _from_frame(source.base):
            return Argument(Kind.INPUT_PROPERTY, name, prop=source.prop, index=source.idx)
        if base not in held_at:
            raise Unschedulable(f"it reads a size of {base}, which it does not read itself")
        return Argument(Kind.HELD_PROPERTY, name, held=held_at[base], prop=source.prop, index=source.idx)
    if _from_frame(source):
        if not isinstance(value, torch.Tensor):
            raise Unschedulable(f"it reads {name}, a {type(value).__name__} the caller passes, besides its input")
        return Argument(Kind.INPUT, name)
    held_at[name] = len(held)
    held.append(_concrete(value))
    return Argument(Kind.HELD, name, held=held_at[name])


def _from_frame(source: Any) -> bool:
    """Whether a source is a local of the frame or an item of one (not an attribute of the model, nor a global)."""
    while True:
        if isinstance(source, (AttrSource, NNModuleSource)):
            return False
        base = getattr(source, "base", None)
        if base is None:
            return isinstance(source, LocalSource)
        source = base


def _concrete(value: Any) -> Any:
    """A held value as it is now: a tensor as it is, a symbolic number as its value."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value.node.hint
    return value


def _value(argument: Argument, x: torch.Tensor, held: list[Any]) -> Any:
    """One argument's value for a call on ``x``."""
    if argument.kind is Kind.INPUT:
        return x
    if argument.kind is Kind.HELD:
        return held[argument.held]  # type: ignore[index]
    tensor = x if argument.kind is Kind.INPUT_PROPERTY else held[argument.held]  # type: ignore[index]
    if argument.prop is TensorProperty.SIZE:
        return tensor.size(argument.index)
    if argument.prop is TensorProperty.STRIDE:
        return tensor.stride(argument.index)
    return tensor.storage_offset()


def _training_op(graph: fx.GraphModule) -> str | None:
    """The first call of the graph that runs in training mode (``training=True``), named; None where none does."""
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        try:
            normalized = normalize_function(node.target, tuple(node.args), dict(node.kwargs),
                                            normalize_to_only_use_kwargs=True)
        except Exception:  # noqa: BLE001 - a target torch cannot bind is not one with a training flag
            continue
        if normalized is not None and True in (normalized.kwargs.get("training"), normalized.kwargs.get("train")):
            return getattr(node.target, "__name__", str(node.target))
    return None


def graph_name(graph: fx.GraphModule | None = None) -> str:
    """The name of the graph Dynamo is compiling: the function it comes from (``Model.forward``; after a graph break
    at line 13, ``Model.forward@13``); where that is torch's own wrapper (a compiled ``nn.Sequential``, whose forward
    is torch's), the forward of the outermost module ``graph`` calls (``Sequential.forward``)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = InstructionTranslator.current_tx().f_code
        name = getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11 on
    except Exception:  # noqa: BLE001 - no frame being translated (a graph compiled by hand)
        return "graph"
    if graph is not None and Path(code.co_filename).is_relative_to(Path(torch.__file__).parent):
        outermost = next((next(iter(stack.values())) for node in graph.graph.nodes
                          if (stack := node.meta.get("nn_module_stack"))), None)
        if outermost is not None:
            kind = outermost[1]  # the module's class (its dotted name in some torch versions)
            name = f"{kind.__qualname__ if isinstance(kind, type) else str(kind).rsplit('.', 1)[-1]}.forward"
    return re.sub(r"[^A-Za-z0-9_.@]", "_", re.sub(r"torch_dynamo_resume_in_(\w+)_at_(\d+)", r"\1@\2", name))
