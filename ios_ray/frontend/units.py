"""From fx nodes to units: the walk over the rewritten graph that builds the :class:`~ios_ray.ir.Graph`.

Nodes are visited in order, and each one is

* part of a match (:mod:`~ios_ray.frontend.patterns`): the unit is added at the match's tail;
* a sum or channel concatenation: folded into the input of the one unit that reads it (nested concatenations are
  flattened); one that several units read becomes an ``add`` or ``concat`` unit, and so does one read by a chain of
  elementwise steps, which becomes its epilogue (ResNet's ``relu(out + downsample(x))`` is one ``add`` unit; a sum
  that completes a conv with its identity shortcut is the conv's own, :mod:`~ios_ray.frontend.conv`);
* an elementwise step on a tensor that other units read too (so it cannot be their epilogue): an ``elementwise``
  unit of the chain of steps that starts there;
* a constant, a size computation, or a ``chunk``/``split`` whose items are taken one by one: no unit;
* anything else: an ``opaque`` unit that calls the original code, never an error. It computes the size values it
  reads that depend on the batch size, and the tuple it takes an item of, itself, and takes in the ops after it
  while each reads only what the one before computes (``attrs['then']``; the code it runs is ``refs['nodes']``).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

import torch
import torch.fx as fx

from ios_ray.blocks import find_blocks
from ios_ray.errors import ImportRefused
from ios_ray.frontend.elementwise import elementwise_chain, elementwise_step
from ios_ray.frontend.match import Match, Scope
from ios_ray.frontend.nodes import (CONCATENATIONS, F32, arg_nodes, constant_nodes, evaluate_constant, full_shape,
                                    is_batch_folded, is_batch_size, is_tensor, is_tuple_of_tensors, numel, only_user,
                                    op_name, readers, sample_layout, shape)
from ios_ray.frontend.patterns import find_matches
from ios_ray.frontend.report import op_kind
from ios_ray.ir import GRAPH_INPUT, Graph, Unit, Value

_ADDS = (operator.add, torch.add, "add")


def build_graph(gm: fx.GraphModule, name: str, input_shape: tuple[int, ...]) -> tuple[Graph, dict[str, Any]]:
    """The graph of a traced, rewritten and shape-propagated module, and the values of its constant nodes."""
    return _Walk(gm, name, input_shape).run()


class _Walk:
    """One walk: fx nodes in, units out (state lives only for the duration of :meth:`run`)."""

    def __init__(self, gm: fx.GraphModule, name: str, input_shape: tuple[int, ...]) -> None:
        self.gm = gm
        self.name = name
        self.input_shape = input_shape
        self.scope = Scope(gm, constant_nodes(gm.graph))
        self.scope.taken.update(n for n in gm.graph.nodes if n not in self.scope.constants and is_batch_folded(n))
        self.matches = find_matches(self.scope)
        self.values: dict[fx.Node, Value] = {}
        self.units: list[Unit] = []
        self.ids: set[str] = {GRAPH_INPUT}
        self.constants: dict[str, Any] = {}

    def run(self) -> tuple[Graph, dict[str, Any]]:
        """Turn the fx nodes, in order, into units; returns the graph with its blocks, and the constants."""
        output: Value | None = None
        for node in self.gm.graph.nodes:
            if node.op == "output":
                output = self.values.get(node.args[0]) if isinstance(node.args[0], fx.Node) else None
            elif node in self.matches:
                self._add_match(self.matches[node])
            elif node not in self.scope.taken:
                self._visit(node)
        if output is None:
            raise ImportRefused(f"{self.name} must return a single tensor.")
        graph = Graph(self.name, self.input_shape, tuple(self.units), output, find_blocks(self.units, output))
        return graph, self.constants

    def _visit(self, node: fx.Node) -> None:
        if node.op == "placeholder":
            if self.values:
                raise ImportRefused(f"{self.name} takes more than one input; ios-ray imports single-input models.")
            self.values[node] = Value.of(GRAPH_INPUT)
        elif node in self.scope.constants:
            self.constants[node.name] = evaluate_constant(self.gm, node, self.constants)
        elif is_batch_size(node) or _items_taken_one_by_one(node):
            return
        elif _target_in(node, _ADDS) and self._foldable_add(node):
            self._fold(node, (tuple(s for a in arg_nodes(node.args) for s in self.values[a].parts[0]),))
        elif _target_in(node, CONCATENATIONS) and self._foldable_cat(node):
            self._fold(node, tuple(p for a in arg_nodes(node.args[0]) for p in self.values[a].parts))
        elif not self._add_elementwise(node):
            self._add_opaque(node)

    def _foldable_add(self, node: fx.Node) -> bool:
        args = node.args
        return (
            len(args) == 2 and not node.kwargs and all(isinstance(a, fx.Node) and a in self.values for a in args)
            and shape(args[0]) == shape(args[1]) == shape(node)
            and all(len(self._plain_parts(a)) == 1 for a in arg_nodes(args))
        )

    def _foldable_cat(self, node: fx.Node) -> bool:
        """A concatenation along the channels (dimension 1) of feature maps, or of the flattened outputs a model
        returns together (:func:`~ios_ray.frontend.outputs.one_output`)."""
        tensors = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        rank = len(shape(node)) + 1  # the batch dimension too
        returned = [reader.op for reader in readers(node)] == ["output"]
        return (
            isinstance(tensors, (list, tuple)) and all(isinstance(t, fx.Node) and t in self.values for t in tensors)
            and (rank >= 3 or (rank == 2 and returned)) and dim in (1, 1 - rank)
        )

    def _plain_parts(self, node: fx.Node) -> tuple[tuple[str, ...], ...]:
        """The parts of a node's value; a concatenation that a sum reads is turned into a unit first."""
        if len(self.values[node].parts) > 1:
            self._materialise(node, [])
        return self.values[node].parts

    def _fold(self, node: fx.Node, parts: tuple[tuple[str, ...], ...]) -> None:
        """Keep a sum or concat as an expression; one read more than once, or by elementwise steps, becomes a unit."""
        self.values[node] = Value(parts)
        chain = elementwise_chain(self.scope, node)
        if chain or len(readers(node)) != 1 or readers(node)[0].op == "output":
            self._materialise(node, chain)

    def _materialise(self, node: fx.Node, chain: list[tuple[fx.Node, str]]) -> None:
        """The ``add`` or ``concat`` unit of a folded value, with an epilogue of elementwise steps."""
        value = self.values[node]
        elements = numel(shape(node))
        attrs, refs = _epilogue(chain)
        unit = Unit(node.name, "concat" if len(value.parts) > 1 else "add", (value,), shape(node), attrs, refs,
                    flops=elements * (len(value.sources) - 1), bytes=F32 * elements * (len(value.sources) + 1))
        self._append(unit, [node, *(n for n, _ in chain)])

    def _add_elementwise(self, node: fx.Node) -> bool:
        """An ``elementwise`` unit of the steps starting at ``node``; False where ``node`` is not a step."""
        sources = [n for n in node.all_input_nodes if n not in self.scope.constants]
        step = elementwise_step(self.gm, node, sources[0], self.scope.constants) \
            if len(sources) == 1 and sources[0] in self.values else None
        if step is None:
            return False
        self.scope.taken.add(node)
        chain = [(node, step), *elementwise_chain(self.scope, node)]
        attrs, refs = _epilogue(chain)
        elements = numel(shape(node))
        self._append(Unit(node.name, "elementwise", (self.values[sources[0]],), shape(node), attrs, refs,
                          flops=elements * len(chain), bytes=2 * F32 * elements), [n for n, _ in chain])
        return True

    def _append(self, unit: Unit, nodes: list[fx.Node]) -> None:
        """Add a unit standing for ``nodes``; the last one's value is the unit's output. A module called again (its
        weights shared) is another unit: ``block.0``'s second call is ``block.0@1``, as torch.export counts calls."""
        self.scope.taken.update(nodes)
        calls = 0
        while unit.id in self.ids:
            calls += 1
            unit = dataclasses.replace(unit, id=f"{unit.id.partition('@')[0]}@{calls}")
        self.ids.add(unit.id)
        self.units.append(unit)
        self.values[nodes[-1]] = Value.of(unit.id)

    def _inputs(self, nodes: list[fx.Node]) -> tuple[Value, ...]:
        return tuple(self.values[n] for n in nodes if n not in self.scope.constants)

    def _add_match(self, match: Match) -> None:
        inputs = self._inputs(match.inputs)
        out = shape(match.tail)
        in_elements = sum(numel(shape(n)) for n in match.inputs)
        weights = sum(p.numel() for key in ("conv", "depthwise", "pointwise", "linear", "module") if key in match.refs
                      for p in self.gm.get_submodule(match.refs[key]).parameters())
        self._append(Unit(match.id, match.kind, inputs, out, match.attrs, match.refs, flops=_flops(match),
                          bytes=F32 * (in_elements + numel(out)), weight_bytes=F32 * weights), match.nodes)

    def _add_opaque(self, node: fx.Node) -> None:
        """A unit calling the original code of ``node``, of the size and tuple nodes it reads, and of the ops after
        it that read only what the one before computes (a permute -> LayerNorm -> permute is one unit)."""
        inner = _inner_nodes(node, self.scope.constants)
        sizes = [n for n in inner if is_batch_size(n)]
        inputs = list(dict.fromkeys(n for m in (*inner, node) if not is_batch_size(m) for n in m.all_input_nodes
                                    if n not in inner and n not in self.scope.constants))
        sized = {n.name: sample_layout(n) for m in sizes for n in m.all_input_nodes if is_tensor(n) and n not in inner}
        if sized and not inputs:
            inputs = [next(n for n in self.gm.graph.nodes if n.op == "placeholder")]
        self.scope.taken.add(node)
        chain = self._single_input_chain(node)
        attrs: dict[str, Any] = {"op": op_name(node, self.gm), "args": self._describe_args(node, inputs)}
        folded = [n for n in inner if is_tensor(n) and is_batch_folded(n)]
        if folded:  # what the unit computes before its op enters its stage keys
            attrs["after"] = tuple(f"{op_name(n, self.gm)}{self._describe_args(n, inputs)}" for n in folded)
        if chain:
            attrs["then"] = tuple(text for _, text in chain)
        code = [*inner, node, *(n for n, _ in chain)]
        refs: dict[str, Any] = {"node": node.name, "args": tuple(n.name for n in inputs)}
        if len(code) > 1 or sizes:
            refs.update(nodes=tuple(n.name for n in code), sized=sized)
        elements = sum(numel(shape(n)) for n in (node, *(n for n, _ in chain)))
        tail = code[-1]
        self._append(Unit(node.name, "opaque", self._inputs(inputs), shape(tail), attrs, refs, flops=elements,
                          bytes=F32 * (numel(shape(tail)) + sum(numel(shape(n)) for n in inputs))), [node, *code])

    def _single_input_chain(self, node: fx.Node) -> list[tuple[fx.Node, str]]:
        """The ops after ``node`` that each read only the one before (and constants), with their texts."""
        chain: list[tuple[fx.Node, str]] = []
        while (user := only_user(node)) is not None and self.scope.free(user) and is_tensor(user) and \
                user.op.startswith("call_") and [n for n in user.all_input_nodes if n not in self.scope.constants] \
                == [node]:
            step = elementwise_step(self.gm, user, node, self.scope.constants)
            chain.append((user, step or f"{op_name(user, self.gm)}{self._describe_args(user, [node])}"))
            node = user
        return chain

    def _describe_args(self, node: fx.Node, inputs: list[fx.Node]) -> str:
        """The arguments of an opaque op as text (they decide what it computes, so they enter stage keys): inputs
        are ``'x'``, constant tensors ``'const(shape)'``, size and tuple nodes what they compute, e.g.
        ``getitem(size(tensor(8, 6, 6)), 0)``."""
        def show(n: fx.Node) -> str:
            if n in inputs:
                return "x"
            if n in self.scope.constants:
                return f"const{full_shape(n)}" if is_tensor(n) else "const"
            if is_tensor(n):
                return _Text(f"tensor{shape(n)}")
            args = [show(a) for a in n.all_input_nodes] + [repr(a) for a in n.args if not isinstance(a, fx.Node)]
            return _Text(f"{op_kind(op_name(n, self.gm))}({', '.join(args)})")
        return repr((fx.node.map_arg(node.args, show), fx.node.map_arg(node.kwargs, show)))


class _Text(str):
    """A string that shows as itself in a repr (a nested description, not a quoted name)."""

    def __repr__(self) -> str:
        return str(self)


def _inner_nodes(node: fx.Node, constants: set[fx.Node]) -> list[fx.Node]:
    """What a node reads that its unit computes itself: size nodes that depend on the batch size, a tuple taken
    item by item, and tensors whose batch is folded into another dimension (with all they read, up to tensors that
    hold the batch in dimension 0)."""
    found: dict[fx.Node, None] = {}

    def computed_here(reader: fx.Node, source: fx.Node) -> bool:
        if is_batch_size(source) or _items_taken_one_by_one(source):
            return True
        if source in constants or not is_batch_folded(source):
            return False
        # a size read of a folded tensor of known layout reads a meta tensor of its shape instead (``sized``)
        return not (is_batch_size(reader) and source.meta.get("sample_shape") is not None)

    def visit(n: fx.Node) -> None:
        for source in n.all_input_nodes:
            if source not in found and computed_here(n, source):
                found[source] = None  # before its own sources: each node is walked once, however many read it
                visit(source)
    visit(node)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(found, key=order.__getitem__)


def _items_taken_one_by_one(node: fx.Node) -> bool:
    """A tuple of tensors (``chunk``, ``split``) read only by ``getitem``s: each item's unit computes it."""
    return is_tuple_of_tensors(node) and bool(node.users) and \
        all(u.op == "call_function" and u.target is operator.getitem for u in node.users)


def _epilogue(chain: list[tuple[fx.Node, str]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The attrs and refs entries of an epilogue (none where the chain is empty)."""
    if not chain:
        return {}, {}
    return {"epilogue": tuple(text for _, text in chain)}, {"epilogue": tuple(node.name for node, _ in chain)}


def _flops(match: Match) -> int:
    """Multiply-adds times two, per sample."""
    attrs, out = match.attrs, numel(shape(match.main))
    if match.kind == "conv":
        kh, kw = attrs["kernel"]
        return 2 * out * (attrs["in_channels"] // attrs["groups"]) * kh * kw
    if match.kind == "sepconv":
        kh, kw = attrs["kernel"]
        spatial = out // attrs["out_channels"]
        return 2 * spatial * attrs["in_channels"] * (kh * kw + attrs["out_channels"])
    if match.kind == "conv3d":
        return 2 * out * (attrs["in_channels"] // attrs["groups"]) * math.prod(attrs["kernel"])
    if match.kind == "conv_transpose":  # every input element scatters into a kernel's window of each output channel
        per_input = (attrs["out_channels"] // attrs["groups"]) * math.prod(attrs["kernel"])
        return 2 * numel(shape(match.inputs[0])) * per_input
    if match.kind == "linear":
        return 2 * attrs["in_features"] * attrs["out_features"]
    if match.kind == "pool" and "kernel_size" in attrs:
        return out * math.prod(attrs["kernel_size"])
    if match.kind == "upsample":  # bilinear blends four inputs per output
        return out * (4 if attrs["mode"] == "bilinear" else 1)
    if match.kind == "pad":
        return out
    if match.kind in ("shuffle", "slice"):
        return 0
    return numel(shape(match.inputs[0])) if match.inputs else out


def _target_in(node: fx.Node, targets: tuple[Any, ...]) -> bool:
    return node.op in ("call_function", "call_method") and node.target in targets
