"""Fused kernels on this CPU: IOS with fused kernels against IOS with eager ones (as before) and torch.compile.

The parts (``--part``):

* ``side-by-side``: for each model and batch size, a search with ``kernels="eager"`` (the IOS schedule as ios-ray
  found it before fused kernels) and one with ``kernels="fused"``, each on a store of its own; then, in one process
  and in interleaved rounds, eager, the eager search's IOS schedule with eager kernels ("IOS eager"), the fused
  search's with fused kernels ("IOS fused") and ``torch.compile`` (default mode). Ratios are per round, with 95%
  intervals (:func:`~ios_ray.paired.median_interval`). Target: IOS fused never slower than IOS eager beyond noise
  (the interval of fused / eager not wholly above 1).
* ``packing`` (not run by default): the sequential schedule with fused kernels, oneDNN's weights packed for each
  input shape (as deployed) against packed for batch 1 (as before 2026-11-27), beside ``torch.compile`` (default
  mode), no search (``--models`` may name library models: ``torchvision:resnet50``). Target: per shape never slower
  beyond noise than batch-1 packing.
* ``residual`` (not run by default): the sequential schedule with fused kernels, each identity shortcut's sum (and
  the activation after it) inside its conv's oneDNN call, as imported, against the same model imported with those
  sums left as add units (as before 2026-11-27), beside ``torch.compile``, no search. Target: never slower beyond
  noise.
* ``linear-and-opaque`` (not run by default): the sequential schedule with fused kernels, linear layers as one oneDNN
  call with their activation and opaque units of torch's own ops given channels-last inputs as they come (as
  deployed), against the same model's program with linear layers as torch runs them and every opaque unit given the
  graph's format (as before 2026-11-27, fused kernels' version 2), beside ``torch.compile``, no search. Target: never
  slower beyond noise.
* ``moved-linears`` (not run by default): the sequential schedule with fused kernels, a linear layer on a tensor whose
  batch a transpose moved run before the transpose, as a linear unit (as imported:
  :func:`~ios_ray.frontend.rewrites.linears_before_batch_moves`; ``nn.MultiheadAttention``'s in-projection), against
  the same model imported without that pass (as before 2026-11-27: the projection computed again inside each unit
  that reads it), beside ``torch.compile``, no search. Target: never slower beyond noise.
* ``five-dims`` (not run by default): the sequential schedule with fused kernels, opaque units whose output has five
  dimensions (a split of a conv's channels, a stack of paths: ResNeSt's and SKNet's split attention) given their
  inputs in the graph's format (as deployed: :data:`~ios_ray.runtime.kernels.MOST_DIMS_AS_THEY_COME`), against
  given them channels-last as they come (as before 2026-11-27, fused kernels' version 3), beside ``torch.compile``,
  no search. Target: never slower beyond noise.
* ``path-sums`` (not run by default): the sequential schedule with fused kernels, split attention's sums over paths
  imported as sums of the paths (as imported: :func:`~ios_ray.frontend.paths.path_sums`), against the same model
  imported without that pass (as before 2026-11-27: a five-dimensional tensor of paths, summed over dimension 1),
  beside ``torch.compile``, no search. Target: never slower beyond noise.
* ``scales`` (not run by default): the sequential schedule with fused kernels, a multiply by a number before or after
  a conv (NF-ResNet's ``x * beta`` and ``x * alpha``) folded into its weights, so the residual sum after it is the
  conv's too (as imported: :mod:`~ios_ray.frontend.conv`), against the same model imported with those multiplies
  left as steps (as before 2026-11-27), beside ``torch.compile``, no search. Target: never slower beyond noise.
* ``concatenated-convs`` (not run by default): the sequential schedule with fused kernels, concatenations of convs
  as imported (:mod:`~ios_ray.frontend.concats`: alike convs on equal channel slices of one tensor as one grouped
  conv, a batch-norm and activation after a concatenation of convs folded into each conv; MixNet's mixed convs),
  against the same model imported without those passes (as before 2026-11-27), beside ``torch.compile``, no search.
  Target: never slower beyond noise.
* ``gate-scalings`` (not run by default): the sequential schedule with fused kernels, a squeeze-excitation scaling
  ``x * gate`` with the multiplies by numbers after it applied to the gate (NFNet's ``* attn_gain * alpha``) and the
  residual sum after it of a tensor ``x`` came from added in the same pass (``torch.addcmul``: SE-ResNet's
  ``se(out) + shortcut``), as imported (:func:`~ios_ray.frontend.patterns.match_scale`), against the same model
  imported with both left as steps and an add unit (as before 2026-11-27), beside ``torch.compile``, no search.
  Target: never slower beyond noise.
* ``gates`` (not run by default): the sequential schedule with fused kernels, attention gates as imported
  (:mod:`~ios_ray.frontend.gates`: efficient channel attention's ``Conv1d`` across pooled channels as a 1x1 conv, an
  ``expand`` before a broadcasting multiply dropped; a product of two branches or a spatial gate one ``scale`` unit,
  :func:`~ios_ray.frontend.patterns.match_scale`), against the same model imported without them (as before
  2026-12-07: opaque units, scale units only for (C, 1, 1) gates), beside ``torch.compile``, no search. Target: never
  slower beyond noise.
* ``parallel-branches`` (not run by default): the sequential schedule with fused kernels, sums of parallel conv
  branches on one input (RepVGG's, MobileOne's, FastViT's and RepGhostNet's training-time blocks: convs with their
  batch-norms, a batch-norm of the input, the input) imported as one conv each
  (:func:`~ios_ray.frontend.branches.branches_as_one_conv`), against the same model imported without that pass (as
  before 2026-11-28: a conv unit per branch and the sums as add units), beside ``torch.compile``, no search. Target:
  never slower beyond noise.
* ``inductor-layout`` (not run by default): the sequential and the greedy schedule with inductor kernels, activations
  held channels-last (as deployed) against held in the graph's format (as before 2026-11-28, inductor kernels'
  version 1), beside ``torch.compile``. Target: never slower beyond noise, outputs within the model's tolerance.
* ``inductor-lone-units`` (not run by default): the sequential and the greedy schedule with inductor kernels, what runs
  outside a region (a group of one unit beside a stage's others, a run of one unit) bound as fused kernels bind it
  (as deployed: one oneDNN call with its bias and activation) against as torch's own ops (as before 2026-12-07,
  inductor kernels' version 2), regions compiled first, beside fused kernels and ``torch.compile``. Target: never
  slower beyond noise, outputs within the model's tolerance.
* ``opaque-code`` (not run by default): the sequential schedule with fused kernels, opaque units as deployed (their
  fx nodes turned into Python once: :func:`~ios_ray.runtime.units.unit_code`; a 4-D input that is a permuted view,
  as another such unit returns one, copied into the graph's format: :class:`~ios_ray.runtime.kernels.AsTheyCome`),
  against the same model's program as before 2026-11-28 (each node looked up and called in turn; every input of a
  layout-free unit as it comes), beside ``torch.compile``, no search. Target: never slower beyond noise.
* ``pass-code`` (not run by default): a schedule's forward pass as deployed (written once as straight-line code:
  :func:`~ios_ray.runtime.codegen.pass_code`, each stage's code called on its inputs, each group's one line per
  unit), against the same compiled stages run as before 2026-11-28 (a loop over the stages updating a dict of
  outputs, each unit's inputs looked up by name and evaluated in turn), the sequential and the greedy schedule,
  beside ``torch.compile``, no search. Target: never slower beyond noise.
* ``versus-compile`` (not run by default): where a model still runs slower with ios-ray than with ``torch.compile``:
  the sequential schedule with eager and with fused kernels beside ``torch.compile`` (default mode) and the model as
  is, no search (the probe behind bench/RESULTS.md's tables of library models against ``torch.compile``). Target:
  fused never slower than ``torch.compile`` beyond noise, outputs within 1e-5 of the model.
* ``regions`` (not run by default): Inductor regions (``inductor`` kernels: each run of stages not of several groups
  compiled into one function, :mod:`~ios_ray.runtime.regions`) against fused kernels, the sequential schedule (one
  region: the whole model) and the greedy one (regions between its stages of several groups), beside
  ``torch.compile`` (default mode) and the model as is, no search; each region compiled before the rounds (its
  compile time in the table). Target: the faster of fused and inductor as the sequential schedule (what
  ``kernels="auto"`` keeps, where it measures the same) never slower than ``torch.compile`` beyond noise, every
  output within the tolerance ``ios-ray run`` holds a deployment to (a compiler orders sums as it likes: 10x the
  model's own float32 error against float64, at least 1e-5; :func:`~ios_ray.runtime.accuracy.model_tolerance`).
* ``ios-ray-bench``: what a user runs: ``ios-ray search`` (default kernels: ``auto``) and ``ios-ray bench`` on
  SqueezeNet at batch 1, in fresh processes. Target: the IOS row (named for its kernels) within 10% of
  ``torch.compile``'s median, or faster.

Run: python bench/kernels.py [--models inception_v3,squeezenet] [--batches 1,8] [--rounds 30] [--folder DIR]
[--part packing|residual|linear-and-opaque|moved-linears|five-dims|path-sums|
scales|concatenated-convs|gate-scalings|gates|parallel-branches|opaque-code|pass-code|
versus-compile|regions|inductor-layout|inductor-lone-units]
(on 2 cores with the defaults: about 40 minutes of searches on fresh stores, each Inception V3 search 7-9 minutes,
then the rounds; a run again on the same --folder measures only what its stores lack; exit code 1 when a target is
missed)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Mapping
from unittest import mock

import torch
import torch.fx as fx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import ios_ray  # noqa: E402
from bench.model_libraries import _define_torchvision_schemas, randomised  # noqa: E402
from bench.verdict import run_parts  # noqa: E402
from ios_ray.app.cli.bench import compiled_variants  # noqa: E402
from ios_ray.runtime.accuracy import FLOAT32_TOLERANCE, model_tolerance, relative_error  # noqa: E402
from ios_ray.frontend import Imported, Model, import_model, load_model, output_tensor  # noqa: E402
from ios_ray.paired import REPORT_CONFIDENCE, RatioInterval, median_interval, percent, ratios_of  # noqa: E402
from ios_ray.runtime import Program, Programs, ScheduleRunner  # noqa: E402
from ios_ray.ir import GRAPH_INPUT  # noqa: E402
from ios_ray.runtime.kernels import AsTheyCome, InGraphFormat, OneDnnConv, OneDnnLinear  # noqa: E402
from ios_ray.runtime.regions import Region  # noqa: E402
from ios_ray.runtime.stages import InlineStage, ParallelStage  # noqa: E402
from ios_ray.paired import summary_ms  # noqa: E402
from ios_ray.runtime.timing import interleaved_samples_ms  # noqa: E402
from ios_ray.runtime.units import CodeCall, Epilogue, eager_conv, eager_linear  # noqa: E402
from ios_ray.schedule import Schedule  # noqa: E402
from ios_ray.scheduler.baselines import baseline_schedule  # noqa: E402

#: IOS fused may be at most this much slower than torch.compile's median in ``ios-ray bench`` (issue 44).
COMPILE_MARGIN = 1.10


def side_by_side(models: list[str], batches: list[int], rounds: int, folder: Path, console: Console
                 ) -> tuple[Table, bool]:
    """Search each model with eager and with fused kernels, then time both IOS schedules beside eager and
    torch.compile."""
    table = Table("model", "batch", "eager ms", "IOS eager ms", "IOS fused ms", "torch.compile ms",
                  f"IOS fused / IOS eager ({percent(REPORT_CONFIDENCE)})",
                  f"IOS fused / torch.compile ({percent(REPORT_CONFIDENCE)})", "max rel err", "target",
                  title="fused kernels against eager ones and torch.compile (CPU, interleaved rounds)")
    passed = True
    for model in models:
        loaded = _loaded(model)
        module = loaded.module.eval()
        programs = Programs(import_model(loaded))
        for batch in batches:
            kept = {kernels: _search(model, batch, kernels, folder, console) for kernels in ("eager", "fused")}
            x = torch.randn(batch, *loaded.input_shape)
            calls = {f"IOS {k}": ScheduleRunner(programs("cpu", k), s) for k, s in kept.items()}
            timed = _Timed.of(calls, module, x, rounds, f"{model} bs{batch}", console)
            versus_eager = timed.ratio("IOS fused", "IOS eager")
            ok = _not_slower(versus_eager)
            passed &= ok
            table.add_row(model, str(batch), *timed.cells(AS_IS, "IOS eager", "IOS fused", "torch.compile"),
                          _cell(versus_eager), _cell(timed.ratio("IOS fused", "torch.compile")),
                          f"{max(timed.errors.values()):.1e}", "PASS" if ok else "FAIL")
    return table, passed


def packing(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, weights packed per input shape against packed for batch 1, beside
    torch.compile, in interleaved rounds."""
    table = _versus_table("oneDNN weights packed per input shape against packed for batch 1", [], "per shape",
                          "batch 1")
    passed = True
    for model in models:
        loaded = _loaded(model)
        module, imported = loaded.module.eval(), import_model(loaded)
        for batch in batches:
            x = torch.randn(batch, *loaded.input_shape)
            schedule = baseline_schedule(imported.graph, device="cpu", batch=batch, kernels="fused")
            per_shape, batch_one = (ScheduleRunner(Programs(imported)("cpu", "fused"), schedule) for _ in range(2))
            with torch.inference_mode():
                batch_one(x[:1])  # packs every conv the schedule runs for batch 1 ...
                for fn in batch_one.program.fns.values():
                    if isinstance(fn, OneDnnConv):  # ... and uses those weights at this batch too
                        fn.packed.update({(batch, *shape[1:]): weight for shape, weight in fn.packed.items()})
            timed = _Timed.of({"per shape": per_shape, "batch 1": batch_one}, module, x, rounds, f"{model} bs{batch}",
                              console)
            ok = _not_slower(timed.ratio("per shape", "batch 1"))
            passed &= ok
            table.add_row(model, str(batch), *timed.versus("per shape", "batch 1", ok))
    return table, passed


def residual(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, residual sums inside the convs against left as add units, beside
    torch.compile, in interleaved rounds."""
    return _imports_on_and_off(
        "residual sums inside oneDNN's convolution against as add units", "residual convs",
        _all_patched(("ios_ray.frontend.conv.residual_of",), return_value=None),
        lambda now, _: sum(1 for unit in now.graph.units if unit.attrs.get("residual")),
        models, batches, rounds, console, names=("in conv", "as a unit"))


def linear_and_opaque(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, linear layers in oneDNN and layout-free opaque units on
    channels-last inputs, against both as before, beside torch.compile, in interleaved rounds."""
    table = _versus_table("linear layers in oneDNN and opaque units on channels-last inputs against before",
                          ["oneDNN linears", "layout-free opaque units"], "now", "before")
    passed = True
    for model in models:
        loaded = _loaded(model)
        imported = import_model(loaded)
        now = Programs(imported)("cpu", "fused")
        with mock.patch("ios_ray.runtime.program.linear_binder", return_value=eager_linear), \
                mock.patch("ios_ray.runtime.kernels.layout_free", return_value=False):
            before = Programs(imported)("cpu", "fused")
        linears = sum(1 for fn in now.fns.values() if isinstance(fn, OneDnnLinear) or
                      isinstance(fn, Epilogue) and isinstance(fn.body, OneDnnLinear))
        opaque = [unit.id for unit in imported.graph.units if unit.kind == "opaque"]
        free = sum(1 for unit in opaque if isinstance(now.fns[unit], AsTheyCome))
        counts = [str(linears), f"{free} of {len(opaque)}"]
        passed &= _two_programs(table, loaded, {"now": now, "before": before}, counts, batches, rounds, console)
    return table, passed


def moved_linears(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, linear layers run before the transposes that move their input's
    batch against imported without that pass, beside torch.compile, in interleaved rounds."""
    return _pass_on_and_off("linears_before_batch_moves", "linear", "linear layers before the transposes that move "
                            "the batch against after them", "moved linears", models, batches, rounds, console)


def five_dims(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, opaque units whose output has five dimensions given their inputs in
    the graph's format against given them channels-last as they come, beside torch.compile, in interleaved rounds."""
    table = _versus_table("opaque units with five-dimensional outputs on inputs in the graph's format against on "
                          "channels-last ones", ["five-dimensional opaque units"], "now", "before")
    passed = True
    for model in models:
        loaded = _loaded(model)
        imported = import_model(loaded)
        now = Programs(imported)("cpu", "fused")
        with mock.patch("ios_ray.runtime.kernels.MOST_DIMS_AS_THEY_COME", sys.maxsize):
            before = Programs(imported)("cpu", "fused")
        count = sum(isinstance(now.fns[unit], InGraphFormat) and not isinstance(before.fns[unit], InGraphFormat)
                    for unit in now.fns)
        passed &= _two_programs(table, loaded, {"now": now, "before": before}, [str(count)], batches, rounds, console)
    return table, passed


def path_sums(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, split attention's sums over paths imported as sums of the paths,
    against the same model imported without that pass, beside torch.compile, in interleaved rounds."""
    return _pass_on_and_off("path_sums", "scale", "split attention summed path by path against over a tensor of "
                            "paths", "products of a path and its attention", models, batches, rounds, console)


def scales(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, multiplies by numbers before and after convs folded into their
    weights against left as steps of their own, beside torch.compile, in interleaved rounds."""
    return _imports_on_and_off(
        "multiplies by numbers folded into the convs' weights against run as steps", "convs with a multiply",
        _all_patched(("ios_ray.frontend.conv.scalar_multiple",), return_value=None),
        lambda now, _: sum(1 for unit in now.graph.units if {"in_scale", "out_scale"} & set(unit.attrs)),
        models, batches, rounds, console)


def gate_scalings(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, squeeze-excitation scalings with the multiplies by numbers after
    them applied to the gate and the residual sum after them in the same pass, against both as steps and units of
    their own, beside torch.compile, in interleaved rounds."""
    off = _all_patched(("ios_ray.frontend.patterns.scalar_multiple", "ios_ray.frontend.patterns.residual_of"),
                       return_value=None)
    return _imports_on_and_off(
        "gate scalings with their factor and residual sum against as steps and an add unit",
        "scalings with a factor / a residual", off,
        lambda now, _: "{} / {}".format(*(sum(u.kind == "scale" and key in u.attrs for u in now.graph.units)
                                          for key in ("factor", "residual"))),
        models, batches, rounds, console)


def gates(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, attention gates imported as units (ECA's channel conv as a 1x1
    conv, products of two branches and spatial gates as scalings) against imported as before, beside torch.compile,
    in interleaved rounds."""
    passes = _all_patched(("ios_ray.frontend.channel_convs_as_pointwise", "ios_ray.frontend.broadcasts_without_expands"),
                          side_effect=lambda gm: gm)
    channel_gates_only = _all_patched(("ios_ray.frontend.patterns._gates",), side_effect=_channel_gate)

    @contextlib.contextmanager
    def off() -> Iterator[None]:
        with passes(), channel_gates_only():
            yield

    return _imports_on_and_off(
        "attention gates as units against as opaque units", "opaque units now / before", off,
        lambda now, before: "{} / {}".format(*(sum(u.kind == "opaque" for u in imported.graph.units)
                                                for imported in (now, before))),
        models, batches, rounds, console)


def _channel_gate(x: fx.Node, gate: fx.Node) -> bool:
    """What :func:`~ios_ray.frontend.patterns.match_scale` took for a gate before 2026-12-07: (C, 1, 1) only."""
    sizes = x.meta["tensor_meta"].shape[1:]
    return len(sizes) == 3 and tuple(gate.meta["tensor_meta"].shape[1:]) == (sizes[0], 1, 1) and sizes[1] * sizes[2] > 1


def concatenated_convs(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, concatenations of convs imported by the passes of
    :mod:`ios_ray.frontend.concats` (alike convs on equal channel slices as one grouped conv; a batch-norm and
    activation after the concatenation folded into each conv) against imported without them, beside torch.compile,
    in interleaved rounds."""
    off = _all_patched(("ios_ray.frontend.split_convs_as_grouped", "ios_ray.frontend.norms_into_concatenated_convs"),
                       side_effect=lambda gm: gm)
    return _imports_on_and_off(
        "concatenated convs as grouped convs and with their batch-norm against as imported before",
        "units now / before", off, _unit_counts, models, batches, rounds, console)


def parallel_branches(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, sums of parallel conv branches on one input imported as one conv
    (:func:`~ios_ray.frontend.branches.branches_as_one_conv`) against imported as a conv per branch and add units,
    beside torch.compile, in interleaved rounds."""
    off = _all_patched(("ios_ray.frontend.branches_as_one_conv",), side_effect=lambda gm: gm)
    return _imports_on_and_off(
        "parallel conv branches as one conv against a conv per branch and their sums", "units now / before", off,
        _unit_counts, models, batches, rounds, console)


def opaque_code(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with fused kernels, opaque units as deployed against run node by node with every input
    of a layout-free one as it comes (as before), beside torch.compile, in interleaved rounds."""
    table = _versus_table("opaque units as generated code, permuted views copied once, against node by node and "
                          "as they come", ["opaque units", "nodes in them"], "now", "before")
    passed = True
    for model in models:
        loaded = _loaded(model)
        imported = import_model(loaded)
        now = Programs(imported)("cpu", "fused")
        with mock.patch("ios_ray.runtime.units.CodeCall", _NodeByNode), \
                mock.patch("ios_ray.runtime.kernels.AsTheyCome", lambda body, layout, memory_format: body):
            before = Programs(imported)("cpu", "fused")
        opaque = [unit for unit in imported.graph.units if unit.kind == "opaque"]
        nodes = sum(len(unit.refs.get("nodes", (unit.id,))) for unit in opaque)
        passed &= _two_programs(table, loaded, {"now": now, "before": before}, [str(len(opaque)), str(nodes)],
                                batches, rounds, console)
    return table, passed


class _NodeByNode(CodeCall):
    """An opaque unit's code as ios-ray ran it before 2026-11-28: each fx node's arguments looked up and the node
    called, in turn."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.layers = {n.name: self.module.get_submodule(str(n.target)) for n in self.nodes if n.op == "call_module"}

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        env: dict[str, Any] = dict(zip(self.arg_names, inputs))
        batch = next(t.shape[0] for t in inputs if isinstance(t, torch.Tensor))
        env.update((name, torch.empty([s * batch if g else s for s, g in zip(sizes, grows)], device="meta"))
                   for name, (sizes, grows) in self.sized.items() if name not in env)

        def lookup(n: fx.Node) -> Any:
            return env[n.name] if n.name in env else self.constants[n.name]
        for node in self.nodes:
            args, kwargs = fx.node.map_arg(node.args, lookup), fx.node.map_arg(node.kwargs, lookup)
            if node.op == "call_module":
                env[node.name] = self.layers[node.name](*args, **kwargs)
            elif node.op == "call_method":
                env[node.name] = getattr(args[0], str(node.target))(*args[1:], **kwargs)
            else:
                env[node.name] = node.target(*args, **kwargs)  # type: ignore[operator]
        return env[self.nodes[-1].name]


def pass_code(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential and the greedy schedule with fused kernels, each pass as deployed against its stages run in a
    loop over names (as before), beside torch.compile, in interleaved rounds."""
    table = _versus_table("forward passes as straight-line code against a loop over stages and units by name",
                          ["schedule", "stages"], "now", "before")
    passed = True
    for model in models:
        loaded = _loaded(model)
        program = Programs(import_model(loaded))("cpu", "fused")
        for batch in batches:
            x = torch.randn(batch, *loaded.input_shape)
            for name in ("sequential", "greedy"):
                runner = ScheduleRunner(program, baseline_schedule(program.graph, name, device="cpu", batch=batch,
                                                                   kernels="fused"))
                timed = _Timed.of({"now": runner, "before": functools.partial(_stage_by_stage, runner)}, loaded.module,
                                  x, rounds, f"{model} bs{batch} {name}", console)
                ok = _not_slower(timed.ratio("now", "before")) and max(timed.errors["now"], timed.errors["before"]) <= 1e-5
                passed &= ok
                table.add_row(model, str(batch), name, str(len(runner.stages)), *timed.versus("now", "before", ok))
    return table, passed


@torch.no_grad()
def _stage_by_stage(runner: ScheduleRunner, x: torch.Tensor) -> torch.Tensor:
    """A runner's forward pass as ios-ray ran it before 2026-11-28: the stages in a loop, each on a dict of all
    outputs so far (a one-group stage's units each looked up in the graph, its inputs evaluated by name, in turn)."""
    program, passed = runner.program, runner._pass
    env = {GRAPH_INPUT: program.enter(x)}
    for stage, release in zip(passed.stages, passed.releases):
        if isinstance(stage, InlineStage):
            scope = {source: env[source] for source in stage.inputs}
            for unit_id in stage.stage.units:
                scope[unit_id] = program.run_unit(unit_id, scope)
            env.update((unit_id, scope[unit_id]) for unit_id in stage.stage.units)
        else:
            env.update(stage(env))
        for source in release:
            del env[source]
    return program.leave(program.value(program.graph.output, env))


def _unit_counts(now: Imported, before: Imported) -> str:
    """The units of two imports of one model, ``now / before``."""
    return f"{len(now.graph.units)} / {len(before.graph.units)}"


def _pass_on_and_off(name: str, kind: str, title: str, count: str, models: list[str], batches: list[int],
                     rounds: int, console: Console) -> tuple[Table, bool]:
    """Each model imported as now against imported without the import pass ``name`` (of :mod:`ios_ray.frontend`),
    the units of ``kind`` it adds counted."""
    return _imports_on_and_off(
        title, count, _all_patched((f"ios_ray.frontend.{name}",), side_effect=lambda gm: gm),
        lambda now, before: sum(u.kind == kind for u in now.graph.units) - sum(u.kind == kind for u in
                                                                                before.graph.units),
        models, batches, rounds, console)


def _all_patched(targets: tuple[str, ...], **how: object) -> Callable[[], ContextManager[object]]:
    """What patches each of ``targets`` as ``mock.patch(target, **how)`` does, all together, for a with block."""
    def patched() -> ContextManager[object]:
        stack = contextlib.ExitStack()
        for target in targets:
            stack.enter_context(mock.patch(target, **how))  # type: ignore[call-overload]
        return stack
    return patched


def _imports_on_and_off(title: str, count: str, off: Callable[[], ContextManager[object]],
                        counted: Callable[[Imported, Imported], object], models: list[str], batches: list[int],
                        rounds: int, console: Console, names: tuple[str, str] = ("now", "before")
                        ) -> tuple[Table, bool]:
    """Each model imported as now against imported with ``off()`` patched in (a rule or pass of the import off), both
    bound with fused kernels, in a :func:`_versus_table` titled ``title`` whose ``count`` column holds
    ``counted(now, before)``."""
    table = _versus_table(title, [count], *names)
    passed = True
    for model in models:
        loaded = _loaded(model)
        now = import_model(loaded)
        with off():
            before = import_model(loaded)
        programs = {name: Programs(imported)("cpu", "fused") for name, imported in zip(names, (now, before))}
        passed &= _two_programs(table, loaded, programs, [str(counted(now, before))], batches, rounds, console)
    return table, passed


def versus_compile(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential schedule with eager and with fused kernels beside torch.compile and the model as is, in
    interleaved rounds: where a library model still runs slower with ios-ray than with the tool users have."""
    confidence = percent(REPORT_CONFIDENCE)
    table = Table("model", "batch", f"{AS_IS} ms", "eager kernels ms", "fused kernels ms", "torch.compile ms",
                  f"fused / torch.compile ({confidence})", f"fused / {AS_IS} ({confidence})", "target",
                  title="the sequential schedule against torch.compile and the model as is (CPU, interleaved rounds)")
    passed = True
    for model in models:
        loaded = _loaded(model)
        imported = import_model(loaded)
        programs = {kernels: Programs(imported)("cpu", kernels) for kernels in ("eager", "fused")}
        for batch in batches:
            x = torch.randn(batch, *loaded.input_shape)
            calls = {kernels: ScheduleRunner(program, baseline_schedule(imported.graph, device="cpu", batch=batch,
                                                                        kernels=kernels))
                     for kernels, program in programs.items()}
            timed = _Timed.of(calls, loaded.module.eval(), x, rounds, f"{model} bs{batch}", console)
            ok = _not_slower(timed.ratio("fused", "torch.compile")) and timed.errors["fused"] <= 1e-5
            passed &= ok
            table.add_row(model, str(batch), *timed.cells(AS_IS, "eager", "fused", "torch.compile"),
                          _cell(timed.ratio("fused", "torch.compile")), _cell(timed.ratio("fused", AS_IS)),
                          "PASS" if ok else "FAIL")
    return table, passed


def regions(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential and the greedy schedule with fused and with inductor kernels (regions compiled first) beside
    torch.compile and the model as is, in interleaved rounds."""
    confidence = percent(REPORT_CONFIDENCE)
    table = Table("model", "batch", "schedule", "compile s", "fused ms", "inductor ms", "torch.compile ms",
                  f"inductor / fused ({confidence})", f"best / torch.compile ({confidence})", "error / limit", "target",
                  title="Inductor regions against fused kernels and torch.compile (CPU, interleaved rounds)")
    passed = True
    for model in models:
        loaded = _loaded(model)
        imported = import_model(loaded)
        cache = Programs(imported)
        programs = {kernels: cache("cpu", kernels) for kernels in ("fused", "inductor")}
        for batch in batches:
            baselines = _Baselines.of(loaded, imported, programs, batch, rounds, f"{model} bs{batch}", console)
            timed, limit = baselines.timed, baselines.limit
            for name in ("sequential", "greedy"):
                fused, inductor = f"{name} fused", f"{name} inductor"
                best = min((fused, inductor), key=lambda n: summary_ms(timed.samples[n])[0])
                error = max(timed.errors[fused], timed.errors[inductor])
                errors_ok = error <= limit
                ok = errors_ok and (name != "sequential" or _not_slower(timed.ratio(best, "torch.compile")))
                passed &= ok
                table.add_row(model, str(batch), name, f"{baselines.first_call_s[inductor]:.1f}",
                              *timed.cells(fused, inductor, "torch.compile"), _cell(timed.ratio(inductor, fused)),
                              f"{best.split()[1]}: {_cell(timed.ratio(best, 'torch.compile'))}",
                              f"{error:.1e} / {limit:.1e}", "PASS" if ok else "FAIL")
    return table, passed


def inductor_layout(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential and the greedy schedule with inductor kernels, activations held channels-last (as deployed)
    against held in the graph's format (as before 2026-11-28, inductor kernels' version 1), regions compiled first,
    beside torch.compile, in interleaved rounds."""
    confidence = percent(REPORT_CONFIDENCE)
    table = Table("model", "batch", "schedule", "channels-last ms", "graph's format ms", "torch.compile ms",
                  f"channels-last / graph's format ({confidence})", "error / limit", "target",
                  title="Inductor regions on activations held channels-last against in the graph's format (CPU, "
                        "interleaved rounds)")
    passed = True
    for model in models:
        loaded = _loaded(model)
        imported = import_model(loaded)
        held = {"channels-last": Program.from_imported(imported, "cpu", "inductor")}
        with mock.patch("ios_ray.runtime.program.activation_layout", lambda kernels, graph_format: graph_format):
            held["graph's format"] = Program.from_imported(imported, "cpu", "inductor")
        for batch in batches:
            baselines = _Baselines.of(loaded, imported, held, batch, rounds, f"{model} bs{batch}", console)
            timed, limit = baselines.timed, baselines.limit
            for name in ("sequential", "greedy"):
                now, before = f"{name} channels-last", f"{name} graph's format"
                error = max(timed.errors[now], timed.errors[before])
                ok = error <= limit and _not_slower(timed.ratio(now, before))
                passed &= ok
                table.add_row(model, str(batch), name, *timed.cells(now, before, "torch.compile"),
                              _cell(timed.ratio(now, before)), f"{error:.1e} / {limit:.1e}", "PASS" if ok else "FAIL")
    return table, passed


def inductor_lone_units(models: list[str], batches: list[int], rounds: int, console: Console) -> tuple[Table, bool]:
    """The sequential and the greedy schedule with inductor kernels, what runs outside a region bound as fused kernels
    bind it (as deployed) against as torch's own ops (as before 2026-12-07, inductor kernels' version 2), regions
    compiled first, beside fused kernels and torch.compile, in interleaved rounds."""
    confidence = percent(REPORT_CONFIDENCE)
    table = Table("model", "batch", "schedule", "lone units", "now ms", "before ms", "fused ms", "torch.compile ms",
                  f"now / before ({confidence})", f"now / fused ({confidence})", "error / limit", "target",
                  title="Inductor kernels: units outside a region fused (now) against torch's own ops (before) (CPU, "
                        "interleaved rounds)")
    passed = True
    for model in models:
        loaded = _loaded(model)
        imported = import_model(loaded)
        held = {"now": Program.from_imported(imported, "cpu", "inductor")}
        with mock.patch("ios_ray.runtime.program.conv_binder", lambda kernels, device: eager_conv), \
                mock.patch("ios_ray.runtime.program.linear_binder", lambda kernels, device: eager_linear):
            held["before"] = Program.from_imported(imported, "cpu", "inductor")
        held["fused"] = Program.from_imported(imported, "cpu", "fused")
        for batch in batches:
            baselines = _Baselines.of(loaded, imported, held, batch, rounds, f"{model} bs{batch}", console)
            calls, timed, limit = baselines.calls, baselines.timed, baselines.limit
            for name in ("sequential", "greedy"):
                now, before = f"{name} now", f"{name} before"
                lone = _lone_units(calls[now])
                error = max(timed.errors[now], timed.errors[before])
                ok = error <= limit and _not_slower(timed.ratio(now, before))
                passed &= ok
                table.add_row(model, str(batch), name, str(lone),
                              *timed.cells(now, before, f"{name} fused", "torch.compile"),
                              _cell(timed.ratio(now, before)), _cell(timed.ratio(now, f"{name} fused")),
                              f"{error:.1e} / {limit:.1e}", "PASS" if ok else "FAIL")
    return table, passed


@dataclass(frozen=True)
class _Baselines:
    """The sequential and the greedy schedule of each of some programs, timed: their runners (named "{schedule}
    {program}"), the seconds of each one's first call (where its regions compile), the rounds, and the float32 error
    limit of the model's output."""

    calls: dict[str, ScheduleRunner]
    first_call_s: dict[str, float]
    timed: "_Timed"
    limit: float

    @staticmethod
    def of(loaded: Model, imported: Imported, programs: Mapping[str, Program], batch: int, rounds: int, label: str,
           console: Console) -> "_Baselines":
        """Each program's two schedules, regions compiled first, timed in interleaved rounds beside the model and
        torch.compile."""
        x = torch.randn(batch, *loaded.input_shape)
        calls = {f"{name} {version}": ScheduleRunner(program, baseline_schedule(
            imported.graph, name, device="cpu", batch=batch, kernels=program.kernels))
            for name in ("sequential", "greedy") for version, program in programs.items()}
        first_call_s = {}
        for call, runner in calls.items():
            started = time.perf_counter()
            runner(x)  # regions compile at their first call
            first_call_s[call] = time.perf_counter() - started
        timed = _Timed.of(calls, loaded.module.eval(), x, rounds, label, console)
        with torch.inference_mode():
            limit = model_tolerance(loaded.module, x, output_tensor(loaded.module(x)), FLOAT32_TOLERANCE).limit
        return _Baselines(calls, first_call_s, timed, limit)


def _lone_units(runner: ScheduleRunner) -> int:
    """The units a pass with inductor kernels runs outside its regions: runs of one unit, and groups of one unit of
    its stages of several groups."""
    lone = 0
    for units, _, code in runner._pass.steps:
        stage = getattr(code, "__self__", None)
        if isinstance(stage, ParallelStage):
            lone += sum(not isinstance(group.code, Region) for group in stage.groups)
        elif not isinstance(code, Region):
            lone += len(units)
    return lone


def _two_programs(table: Table, loaded: Model, programs: dict[str, Program], counts: list[str], batches: list[int],
                  rounds: int, console: Console) -> bool:
    """Add a row per batch size to ``table`` (``counts`` in its count columns): the sequential schedule of the first
    program against the second's, beside torch.compile; whether every row met its target (never slower beyond noise,
    outputs within 1e-5 of the model)."""
    (first, _), (second, _) = programs.items()
    passed = True
    for batch in batches:
        x = torch.randn(batch, *loaded.input_shape)
        calls = {name: ScheduleRunner(program, baseline_schedule(program.graph, device="cpu", batch=batch,
                                                                 kernels="fused"))
                 for name, program in programs.items()}
        timed = _Timed.of(calls, loaded.module.eval(), x, rounds, f"{loaded.name} bs{batch}", console)
        ok = _not_slower(timed.ratio(first, second)) and max(timed.errors[first], timed.errors[second]) <= 1e-5
        passed &= ok
        table.add_row(loaded.spec or loaded.name, str(batch), *counts, *timed.versus(first, second, ok))
    return passed


def bench_command(rounds: int, folder: Path, console: Console) -> tuple[Table, bool]:
    """``ios-ray search`` and ``ios-ray bench`` on SqueezeNet at batch 1, as a user runs them."""
    store, out = folder / "cli-latency.duckdb", folder / "cli-schedules"
    common = ["--model", "squeezenet", "--batches", "1", "--store", str(store)]
    _ios_ray("search", *common, "--devices", "cpu", "--out", str(out))
    found = json.loads(_ios_ray("bench", *common, "--device", "cpu", "--schedules", str(out), "--rounds", str(rounds),
                                "--json"))
    rows = {row["name"]: row for row in found["rows"]}
    ios = next(name for name in rows if name.startswith("IOS"))
    ratio = rows[ios]["median_ms"] / rows["torch.compile"]["median_ms"]
    ok = ratio <= COMPILE_MARGIN
    table = Table("variant", "median ms", "p10 ms", "p90 ms", "vs eager (95%)", title="ios-ray bench --model "
                  f"squeezenet --batches 1 (CPU): {ios} / torch.compile medians {ratio:.3f}, target <= "
                  f"{COMPILE_MARGIN}: {'PASS' if ok else 'FAIL'}")
    for name, row in rows.items():
        span = ("" if row["speedup_low"] is None else f" ({row['speedup_low']:.2f}-{row['speedup_high']:.2f})")
        table.add_row(name, f"{row['median_ms']:.2f}", f"{row['p10_ms']:.2f}", f"{row['p90_ms']:.2f}",
                      f"{row['speedup']:.2f}x{span}")
    for note in found["notes"]:
        console.print(note)
    return table, ok


def _search(model: str, batch: int, kernels: str, folder: Path, console: Console) -> Schedule:
    """The schedule a search with ``kernels`` keeps, on a store of its own."""
    result = ios_ray.search(model, ["cpu"], [batch], store=folder / f"{model}-{kernels}.duckdb", kernels=kernels,
                            progress=False)
    outcome = result["cpu", batch]
    console.print(f"{model} bs{batch} {kernels}: {outcome.measured} stages measured in {outcome.wall_s:.0f} s; "
                  f"{outcome.end_to_end.decision if outcome.end_to_end else 'no check'}")
    return outcome.schedule


#: The model itself, eager, timed beside the variants of the on-demand parts.
AS_IS = "model as is"


@dataclass(frozen=True)
class _Timed:
    """Callables timed on one input beside torch.compile (default mode) of the model and the model as is, in
    interleaved rounds: each one's samples in ms and its output's relative error against the model's."""

    samples: dict[str, list[float]]
    errors: dict[str, float]

    @staticmethod
    def of(calls: Mapping[str, Callable[[torch.Tensor], object]], module: torch.nn.Module, x: torch.Tensor, rounds: int,
           label: str, console: Console) -> "_Timed":
        """Time ``calls`` and ``torch.compile(module)`` on ``x`` (a compiler failure is said under ``label``)."""
        compiled, notes = compiled_variants(module, x, ("default",))
        calls = {**calls, **{variant.name: variant.forward for variant in compiled}, AS_IS: module}
        for note in notes:
            console.print(f"{label}: {note}")
        with torch.inference_mode():
            expected = module(x)
            errors = {name: relative_error(call(x), expected) for name, call in calls.items()}  # type: ignore[arg-type]
        samples = interleaved_samples_ms({n: (lambda c=c: c(x)) for n, c in calls.items()}, "cpu", 3, rounds)
        return _Timed(samples, errors)

    def ratio(self, first: str, second: str) -> RatioInterval | None:
        """The median of the per-round ratios first / second and its interval (None where one did not run)."""
        if first not in self.samples or second not in self.samples:
            return None
        return median_interval(ratios_of(self.samples[first], self.samples[second]))

    def versus(self, first: str, second: str, ok: bool) -> list[str]:
        """The cells of a :func:`_versus_table` row after its counts: both medians, torch.compile's and the model's as
        is, the two ratios and the verdict."""
        return [*self.cells(first, second, "torch.compile", AS_IS), _cell(self.ratio(first, second)),
                _cell(self.ratio(first, "torch.compile")), "PASS" if ok else "FAIL"]

    def cells(self, *names: str) -> list[str]:
        """The median ms of each named callable, '-' for one that did not run."""
        return [f"{summary_ms(self.samples[n])[0]:.2f}" if n in self.samples else "-" for n in names]


def _versus_table(title: str, counts: list[str], first: str, second: str) -> Table:
    """A table of one variant against another and both beside torch.compile, per model and batch (the columns
    :meth:`_Timed.versus` fills after ``counts``)."""
    confidence = percent(REPORT_CONFIDENCE)
    return Table("model", "batch", *counts, f"{first} ms", f"{second} ms", "torch.compile ms", f"{AS_IS} ms",
                 f"{first} / {second} ({confidence})", f"{first} / torch.compile ({confidence})", "target",
                 title=f"{title} (CPU, sequential schedule, fused kernels, interleaved rounds)")


def _loaded(model: str) -> Model:
    """A model spec built as a search builds it, with random batch-norm statistics and no parameter left at zeros
    (:func:`~bench.model_libraries.randomised`), so that the errors the tables check could fail."""
    loaded = load_model(model)
    randomised(loaded.module)
    return loaded


def _not_slower(interval: RatioInterval | None) -> bool:
    """Whether a ratio's interval reaches 1 or below: not slower beyond noise (False where it has none)."""
    return interval is not None and interval.low is not None and interval.low <= 1


def _cell(interval: object) -> str:
    """A ratio and its interval, or '-'."""
    if interval is None:
        return "-"
    return f"{interval.median:.3f} ({interval.span})"  # type: ignore[attr-defined]


def _ios_ray(*args: str) -> str:
    """Run one ios-ray command in a fresh process; its stdout, or RuntimeError with its output."""
    done = subprocess.run([sys.executable, "-m", "ios_ray", *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"ios-ray {args[0]} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


#: The parts run only when named, each ``(models, batches, rounds, console) -> (table, passed)``.
ON_DEMAND = {"packing": packing, "residual": residual, "linear-and-opaque": linear_and_opaque,
             "moved-linears": moved_linears, "five-dims": five_dims, "path-sums": path_sums, "scales": scales,
             "concatenated-convs": concatenated_convs, "gate-scalings": gate_scalings, "gates": gates,
             "parallel-branches": parallel_branches, "opaque-code": opaque_code, "pass-code": pass_code,
             "versus-compile": versus_compile, "regions": regions, "inductor-layout": inductor_layout,
             "inductor-lone-units": inductor_lone_units}


def main() -> int:
    """Run the parts; exit status 0 when every target of what ran is met."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="inception_v3,squeezenet")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--part", choices=("side-by-side", "ios-ray-bench", *ON_DEMAND))
    parser.add_argument("--folder", type=Path, help="the stores' folder, kept: a run again on it measures only what "
                        "its stores lack (default: a new temporary one)")
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="ios-ray-kernels-"))
    folder.mkdir(parents=True, exist_ok=True)
    models, batches = args.models.split(","), [int(b) for b in args.batches.split(",")]
    parts = {
        "side-by-side": lambda console: side_by_side(models, batches, args.rounds, folder, console),
        "ios-ray-bench": lambda console: bench_command(args.rounds, folder, console),
    }
    if args.part in ON_DEMAND:  # and on library models too
        _define_torchvision_schemas()
        parts = {args.part: lambda console: ON_DEMAND[args.part](models, batches, args.rounds, console)}
    return run_parts(parts, args.part, width=200)


if __name__ == "__main__":
    sys.exit(main())
