"""Capturing a module's forward with torch.export, as the torch-level fx graph the frontend's passes read.

:func:`capture` runs ``torch.export.export`` (non-strict: the model's own Python runs, on fake tensors, so shape
checks, ``isinstance`` branches, side effects on attributes and ``*args, **kwargs`` forwards work as in eager), with
the batch dimension symbolic, and rewrites the exported ATen graph into what a torch.fx trace of the same model
gives (:func:`as_torch_graph`):

* the input is the one placeholder; parameters, buffers and tensor constants are ``get_attr`` reads of the
  module's own tensors (shared, never copied);
* each call of a torch layer (a childless class of ``torch.nn.modules`` that takes one tensor and returns one, or one
  of timm's "SAME" layers) whose ops read one tensor and give one becomes a ``call_module`` of that layer again:
  unit ids are module paths, as a trace gives them, and a module called twice is two calls of one module;
* every other ATen op becomes the torch call it stands for (:mod:`~ios_ray.frontend.aten`), or stays an ATen op;
* the output is the structure the model returns (a dict, tuple or list of tensors and constants).

Where an op writes into a view of a tensor (``mask[:, :2] = 1``) or writes in place with no out-of-place form the
frontend knows, the program is functionalized first (``run_decompositions({})``), so that no unit ever writes into
a tensor another unit reads.

Every node then gets what :func:`~ios_ray.frontend.trace.propagate` and
:func:`~ios_ray.frontend.trace.record_batch_layout` record by running the model twice, read from the symbolic
shapes instead (:func:`record_shapes`): ``tensor_meta`` at the example's batch size, size values, and for tensors
computed from the input which dimensions grow with the batch.

:class:`ExportError` says why torch.export failed, in words that name the line of the model's code where it stopped.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import operator
import os
import traceback
import warnings
from typing import Any, Iterator, Sequence, TypeGuard, cast

import sympy
import torch
import torch.fx as fx
import torch.fx.experimental._config as fx_config
import torch.fx.experimental.proxy_tensor as proxy_tensor
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import nn
from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module
from torch.fx.graph_module import _copy_attr
from torch.fx.passes.shape_prop import TensorMetadata, _extract_tensor_metadata
from torch.utils._sympy.numbers import int_oo

from ios_ray.errors import ImportRefused, first_line
from ios_ray.frontend import aten
from ios_ray.frontend.nodes import batch_first, constant_nodes, hooked, signature_of
from ios_ray.frontend.quiet import this_thread_silent
from ios_ray.frontend.writes import state_written

#: Layers outside ``torch.nn.modules`` whose calls stay calls: the frontend knows them by class.
KNOWN_LAYERS = frozenset({"Conv2dSame", "MaxPool2dSame", "AvgPool2dSame"})
#: The smallest batch size torch.export keeps symbolic (it fixes a dimension of size 0 or 1).
CAPTURE_BATCH = 2
#: Torch layers that return one tensor although their ``forward`` does not say so, unless told to return indices.
_MAX_POOLS = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
              nn.AdaptiveMaxPool3d)
_FUNCTIONAL_BATCH_NORM = "_native_batch_norm_legit_no_training"


class ExportError(Exception):
    """torch.export could not capture a module's forward (the message says where and why, for one sentence)."""


def capture(module: nn.Module, example_input: torch.Tensor) -> fx.GraphModule:
    """The torch-level graph of ``module`` (in eval mode), each node holding export's symbolic value (``val``) and
    the graph module the batch size's symbol (``meta['batch_symbol']``); ExportError where torch.export fails,
    fixes the batch size or branches on it; ImportRefused where it writes into the module's own tensors.

    A forward that caches the shape of what it saw (Ultralytics' detection head keeps ``self.shape`` and recomputes
    its anchors where a call's shape differs) branches on the batch size once the model has run, in comparing the
    shapes. Where a capture branches on it and a submodule holds such a ``torch.Size``, it is captured again as a
    module that has not run holds it (None): its forward then takes the branch that computes afresh, which serves
    every batch size."""
    try:
        program, batch = _captured(module, example_input, forget_shapes=False)
    except _BatchBranch:
        if not any(isinstance(v, torch.Size) for m in module.modules() for v in vars(m).values()):
            raise
        program, batch = _captured(module, example_input, forget_shapes=True)
    written = state_written(program)
    if written is not None:
        raise ImportRefused(f"ios-ray cannot schedule {type(module).__name__}: {written}.")
    if _writes_through_aliases(program):
        with torch.no_grad(), _quiet():
            program = program.run_decompositions({})
    gm = as_torch_graph(program, module)
    gm.meta["batch_symbol"] = batch.node.expr
    return gm


class _BatchBranch(ExportError):
    """The model's code branches on the batch size."""


def _captured(module: nn.Module, example_input: torch.Tensor, forget_shapes: bool
              ) -> tuple[torch.export.ExportedProgram, torch.SymInt]:
    """The exported program and its batch size's symbol (see :func:`export`); ExportError where the batch size is
    fixed, _BatchBranch where the code branches on it."""
    program = export(module, example_input, forget_shapes)
    batch = _batch_size(program)
    if not isinstance(batch, torch.SymInt) or not isinstance(batch.node.expr, sympy.Symbol):
        raise ExportError("it fixes the batch size, which torch.export then cannot keep symbolic")
    branch = _batch_branch(program, batch)
    if branch is not None:
        raise _BatchBranch(f"its code branches on the batch size {branch}, so one graph cannot serve every batch "
                           "size")
    return program, batch


def output_example(gm: fx.GraphModule, batch: int) -> Any:
    """What the captured module returns, in its own structure (dict, ``OrderedDict``, tuple...), with meta tensors of
    the outputs' shapes at ``batch`` samples (for :func:`~ios_ray.frontend.outputs.output_structure`)."""
    sizes = _Sizes(gm.meta["batch_symbol"], batch)

    def concrete(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        return torch.empty([sizes.of(s)[0] for s in leaf.shape], dtype=leaf.dtype, device="meta")
    return pytree.tree_map(concrete, gm.meta["output"])


def unbatched_output(gm: fx.GraphModule) -> str | None:
    """The shape, in terms of the batch size ``B``, of the first tensor a captured module returns whose first
    dimension is not the batch (``(1, B, 4, 8, 8)``), None where every tensor it returns is batch first."""
    symbol = gm.meta["batch_symbol"]
    for leaf in pytree.tree_leaves(gm.meta["output"]):
        if isinstance(leaf, torch.Tensor) and (leaf.dim() == 0 or not isinstance(leaf.shape[0], torch.SymInt)
                                               or leaf.shape[0].node.expr != symbol):
            sizes = (str(s.node.expr if isinstance(s, torch.SymInt) else s) for s in leaf.shape)
            return "(" + ", ".join(size.replace(str(symbol), "B") for size in sizes) + ")"
    return None


def export(module: nn.Module, example_input: torch.Tensor, forget_shapes: bool = False
           ) -> torch.export.ExportedProgram:
    """``torch.export.export`` (non-strict) of ``module`` on the example's samples repeated to at least
    :data:`CAPTURE_BATCH`, with dimension 0 symbolic and size-oblivious: torch's own code takes no branch on whether
    it is 0 or 1 (a ``squeeze()`` stays a squeeze of whatever dimensions have size 1), and a branch of the model's
    code on it is recorded as a guard (:func:`_batch_branch`) instead of being decided by the assumption that a
    symbolic size is at least 2. The graph modules export builds along the way generate their Python code only when
    called (nothing here calls them), not after each of export's passes; and it records no ``tensor_meta``
    (:func:`_no_tensor_meta`). ``forget_shapes``: every ``torch.Size`` a submodule holds is None meanwhile (see
    :func:`capture`)."""
    x = example_input
    while x.shape[0] < CAPTURE_BATCH:
        x = torch.cat([x, example_input])
    try:
        with torch.no_grad(), _quiet(), attributes_kept(module), _no_stack_traces(), _no_tensor_meta(), \
                _buffer_hooks_kept(), _use_lazy_graph_module(True), \
                fx_config.patch(backed_size_oblivious=True):  # type: ignore[attr-defined]
            if forget_shapes:
                for m in module.modules():
                    for name in [k for k, v in vars(m).items() if isinstance(v, torch.Size)]:
                        object.__setattr__(m, name, None)
            return torch.export.export(module, (x,), strict=False, dynamic_shapes=({0: torch.export.Dim.AUTO},))
    except Exception as exc:  # noqa: BLE001 - export raises many kinds; each becomes one sentence
        raise ExportError(f"{where(exc)} {_reason(exc)}") from exc


@contextlib.contextmanager
def _no_stack_traces(config: Any = torch.fx.config) -> Iterator[None]:
    """torch.export without a stack trace recorded on every node (``config``: torch.fx's): nothing here reads them, and
    symbolizing them costs about a sixth of a large model's capture. Where torch has no such setting (2.11), export as
    it is."""
    if not hasattr(config, "do_not_emit_stack_traces"):
        yield
        return
    saved = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = saved


@contextlib.contextmanager
def _buffer_hooks_kept() -> Iterator[None]:
    """The process's module buffer registration hooks as they were before: non-strict torch.export registers one (its
    tracker of buffer assignments) and torch 2.11 removes it only where export succeeds, so that after a failed export
    every buffer assignment in the process runs it (an AssertionError in the model's own eager forward, a graph break
    under Dynamo)."""
    from torch.nn.modules import module as nn_module

    hooks = nn_module._global_buffer_registration_hooks
    before = set(hooks)
    try:
        yield
    finally:
        for key in set(hooks) - before:
            del hooks[key]


@contextlib.contextmanager
def _no_tensor_meta() -> Iterator[None]:
    """torch.export's best-effort ``tensor_meta`` on each node not recorded: nothing reads it (torch's passes read
    ``val``, and the frontend records its own, :func:`record_shapes`), and recording it reads a dozen properties of
    every fake tensor through the tracer's torch-function modes. Where torch no longer records it through this name,
    nothing is changed."""
    recorder = getattr(proxy_tensor, "_extract_tensor_metadata", None)
    if recorder is None:
        yield
        return
    proxy_tensor._extract_tensor_metadata = _no_metadata  # type: ignore[assignment]  # records nothing, returns None
    try:
        yield
    finally:
        proxy_tensor._extract_tensor_metadata = recorder


def _no_metadata(*args: Any, **kwargs: Any) -> None:
    """What torch's tracer records as a node's ``tensor_meta`` during a capture: nothing."""
    return None


@contextlib.contextmanager
def attributes_kept(module: nn.Module) -> Iterator[None]:
    """Every submodule's attributes as they were before: a forward that caches on itself (YOLO's head keeps
    ``self.anchors`` and ``self.shape``) would otherwise keep what it computed from export's fake tensors."""
    saved = [(m, {k: (dict(v) if isinstance(v, dict) else v) for k, v in vars(m).items()}) for m in module.modules()]
    try:
        yield
    finally:
        for m, attributes in saved:
            for key in set(vars(m)) - set(attributes):
                delattr(m, key)
            for key, value in attributes.items():
                current = vars(m).get(key)
                if isinstance(value, dict) and isinstance(current, dict):
                    current.clear()
                    current.update(value)
                elif current is not value:
                    object.__setattr__(m, key, value)


def _reason(exc: BaseException) -> str:
    """What stopped torch.export, in the user's terms where it is a known kind."""
    if "data-dependent" in str(exc) or type(exc).__name__.startswith("GuardOnDataDependent"):
        return "it branches on a tensor's values, which torch.export cannot capture"
    return f"torch.export stopped ({type(exc).__name__}: {_short(first_line(exc))})"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch.export's warnings, log lines and printouts of the graph it failed on are not the user's business (what
    this thread prints is dropped; other threads print as they do). Its loggers say nothing meanwhile, errors
    included: an op that fails on fake tensors (a pool whose output would be empty) logs its traceback as an error,
    and the failure reaches the user as one sentence all the same (:class:`ExportError`)."""
    loggers = [logging.getLogger(name) for name in ("torch._export", "torch.export", "torch.fx.experimental",
                                                    "torch._dynamo", "torch.utils._sympy", "torch._subclasses")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings(), this_thread_silent():
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def where(exc: BaseException) -> str:
    """``at FILE:LINE in FUNCTION (`code`)``: the innermost frame of the model's own code (not torch's, Python's or
    this package's) in the traceback of ``exc`` and its causes; ``in torch's own code`` where there is none."""
    frames: list[traceback.FrameSummary] = []
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        frames = traceback.extract_tb(error.__traceback__) + frames
        error = error.__cause__ or error.__context__
    ours = [f for f in frames if not _library_file(f.filename)]
    return _at(ours[-1]) if ours else "in torch's own code"


def _at(frame: traceback.FrameSummary) -> str:
    """``at FILE:LINE in FUNCTION (`code`)``."""
    code = f" (`{frame.line.strip()}`)" if frame.line else ""
    return f"at {_shorter_path(frame.filename)}:{frame.lineno} in {frame.name}{code}"


_LIBRARIES = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, contextlib, sympy) if m.__file__)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _library_file(filename: str) -> bool:
    """Whether a frame's file is torch's, Python's or this package's (not the model's code)."""
    path = os.path.abspath(filename)
    return path.startswith(_LIBRARIES) or path.startswith(_PACKAGE) or filename.startswith("<frozen")


def _shorter_path(filename: str) -> str:
    """A path relative to the working directory where it is below it, else from its package folder on."""
    relative = os.path.relpath(filename)
    if not relative.startswith(".."):
        return relative
    parts = filename.split(os.sep)
    return os.sep.join(parts[parts.index("site-packages") + 1:]) if "site-packages" in parts else filename


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _batch_size(program: torch.export.ExportedProgram) -> torch.SymInt | int:
    """The input's batch size as the capture holds it: a symbol, or an int where the capture fixed it."""
    name = next(s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT")
    return next(n for n in program.graph.nodes if n.name == name).meta["val"].shape[0]


def _batch_branch(program: torch.export.ExportedProgram, batch: torch.SymInt) -> str | None:
    """Where the model's code depends on the batch size's value (``at FILE:LINE in FUNCTION (`code`)``, or the batch
    sizes the capture holds for), None where the capture holds for every batch size: a guard torch.export recorded on
    the symbol from the model's code (``if x.shape[0] == 1``), or a range it narrowed the symbol to. A guard in
    torch's own code is one of its decisions for sizes other than 1, which a capture without size-oblivious sizes
    takes for every symbolic size, and the ops it leads to run at any size."""
    symbol = batch.node.expr
    for guard in batch.node.shape_env.guards:
        if symbol not in guard.expr.free_symbols:
            continue
        frame = guard.sloc.maybe_user_loc or guard.sloc.framework_loc
        if not isinstance(frame, traceback.FrameSummary):
            return f"({guard.expr})"
        if not _library_file(frame.filename):
            return _at(frame)
    bounds = program.range_constraints.get(symbol)
    if bounds is not None and (bounds.lower > CAPTURE_BATCH or bounds.upper != int_oo):
        return f"(torch.export holds its graph for batch sizes {bounds.lower} to {bounds.upper} only)"
    return None


def _writes_through_aliases(program: torch.export.ExportedProgram) -> bool:
    """Whether an op writes in place where the frontend's out-of-place rewrite would not reach every reader: into a
    view (or a tensor that has views), or with no out-of-place form the frontend knows."""
    order = {node: i for i, node in enumerate(program.graph.nodes)}
    for node in program.graph.nodes:
        if node.op != "call_function" or not aten.is_in_place(node.target):
            continue
        first = node.args[0] if node.args else None
        form = aten.as_torch_call(node.target, node.args, node.kwargs, 1)
        if form is aten.IDENTITY:
            continue  # it writes nothing: dropout outside training
        if form in (None, aten.DROP) or not isinstance(first, fx.Node):
            return True
        if _aliased(first) and not _view_of_a_spent_tensor(first, order[node], order):
            return True
    return False


def _view_of_a_spent_tensor(view: fx.Node, written_at: int, order: dict[fx.Node, int]) -> bool:
    """Whether ``view`` is a view (with no views of its own; through a chain of views nothing else reads) of a
    computed tensor that nothing reads after position ``written_at`` but through ``view``: a write into it then
    reaches no other reader (GhostNet's ``cat(...)[:, :c]`` followed by ``+=``), so the out-of-place rewrite stays
    exact."""
    if any(aten.is_view(user.target) for user in view.users):
        return False
    while view.target is not operator.getitem and aten.is_view(view.target):  # up a chain of views to its base
        base = view.args[0]
        if not isinstance(base, fx.Node) or base.op != "call_function" or base.target is operator.getitem:
            return False
        if not aten.is_view(base.target):
            return not any(_read_after(user, written_at, order) for user in base.users if user is not view)
        if len(base.users) > 1:
            return False
        view = base
    return False


def _read_after(node: fx.Node, position: int, order: dict[fx.Node, int]) -> bool:
    """Whether ``node`` comes after ``position``, or is a view that something after it reads."""
    return order[node] > position or \
        (aten.is_view(node.target) and any(_read_after(user, position, order) for user in node.users))


def _aliased(node: fx.Node) -> bool:
    """Whether a tensor is a view of another (an item of ``chunk`` included), or another node views it."""
    source = node.args[0] if node.target is operator.getitem and node.args else node
    if isinstance(source, fx.Node) and aten.is_view(source.target):
        return True
    return any(aten.is_view(user.target) for user in node.users)


def as_torch_graph(program: torch.export.ExportedProgram, module: nn.Module) -> fx.GraphModule:
    """The exported graph as torch-level fx code over ``module``'s own tensors (see the module docstring); each node
    keeps export's ``val`` and ``nn_module_stack``."""
    return _Rewrite(program, module).run()


class _Rewrite:
    """One rewrite of an exported graph (state lives for the duration of :meth:`run`)."""

    def __init__(self, program: torch.export.ExportedProgram, module: nn.Module) -> None:
        self.program = program
        self.module = module
        self.graph = fx.Graph()
        self.env: dict[fx.Node, Any] = {}
        self.tensors: dict[fx.Node, tuple[str, Any]] = {}  # placeholders of tensors, read where first used
        self.reads: dict[str, fx.Node] = {}
        self.installed: dict[str, Any] = {}
        self.layers = _layer_calls(program, module)
        self.first_items: set[fx.Node] = set()  # functional batch-norms whose item 0 is the call itself

    def run(self) -> fx.GraphModule:
        """The rewritten graph module."""
        specs = {s.arg.name: s for s in self.program.graph_signature.input_specs}
        for node in self.program.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node, specs[node.name])
            elif node.op == "get_attr":  # a subgraph of a higher-order op
                target = f"_captured_{node.target}"
                self.tensors[node] = (target, getattr(self.program.graph_module, str(node.target)))
                self.installed[target] = self.tensors[node][1]
            elif node.op == "output":
                self._output(node)
            elif node in self.layers.calls:
                self._layer(node)
            elif node not in self.layers.inside:
                self._call(node)
        self.graph.lint()
        gm = self._graph_module()
        gm.meta["output"] = self.output
        _merge_slices(gm)
        return gm

    def _placeholder(self, node: fx.Node, spec: Any) -> None:
        kind = spec.kind.name
        if kind == "USER_INPUT":
            self.env[node] = self.graph.placeholder(node.name)
            self.env[node].meta.update(_kept_meta(node))
        elif kind in ("PARAMETER", "BUFFER"):
            self.tensors[node] = (spec.target, _attribute(self.module, spec.target))
        elif kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
            value = self.program.constants[spec.target]
            own = _attribute(self.module, spec.target, None) is value
            self.tensors[node] = (spec.target if own else f"_captured_{spec.target.replace('.', '_')}", value)
            if not own:
                self.installed[self.tensors[node][0]] = value
        else:  # a token of an effectful op
            raise ExportError(f"it has an effect torch.export records as a {kind.lower()} input")

    def _value(self, node: fx.Node) -> Any:
        """What a node of the exported graph stands for in the new graph (a tensor read where first used)."""
        if node not in self.env and node in self.tensors:
            target, value = self.tensors[node]
            if target not in self.reads:
                self.reads[target] = self.graph.get_attr(target)
                if isinstance(value, torch.Tensor):
                    self.reads[target].meta["tensor_meta"] = _extract_tensor_metadata(value)
            self.env[node] = self.reads[target]
        return self.env[node]

    def _layer(self, node: fx.Node) -> None:
        path, source = self.layers.calls[node]
        call = self.graph.call_module(path, (self._value(source),))
        call.meta.update(_kept_meta(node))
        self.env[node] = call

    def _call(self, node: fx.Node) -> None:
        if not node.users and _pure(node.target):
            return  # an item of a tuple nothing reads, say
        args = fx.node.map_arg(node.args, self._value)
        kwargs = fx.node.map_arg(node.kwargs, self._value)
        if node.target is operator.getitem and node.args[0] in self.first_items and node.args[1] == 0:
            self.env[node] = args[0]
            return
        first = node.args[0] if node.args else None
        value = first.meta.get("val") if isinstance(first, fx.Node) else None
        rewritten = self._functional_batch_norm(node, args) or \
            aten.as_torch_call(node.target, args, kwargs, value.dim() if isinstance(value, torch.Tensor) else 0)
        if rewritten is aten.DROP:
            return
        if rewritten is aten.IDENTITY or (rewritten is None and _is_copy(node.target) and not _written(node)):
            self.env[node] = args[0]  # the input itself, or a copy nothing writes into
            return
        if isinstance(rewritten, aten.Call):
            new = self.graph.create_node(rewritten.op, rewritten.target, rewritten.args, rewritten.kwargs)
        else:
            new = self.graph.create_node("call_function", node.target, args, kwargs, name=_name(node.target))
        new.meta.update(_kept_meta(node))
        self.env[node] = new

    def _functional_batch_norm(self, node: fx.Node, args: tuple[Any, ...]) -> aten.Call | None:
        """A functionalized eval batch-norm whose statistics nothing reads, as ``F.batch_norm`` (its ``getitem(_,
        0)`` then reads the call itself)."""
        if not isinstance(node.target, torch._ops.OpOverload) or \
                node.target.overloadpacket.__name__ != _FUNCTIONAL_BATCH_NORM or \
                not all(u.target is operator.getitem and u.args[1] == 0 for u in node.users):
            return None
        x, weight, bias, mean, var, momentum, eps = args
        self.first_items.add(node)
        return aten.Call("call_function", F.batch_norm, (x, mean, var, weight, bias, False, momentum, eps), {})

    def _output(self, node: fx.Node) -> None:
        returned = cast(Sequence[fx.Node], node.args[0])  # the output node's one argument: the tuple returned
        values = fx.node.map_arg(returned, self._value)
        users = [i for i, spec in enumerate(self.program.graph_signature.output_specs)
                 if spec.kind.name == "USER_OUTPUT"]
        spec = self.program.call_spec.out_spec
        self.graph.output(pytree.tree_unflatten([values[i] for i in users], spec))
        self.output = pytree.tree_unflatten([_meta_value(returned[i]) for i in users], spec)

    def _graph_module(self) -> fx.GraphModule:
        """A graph module over the user's module (its layers and tensors shared, the module itself unchanged), with
        the tensors it does not hold installed on the graph module. Its Python code is generated when it is first
        called or read, not after each of the import's passes."""
        gm = _LazyGraphModule(self.module, fx.Graph())
        for target, value in self.installed.items():
            if target in self.reads:
                if isinstance(value, nn.Module):
                    gm.add_submodule(target, value)
                else:
                    gm.register_buffer(target, value)
        for node in self.graph.nodes:
            if node.op in ("get_attr", "call_module") and node.target not in self.installed:
                _copy_attr(self.module, gm, str(node.target))
        gm.graph = self.graph
        return gm


class _LayerCalls:
    """The layer calls of an exported graph that become ``call_module`` nodes: by output node, the layer's path and
    the node it reads; and every other node inside those calls."""

    def __init__(self) -> None:
        self.calls: dict[fx.Node, tuple[str, fx.Node]] = {}
        self.inside: set[fx.Node] = set()


def _layer_calls(program: torch.export.ExportedProgram, module: nn.Module) -> _LayerCalls:
    """The calls of torch layers in an exported graph that read one tensor and give one (see the module docstring)."""
    calls: dict[str, tuple[str, list[fx.Node]]] = {}
    for node in program.graph.nodes:
        stack = node.meta.get("nn_module_stack") if node.op == "call_function" else None
        if stack:
            key, (path, _) = list(stack.items())[-1]
            calls.setdefault(key, (path, []))[1].append(node)
    owned = {s.arg.name: s.target for s in program.graph_signature.input_specs if s.target is not None}
    found = _LayerCalls()
    for path, nodes in calls.values():
        layer = _attribute(module, path, None) if path else None
        call = _single_call(nodes, path, owned) if _known_layer(layer) else None
        if call is not None:
            found.calls[call[0]] = (path, call[1])
            found.inside.update(n for n in nodes if n is not call[0])
    return found


def _single_call(nodes: list[fx.Node], path: str, owned: dict[str, str]) -> tuple[fx.Node, fx.Node] | None:
    """(output node, input node) where ``nodes`` read one tensor from outside besides the layer's own tensors, and
    one of them, a tensor, is read outside; None otherwise."""
    members = set(nodes)
    outside = [n for n in nodes if any(u not in members for u in n.users)]
    sources = {s for n in nodes for s in n.all_input_nodes
               if s not in members and not owned.get(s.name, "").startswith(path + ".")}
    if len(outside) != 1 or len(sources) != 1 or not isinstance(outside[0].meta.get("val"), torch.Tensor):
        return None
    source = next(iter(sources))
    return (outside[0], source) if isinstance(source.meta.get("val"), torch.Tensor) else None


def _known_layer(layer: Any) -> bool:
    """A layer the frontend knows by class (:data:`KNOWN_LAYERS`), or a childless torch layer of ``torch.nn.modules``
    whose ``forward`` takes one input and returns one tensor; either without forward hooks (a hook's code, such as
    the weight a pruned layer computes before each call, is captured with the layer's and stays in the graph)."""
    if not isinstance(layer, nn.Module) or next(layer.children(), None) is not None or hooked(layer):
        return False
    kind = type(layer)
    if kind.__name__ in KNOWN_LAYERS:
        return True
    if not kind.__module__.startswith("torch.nn.modules.") or not kind.forward.__module__.startswith("torch.nn."):
        return False
    signature = signature_of(kind.forward)
    if signature is None:
        return False
    required = [p for p in list(signature.parameters.values())[1:]
                if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    returns_tensor = signature.return_annotation in (torch.Tensor, "Tensor") or \
        (isinstance(layer, _MAX_POOLS) and not getattr(layer, "return_indices", False))
    return len(required) == 1 and returns_tensor


def _pure(target: Any) -> bool:
    """Whether a call has no effect besides its result: ``getitem`` and ATen ops that write into no argument."""
    if target is operator.getitem:
        return True
    return isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable


def _is_copy(target: Any) -> bool:
    """``aten.clone``, ``aten.contiguous`` or ``aten.lift_fresh_copy``: a copy of its input's values."""
    return isinstance(target, torch._ops.OpOverload) and \
        target.overloadpacket.__name__ in ("clone", "contiguous", "lift_fresh_copy")


def _written(node: fx.Node) -> bool:
    """Whether an op writes into ``node``'s result or into a view of it."""
    for user in node.users:
        reads_it = bool(user.args) and user.args[0] is node
        if reads_it and (aten.is_in_place(user.target) or (aten.is_view(user.target) and _written(user))):
            return True
    return False


def _name(target: Any) -> str:
    """A node name for an ATen op, as export names it (``upsample_bilinear2d``)."""
    return target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else \
        getattr(target, "__name__", "op")


def _meta_value(value: Any) -> Any:
    """An output node's fake value, or the constant itself."""
    return value.meta.get("val") if isinstance(value, fx.Node) else value


def _kept_meta(node: fx.Node) -> dict[str, Any]:
    return {k: node.meta[k] for k in ("val", "nn_module_stack") if k in node.meta}


def _attribute(root: Any, target: str, *default: Any) -> Any:
    """``root``'s attribute at a dotted path (``default`` where there is none, else AttributeError)."""
    value = root
    for part in target.split(".") if target else ():
        if not hasattr(value, part):
            if default:
                return default[0]
            raise AttributeError(target)
        value = getattr(value, part)
    return value


def _merge_slices(gm: fx.GraphModule) -> None:
    """``x[:, :, 1:][:, :, :, 1:]`` (export slices one dimension at a time) becomes ``x[:, :, 1:, 1:]``, as code
    writes it, where the first slice has no other reader."""
    for node in list(gm.graph.nodes):
        source = node.args[0] if _slices(node) else None
        if not (_slices(source) and len(source.users) == 1):
            continue
        first, second = (cast(tuple[slice, ...], n.args[1]) for n in (source, node))  # as _slices checked
        width = max(len(first), len(second))
        padded = [tuple(index) + (slice(None),) * (width - len(index)) for index in (first, second)]
        if any(a != slice(None) and b != slice(None) for a, b in zip(*padded)):
            continue
        node.args = (source.args[0], tuple(b if b != slice(None) else a for a, b in zip(*padded)))
        gm.graph.erase_node(source)
    gm.recompile()


def _slices(node: Any) -> TypeGuard[fx.Node]:
    """A getitem of a tensor by a tuple of slices only."""
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target is operator.getitem and \
        isinstance(node.args[1], tuple) and all(isinstance(i, slice) for i in node.args[1])


class _Sizes:
    """Symbolic sizes evaluated at one batch size, and how they grow with the batch, cached by expression."""

    def __init__(self, symbol: sympy.Symbol, batch: int) -> None:
        self.symbol = symbol
        self.batch = batch
        self.cache: dict[Any, tuple[int, bool, int | None]] = {}

    def of(self, size: Any) -> tuple[int, bool, int | None]:
        """(the size at the batch size, whether it grows with the batch, its size per sample: None where it does not
        grow in proportion)."""
        if not isinstance(size, torch.SymInt):
            return int(size), False, int(size)
        expr = size.node.expr
        if expr not in self.cache:
            if expr.free_symbols - {self.symbol}:
                raise ExportError(f"a tensor's size ({expr}) depends on the data, not only on the batch size")
            per_sample = expr.subs(self.symbol, 1)
            proportional = sympy.expand(expr - self.symbol * per_sample) == 0
            self.cache[expr] = (int(expr.subs(self.symbol, self.batch)), self.symbol in expr.free_symbols,
                                int(per_sample) if proportional else None)
        return self.cache[expr]


def record_shapes(gm: fx.GraphModule, batch: int) -> None:
    """Record on every node of a captured graph what a run at ``batch`` samples would: ``tensor_meta`` of tensors and
    tuples of tensors, ``value`` of sizes and other values, and on tensors computed from the input ``batch_dims`` and
    ``sample_shape`` (as :func:`~ios_ray.frontend.trace.record_batch_layout` does). A node added since the capture
    (:func:`~ios_ray.frontend.outputs.one_output`'s) is evaluated on export's fake values first. The fake values are
    dropped afterwards (they hold torch.export's whole shape environment). ExportError where a size depends on the
    data."""
    sizes = _Sizes(gm.meta["batch_symbol"], batch)
    constants = constant_nodes(gm.graph)
    for node in gm.graph.nodes:
        if "val" not in node.meta and node.op in ("call_function", "call_method"):
            node.meta["val"] = _fake_value(node)
        if "val" not in node.meta:
            continue
        value = node.meta["val"]
        if isinstance(value, torch.Tensor):
            node.meta["tensor_meta"] = _tensor_meta(value, sizes)
            if node not in constants:
                node.meta["batch_dims"], node.meta["sample_shape"] = _layout(value, sizes)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            node.meta["tensor_meta"] = [_tensor_meta(v, sizes) for v in value]
            if node not in constants and not all(batch_first(*_layout(v, sizes)) for v in value):
                node.meta["batch_dims"] = node.meta["sample_shape"] = None
        else:
            node.meta["value"] = _concrete(value, sizes)
    for node in gm.graph.nodes:
        node.meta.pop("val", None)
    for key in ("batch_symbol", "output"):
        gm.meta.pop(key, None)


def _tensor_meta(value: torch.Tensor, sizes: _Sizes) -> TensorMetadata:
    """What torch.fx's shape propagation records of a tensor at the example's batch size, less its memory format
    (which nothing reads)."""
    shape = [sizes.of(s)[0] for s in value.shape]
    stride = [sizes.of(s)[0] for s in value.stride()]
    return TensorMetadata(torch.Size(shape), value.dtype, value.requires_grad, tuple(stride), None, False, {})


def _layout(value: torch.Tensor, sizes: _Sizes) -> tuple[tuple[bool, ...], tuple[int, ...] | None]:
    found = [sizes.of(s) for s in value.shape]
    per_sample = [sample if grows else size for size, grows, sample in found]
    known = [s for s in per_sample if s is not None]
    return tuple(grows for _, grows, _ in found), tuple(known) if len(known) == len(per_sample) else None


def _fake_value(node: fx.Node) -> Any:
    """A node's value computed on the fake values of what it reads (in their fake mode, so sizes stay symbolic)."""
    inputs = [n.meta["val"] for n in node.all_input_nodes]
    mode = next(v.fake_mode for v in inputs if isinstance(v, torch.Tensor))  # type: ignore[attr-defined]  # fake
    args = fx.node.map_arg(node.args, lambda n: n.meta["val"])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: n.meta["val"])
    with mode:
        if node.op == "call_method":
            return getattr(args[0], str(node.target))(*args[1:], **kwargs)
        return node.target(*args, **kwargs)  # type: ignore[operator]


def _concrete(value: Any, sizes: _Sizes) -> Any:
    if isinstance(value, torch.SymInt):
        return sizes.of(value)[0]
    if isinstance(value, (list, tuple)):
        return type(value)(_concrete(v, sizes) for v in value)
    return value
