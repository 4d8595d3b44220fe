"""The Python API: ``ios_ray.search(model, ...)`` finds schedules, ``ios_ray.optimize(model, x)`` hands back a module.

::

    import ios_ray

    result = ios_ray.search(model, devices=["cpu"], batches=[1, 8])   # an nn.Module object, or a spec string
    print(result)                                                     # per (device, batch): IOS vs sequential
    fast = result.deploy(model)                                       # a ScheduledModule
    result.save("schedules")                                          # schedules/<model>/<device>/bs<batch>.json

    fast = ios_ray.optimize(model, torch.randn(8, 3, 224, 224))       # search on this machine, then deploy
    fast = ios_ray.optimize(model.cuda().half(), x.cuda().half())     # ... on a GPU, in float16
    fast = ios_ray.optimize(model.to(memory_format=torch.channels_last), x)   # ... NHWC, as the model is held

The ``ios-ray search`` command is a thin layer over :func:`search`: the same call, a table printed from the result.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager, Iterator, Sequence, TypeVar

import torch
from torch import nn

from ios_ray.app.search.job import run_search
from ios_ray.app.search.outcome import SearchOutcome
from ios_ray.app.search.progress import RichSearchProgress, SearchProgress, SilentProgress
from ios_ray.app.search.options import api_doc, api_parameters, check_option_names
from ios_ray.app.search.request import SearchRequest
from ios_ray.dtypes import dtype_name, module_dtype
from ios_ray.errors import UserError
from ios_ray.runtime import ScheduledModule
from ios_ray.schedule import Schedule, save_schedule, schedule_path
from ios_ray.vocabulary import spelt_shape

if TYPE_CHECKING:
    from ios_ray.app.search.compiled_search import CompiledSearchResult


@dataclass(frozen=True)
class SearchResult:
    """What a search found for one model: one :class:`~ios_ray.app.search.outcome.SearchOutcome` per (device, batch)."""

    model: str
    input_shape: tuple[int, ...]
    outcomes: tuple[SearchOutcome, ...]

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The schedule kept for every (device, batch)."""
        return tuple(o.schedule for o in self.outcomes)

    def __getitem__(self, setting: tuple[str, int]) -> SearchOutcome:
        """The outcome for ``(device, batch)``, e.g. ``result["cpu", 8]``."""
        for outcome in self.outcomes:
            if (outcome.device, outcome.batch) == setting:
                return outcome
        known = ", ".join(f"({o.device!r}, {o.batch})" for o in self.outcomes)
        raise KeyError(f"no outcome for {setting!r}; this search has {known}")

    def __iter__(self) -> Iterator[SearchOutcome]:
        return iter(self.outcomes)

    def __len__(self) -> int:
        return len(self.outcomes)

    def deploy(
        self, model: nn.Module, cuda_graph: bool | None = None, follow_weights: bool = True, any_device: bool = False,
    ) -> ScheduledModule:
        """``model`` wrapped to run, per input, the schedule of this search that fits its device, dtype and batch
        (:class:`~ios_ray.runtime.ScheduledModule`'s options: ``any_device=True`` runs a ``sim:`` schedule on the
        CPU, to check that it computes the model)."""
        return ScheduledModule(model, list(self.schedules), input_shape=self.input_shape, cuda_graph=cuda_graph,
                               follow_weights=follow_weights, any_device=any_device)

    def save(self, out: str | Path) -> list[Path]:
        """Write every schedule as ``out/<model>/<device>/bs<batch>.json`` (``bs<batch>-<dtype>.json`` for a dtype
        other than float32, ``-channels_last`` added for that memory format); returns the files written."""
        paths = [schedule_path(Path(out), self.model, o.device, o.batch, o.schedule.dtype, o.schedule.memory_format)
                 for o in self.outcomes]
        for outcome, path in zip(self.outcomes, paths):
            save_schedule(outcome.schedule, path)
        return paths

    def __repr__(self) -> str:
        dtypes = ", ".join(sorted({" ".join(o.schedule.numerics) for o in self.outcomes}))
        lines = [f"SearchResult({self.model!r}, input {spelt_shape(self.input_shape)}, {dtypes}):"]
        lines += [f"  {o.summary()}" for o in self.outcomes]
        return "\n".join(lines)


def search(
    model: nn.Module | str, devices: Sequence[str] | str = ("cpu",), batches: Sequence[int] | int = (1,), *,
    progress: bool | SearchProgress = True, torch_compile: bool = False, **options: Any,
) -> SearchResult | CompiledSearchResult:
    """Find the fastest schedule of ``model`` for every device and batch size, measuring only what the store lacks.

    ``model`` is an ``nn.Module`` object or a spec (a zoo name, ``package.module:factory``...). Devices are labels
    such as ``cpu``, ``cuda``, ``v100`` or ``sim:v100``. Measurements go to the DuckDB file ``store`` and are reused
    by every later search. ``progress`` shows progress bars (in a terminal or a notebook), or takes an object of the
    ``SearchProgress`` protocol. ``torch_compile=True`` searches instead each graph ``torch.compile(model,
    backend="ios_ray")`` hands the backend at each batch size (a
    :class:`~ios_ray.app.search.compiled_search.CompiledSearchResult`), so that a compile later only looks its schedules up.
    The options (:class:`~ios_ray.app.search.options.SearchOptions`):

{options}
    """
    check_option_names(options)
    if torch_compile:
        from ios_ray.app.search.compiled_search import search_graphs

        return search_graphs(model, _as_tuple(batches), options.pop("input_shape", None), options.pop("name", None),
                             search, {"devices": devices, "progress": progress, **options})
    request = SearchRequest(model=model, devices=_as_tuple(devices), batches=_as_tuple(batches), **options)
    with _progress(progress) as shown:
        outcomes = run_search(request, shown)
    first = outcomes[0].schedule
    return SearchResult(first.model, tuple(first.input_shape or ()), tuple(outcomes))


search.__doc__ = (search.__doc__ or "").replace("{options}", api_doc())
search.__signature__ = inspect.signature(search).replace(parameters=[  # type: ignore[attr-defined]
    *list(inspect.signature(search).parameters.values())[:3], *api_parameters(),
    inspect.signature(search).parameters["progress"], inspect.signature(search).parameters["torch_compile"]])


def optimize(
    model: nn.Module, example_input: torch.Tensor, device: str | None = None, **options: object
) -> ScheduledModule:
    """Search ``model`` on this machine for the example input's shape, batch size and dtype, and return it scheduled.

    ``device`` is ``cpu`` or ``cuda[:i]`` (default: the example input's device); ``options`` are :func:`search`'s
    keyword arguments (``store``, ``r``, ``s``, ``check_rounds``, ``progress``...). The model is searched in the
    memory format it is held in (``model.to(memory_format=torch.channels_last)`` first for NHWC).
    """
    if not isinstance(example_input, torch.Tensor):
        raise UserError(f"example_input must be a tensor (a batch, batch size first), not a "
                        f"{type(example_input).__name__}.")
    label = device or ("cpu" if example_input.device.type == "cpu" else str(example_input.device))
    if not (label == "cpu" or label == "cuda" or label.startswith("cuda:")):
        raise UserError(f"optimize runs on this machine (device cpu or cuda[:i]), not {label!r}; "
                        "use ios_ray.search for other devices.")
    if example_input.dim() < 2:
        raise UserError(f"example_input must be a batch (batch size first), not a tensor of shape "
                        f"{tuple(example_input.shape)}.")
    for clash in ("devices", "batches", "input_shape", "dtype"):
        if clash in options:
            raise UserError(f"optimize takes the {clash} from the example input and device; leave {clash} out.")
    check_option_names(options, "optimize", also=("progress",))
    dtype, held = dtype_name(example_input.dtype), module_dtype(model)
    if dtype != held:
        raise UserError(f"example_input is {dtype} and the model's parameters are {held}; convert one to the other's "
                        "dtype (model.half(), x.float()...).")
    result = search(model, [label], [int(example_input.shape[0])], input_shape=tuple(example_input.shape[1:]),
                    dtype=dtype, **options)  # type: ignore[arg-type]
    return result.deploy(model)  # type: ignore[union-attr]  # a search without torch_compile: a SearchResult


_Item = TypeVar("_Item", str, int)


def _as_tuple(value: Sequence[_Item] | _Item) -> tuple[_Item, ...]:
    """One item or several, as a tuple."""
    return (value,) if isinstance(value, (str, int)) else tuple(value)


def _progress(progress: bool | SearchProgress) -> ContextManager[SearchProgress]:
    """Progress bars on a rich console (terminal or notebook), nothing, or the caller's own progress object."""
    if progress is True:
        from ios_ray.app.search.progress import make_console

        return RichSearchProgress(make_console())
    if progress is False:
        return nullcontext(SilentProgress())
    return nullcontext(progress)
