"""ScheduledModule: an ``nn.Module`` that runs a model with the IOS schedule fitting each input's device, dtype and
batch size.

It imports the wrapped module once (``ios_ray.frontend.import_module`` on a batch-1 random input of
``input_shape``, by default the one the schedule files record, on the module's device and in its dtype; the graph
records the module's memory format, so only schedules made for that format fit), checks every schedule against the
imported graph, and in ``forward`` picks a schedule by the rules of
:mod:`~ios_ray.runtime.schedule_set`. The chosen schedule runs through a
:class:`~ios_ray.runtime.executor.ScheduleRunner` with the kernels the schedule records
(:mod:`~ios_ray.runtime.kernels`), built on first use per (schedule, device), and its output goes
back into the structure the module returns (:class:`~ios_ray.frontend.OutputStructure`); where no schedule
fits (another device, another per-sample shape) the original module runs eagerly, with a one-time warning per
reason; with ``any_device=True`` a schedule made for another device runs instead (a ``sim:`` plan on the CPU, say),
with a one-time warning that this is a correctness check, its speed here saying nothing of that device. An input of
a dtype no schedule was made for runs a schedule made for another, with a one-time warning.
Schedules are for inference, and run without autograd: the original module runs where this module is in training
mode (silently: it was asked to), where the wrapped module or one of its submodules is (wrapping leaves its mode as
the caller set it; a one-time warning), and where gradients are enabled and the parameters or the input require them
(a one-time warning), so that the output has the history a loss needs, and under ``torch.autocast`` (a one-time
warning: a schedule runs the dtype it was made for, not autocast's mix of dtypes), and for a call given more than the
input (a one-time warning: a schedule computes ``forward`` of the input alone). Schedules given as a list must all
fit the graph; from a folder (such as the ``--out`` folder of ``ios-ray search``, which may hold other models too)
those made for other graphs are left out, and finding none is an error.

Runners snapshot the module (batch-norm folded, numbers its forward reads baked in) when they are built, and the
import evaluates some weights once (a convolution's weight computed from parameters, as in timm's
weight-standardised convs). So each call asks a :class:`~ios_ray.runtime.weights.WeightWatch` whether the wrapped
module changed (weights changed in place, loaded, stepped by an optimizer or replaced; settings and hooks; a
conversion: the list is ``docs/REFERENCE.md``'s, "Deploying"); the next forward then imports the module as it is and
keeps the schedules made for it (converted to another memory format, those made for that format, where any were
given; else it runs the original module, with a one-time warning). ``follow_weights=False`` skips the per-call
check, for a server whose model never changes; after changes the watch cannot see, or with the check off, call
:meth:`ScheduledModule.reset`. A copy or a pickle leaves the import and the runners behind and makes its own.

Saving: :meth:`ScheduledModule.save` writes a folder with the module's ``state_dict`` (``module.pt``), every
schedule (``schedules/<i>.json``) and the input shape (``scheduled_module.json``); :meth:`ScheduledModule.load`
rebuilds it around a fresh instance of the same architecture. ``state_dict()`` works as for any module (the
wrapped module's entries under ``module.``), for those who keep schedules and weights apart.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ios_ray.devices import parse_device
from ios_ray.dtypes import autocast_dtype, example_input
from ios_ray.errors import UserError, first_line
from ios_ray.frontend import Imported, import_module
from ios_ray.ir import Graph
from ios_ray.runtime.executor import ScheduleRunner
from ios_ray.runtime.program import Programs
from ios_ray.runtime.schedule_set import device_rank, read_schedules, select_schedule, why_none_fit
from ios_ray.runtime.stages import resolve_device
from ios_ray.runtime.weights import WeightWatch
from ios_ray.schedule import Schedule, check_schedule, save_schedule
from ios_ray.vocabulary import spelt_shape

SAVE_FORMAT = "ios-ray-scheduled-module"
SAVE_VERSION = 1


class ScheduledModule(nn.Module):
    """``module`` run with the schedule that fits each input (eagerly where none does)."""

    def __init__(
        self, module: nn.Module, schedules: Sequence[Schedule] | str | Path,
        input_shape: Sequence[int] | None = None, cuda_graph: bool | None = None, follow_weights: bool = True,
        any_device: bool = False,
    ) -> None:
        super().__init__()
        self.module = module
        self.any_device = any_device
        self._watch = WeightWatch(module) if follow_weights else None
        self._folder = schedules if isinstance(schedules, (str, Path)) else None
        self._given = _gather(schedules)
        self.cuda_graph = cuda_graph
        self._runners: dict[tuple[int, torch.device], ScheduleRunner] = {}
        self._warned: set[str] = set()
        self._chosen: dict[tuple[torch.device, int, torch.dtype], Schedule | None] = {}
        shapes = [tuple(input_shape)] if input_shape is not None else _recorded_shapes(self._given.values())
        self._binding: _Binding | None
        self.input_shape, self._binding = self._first_binding(shapes)
        self.training = False  # the wrapper runs schedules; the module's own mode is left as the caller set it

    @property
    def graph(self) -> Graph:
        """The graph the module is imported into as it is now (the one every schedule is checked against)."""
        return self._bound().imported.graph

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The given schedules made for the module as it is now (its graph and memory format)."""
        return self._bound().schedules

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Run the schedule chosen for ``x``'s device, dtype and batch size, or the original module where none
        fits; the output comes in the module's own structure (a tensor, or a dict, tuple or list holding one or
        several). A call given more than the input (a second input, an option of ``forward``) runs the original
        module with them: the schedules compute ``forward`` of the input alone, its options at their defaults."""
        if args or kwargs:
            given = ", ".join([*(f"argument {i + 2}" for i in range(len(args))), *(f"{k}=" for k in kwargs)])
            self._warn_once(f"ScheduledModule was called with more than the input ({given}), so it runs "
                            f"{type(self.module).__name__} as it is with them (its schedules compute forward of the "
                            "input alone, with its options at their defaults); call it with the input alone to run "
                            "its schedules.")
            return self.module(x, *args, **kwargs)
        if self.training:
            return self.module(x)
        if self._watch is not None and self._watch.changed():
            self.reset()
        eager = self._eager_reason(x)
        if eager is not None:
            self._warn_once(eager)
            return self.module(x)
        schedule = self.schedule_for(x)
        if schedule is None:
            return self.module(x)
        return self._bound().imported.output.pack(self._runner(schedule, x.device)(x))

    def _eager_reason(self, x: torch.Tensor) -> str | None:
        """Why ``x`` must run the original module although this one is in eval mode (None where it need not): the
        module, or one of its submodules, is in training mode, autograd needs the call's history (a schedule runs
        without it, so its output would have none and a loss computed from it would train nothing), or
        ``torch.autocast`` is on for ``x``'s device (a schedule would run its own dtype, not autocast's mix)."""
        binding = self._bound()  # (re)arms the watch, which keeps the modes
        name = type(self.module).__name__
        if self._watch.training if self._watch is not None else self.module.training:
            return (f"{name} (or one of its submodules) is in training mode, so ScheduledModule runs it as it is "
                    "(schedules are for inference); call .eval() on it to run its schedules.")
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in binding.parameters)):
            what = "the input" if x.requires_grad else f"{name}'s parameters"
            return (f"gradients are enabled and {what} require them, so ScheduledModule runs the original module, "
                    "whose output then has the history autograd needs (schedules run without autograd); call it "
                    "under torch.no_grad() or torch.inference_mode() to run its schedules.")
        dtype = autocast_dtype(x.device.type)
        if dtype is not None:
            return (f"torch.autocast ({dtype}) is on, so ScheduledModule runs {name} as it is, in the mixed "
                    "precision autocast gives it (a schedule runs the one dtype it was made for); search the model "
                    f"in {dtype} (`model.to(torch.{dtype})`, `--dtype {dtype}`) and call it without autocast to run "
                    "its schedules.")
        return None

    def schedule_for(self, x: torch.Tensor) -> Schedule | None:
        """The schedule ``forward`` runs for ``x``, or None (warning once per reason) where none fits; chosen once per
        (device, batch size, dtype), so that a served model pays a dictionary lookup per call."""
        if tuple(x.shape[1:]) != self.input_shape:
            self._warn_once(f"no schedule for inputs of shape {tuple(x.shape[1:])} (the schedules are for "
                            f"{self.input_shape}); running the original module.")
            return None
        setting = (x.device, x.shape[0], x.dtype)
        if setting not in self._chosen:
            self._chosen[setting] = self._choose(x)
        return self._chosen[setting]

    def _choose(self, x: torch.Tensor) -> Schedule | None:
        """The schedule for ``x``'s device, batch size and dtype by the rules of :mod:`~ios_ray.runtime.schedule_set`,
        or None, warning once per reason."""
        if not self.schedules:
            self._warn_once(f"no schedule given was made for this model as it is now (in {self.graph.memory_format} "
                            "memory format); running the original module (search it as it is, or convert it back).")
            return None
        gpu_name = torch.cuda.get_device_name(x.device) if x.device.type == "cuda" else None
        dtype = str(x.dtype).removeprefix("torch.")
        schedule = select_schedule(self.schedules, x.device.type, x.shape[0], gpu_name, dtype, self.any_device)
        if schedule is None:
            labels = sorted({s.device for s in self.schedules})
            self._warn_once(f"no schedule fits device {x.device.type} (schedules are for {', '.join(labels)}); "
                            "running the original module (any_device=True runs one anyway, to check that it "
                            "computes the model).")
        elif device_rank(schedule.device, x.device.type, gpu_name) is None:
            self._warn_once(f"running the schedule made for {schedule.device} on {x.device.type}, as a correctness "
                            f"check: its speed here says nothing of {schedule.device}.")
        if schedule is not None and schedule.dtype != dtype:
            self._warn_once(f"no schedule for {dtype} inputs on {schedule.device}; running the one made for "
                            f"{schedule.dtype} (search with dtype={dtype!r} for a schedule tuned to it).")
        return schedule

    def reset(self) -> None:
        """Drop the import and the compiled runners, so the next forward rebuilds them from the module as it is."""
        self._binding = None
        self._chosen.clear()
        self._runners.clear()

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Load weights as ``nn.Module.load_state_dict`` does, from this module's state dict (the wrapped module's
        entries under ``module.``) or the wrapped module's own (``model.state_dict()``), then drop the runners built
        from the old ones."""
        if _wrapped_module_keys(state_dict, self.module):
            result = self.module.load_state_dict(state_dict, strict=strict, assign=assign)
        else:
            result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.reset()
        return result

    def __getstate__(self) -> dict[str, Any]:
        """What a copy or a pickle keeps: the module, the schedules and the options; the import and the runners (with
        their threads and locks) are made again on the copy's first call."""
        state = super().__getstate__()
        state.update(_binding=None, _runners={}, _chosen={})
        return state

    def _apply(self, fn: Any, recurse: bool = True) -> "ScheduledModule":
        self.reset()
        return super()._apply(fn, recurse)

    def save(self, path: str | Path) -> None:
        """Write the module's weights, the schedules and the input shape into the folder ``path``; UserError where
        that folder cannot be made or written."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise UserError(f"cannot save the scheduled module into {path}: a file is there; pass a folder.")
        try:
            path.mkdir(parents=True, exist_ok=True)
            torch.save(self.module.state_dict(), path / "module.pt")
            files = [path / "schedules" / f"{index}.json" for index in range(len(self.schedules))]
            for stale in set((path / "schedules").glob("*.json")) - set(files):
                stale.unlink()
            for schedule, file in zip(self.schedules, files):
                save_schedule(schedule, file)
            meta = {"format": SAVE_FORMAT, "version": SAVE_VERSION, "input_shape": list(self.input_shape)}
            (path / "scheduled_module.json").write_text(json.dumps(meta, indent=1))
        except OSError as exc:
            raise UserError(f"cannot save the scheduled module into the folder {path} ({exc.strerror or exc}); pass "
                            "a folder that can be made and written.") from None

    @classmethod
    def load(
        cls, path: str | Path, module: nn.Module, cuda_graph: bool | None = None, follow_weights: bool = True,
        any_device: bool = False,
    ) -> "ScheduledModule":
        """Rebuild a saved ScheduledModule around ``module``, a fresh instance of the saved architecture, which it
        loads the saved weights into and puts in eval mode (what was saved serves inference)."""
        path = Path(path)
        meta = _read_meta(path)
        try:
            module.load_state_dict(torch.load(path / "module.pt", map_location="cpu", weights_only=True))
        except (OSError, RuntimeError) as exc:
            raise UserError(f"cannot load the weights in {path / 'module.pt'} into {type(module).__name__}: "
                            f"{first_line(exc)}; pass a module of the saved architecture.") from None
        return cls(module.eval(), path / "schedules", tuple(meta["input_shape"]), cuda_graph, follow_weights,
                   any_device)

    def _runner(self, schedule: Schedule, device: torch.device) -> ScheduleRunner:
        device = resolve_device(device)
        key = (id(schedule), device)
        runner = self._runners.get(key)
        if runner is None:
            program = self._bound().programs(device, schedule.kernels)
            runner = self._runners[key] = ScheduleRunner(program, schedule, device, self.cuda_graph)
        return runner

    def _bound(self) -> "_Binding":
        """The module's import and schedules, made afresh after a reset."""
        if self._binding is None:
            self._binding = self._bind(strict=False)
        return self._binding

    def _first_binding(self, shapes: Sequence[tuple[int, ...]]) -> tuple[tuple[int, ...], "_Binding"]:
        """The first per-sample input shape at which some given schedule is made for the module, and its binding (a
        folder may hold the schedules of several models, each at its own input shape); UserError where none is."""
        for shape in shapes[:-1]:
            self.input_shape = shape
            try:
                return shape, self._bind(strict=True)
            except UserError:
                continue  # made for another model: try the next shape
        self.input_shape = shapes[-1]
        try:
            return shapes[-1], self._bind(strict=True)
        except UserError as error:
            if len(shapes) == 1:
                raise
            where = self._folder if self._folder is not None else "the schedules given"
            raise UserError(f"no schedule under {where} was made for this {type(self.module).__name__} at any input "
                            f"shape they record ({', '.join(spelt_shape(s) for s in shapes)}); run ios-ray "
                            "search for this model, or pass its input_shape=(C, H, W).") from error

    def _bind(self, strict: bool) -> "_Binding":
        """Import the module as it is now and keep the given schedules made for its graph: all of a list
        (``strict``: at construction) or at least one from a folder, else UserError; after a conversion, any."""
        imported = import_module(self.module, example_input(self.module, self.input_shape), type(self.module).__name__)
        given = self._given if strict else _made_for(self._given, imported.graph)
        binding = _Binding(imported, _checked(given, imported.graph, self._folder if strict else None),
                           Programs(imported), tuple(self.module.parameters()))
        if self._watch is not None:
            self._watch.arm()
        return binding

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, stacklevel=3)


@dataclass(frozen=True)
class _Binding:
    """The module imported as it is, with the schedules that fit its graph and the programs bound from it."""

    imported: Imported
    schedules: tuple[Schedule, ...]
    programs: Programs
    parameters: tuple[torch.Tensor, ...]


def _wrapped_module_keys(state_dict: Mapping[str, Any], module: nn.Module) -> bool:
    """Whether a state dict is the wrapped module's own rather than a ScheduledModule's (whose keys all start with
    ``module.`` and are not all keys of the wrapped module itself)."""
    keys = set(state_dict)
    return not all(key.startswith("module.") for key in keys) or keys <= set(module.state_dict())


def _gather(schedules: Sequence[Schedule] | str | Path) -> dict[str, Schedule]:
    """The given schedules by a name for messages: their file, or their place in the list."""
    if isinstance(schedules, (str, Path)):
        return read_schedules(schedules)
    found = {f"schedule {i} ({s.model}, {s.device}, batch {s.batch})": s for i, s in enumerate(schedules)}
    if not found:
        raise UserError("ScheduledModule needs at least one schedule; make them with ios-ray search.")
    return found


def _recorded_shapes(schedules: Any) -> list[tuple[int, ...]]:
    """The per-sample input shapes the schedules record (one per model, for a folder of several); UserError where a
    schedule records none (a file written before schedules recorded it)."""
    shapes = {s.input_shape for s in schedules}
    if None in shapes:
        raise UserError("pass input_shape=(C, H, W): some of the schedules were written before schedule files "
                        "recorded their input shape.")
    return sorted(tuple(shape) for shape in shapes)


def _made_for(found: dict[str, Schedule], graph: Graph) -> dict[str, Schedule]:
    """The schedules whose graph fingerprint is the graph's."""
    return {where: s for where, s in found.items() if s.graph_fingerprint == graph.fingerprint}


def _checked(found: dict[str, Schedule], graph: Graph, folder: str | Path | None) -> tuple[Schedule, ...]:
    """The schedules checked against the graph; from a folder, those made for other graphs are left out."""
    if folder is not None:
        fitting = _made_for(found, graph)
        if not fitting:
            raise UserError(f"no schedule under {folder} was made for this {graph.name} (graph fingerprint "
                            f"{graph.fingerprint}){why_none_fit(found.values(), graph)}; run ios-ray search for "
                            "this model.")
        found = fitting
    for where, schedule in found.items():
        check_schedule(schedule, graph, where)
        parse_device(schedule.device)
    return tuple(found.values())


def _read_meta(path: Path) -> dict[str, Any]:
    """The saved ScheduledModule's metadata; UserError where the folder is not one."""
    meta_file = path / "scheduled_module.json"
    try:
        meta = json.loads(meta_file.read_text())
        if meta["format"] != SAVE_FORMAT or meta["version"] != SAVE_VERSION:
            raise ValueError(f"format {meta['format']!r} version {meta['version']}")
        return meta
    except FileNotFoundError:
        raise UserError(f"{path} is not a saved ScheduledModule (no {meta_file.name}); "
                        "write one with ScheduledModule.save.") from None
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise UserError(f"{meta_file} is not valid ScheduledModule metadata ({first_line(exc)}); save the module "
                        "again.") from None
