"""The options of a search, declared once: :class:`SearchOptions` (each with its default and a one-line help) is what
``ios_ray.search`` takes as keywords (:func:`api_parameters`), what :class:`~ios_ray.app.search.request.SearchRequest`
holds, and what ``ios-ray search`` offers as ``--options`` (:func:`cli_parameters`). It loads neither torch nor the
scheduler until a search is made, so the command line starts quickly.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import numbers
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

from ios_ray.errors import UserError
from ios_ray.store import DEFAULT_STORE_PATH
from ios_ray.vocabulary import (DEFAULT_CHECK_CONFIDENCE, DEFAULT_CHECK_ROUNDS, DEFAULT_CHECK_SECONDS,
                                DEFAULT_KERNEL_CHOICE, DEFAULT_MEASURE, DEFAULT_R, DEFAULT_S, DEFAULT_SIM_ACTORS,
                                KERNEL_CHOICES, STRATEGIES)

if TYPE_CHECKING:
    from ios_ray.scheduler import SearchParams

#: Where ``ios-ray search`` writes schedules unless told (the API writes none unless given ``out``).
DEFAULT_OUT = Path("schedules")
#: A command-line form's default where it is the option's own.
_OWN = object()


@dataclass(frozen=True)
class CliForm:
    """How an option reads on the command line, where not as its Python form: its flags, its type and default
    there, and the function that turns that into the Python value."""

    flags: tuple[str, ...] = ()
    kind: Any = None
    default: Any = _OWN
    parse: Callable[[Any], Any] | None = None


def _option(default: Any, help: str, cli: CliForm | None = CliForm()) -> Any:  # noqa: A002 - typer's word
    """A field of :class:`SearchOptions`: its default, its help, and its command-line form (None: API only)."""
    return dataclasses.field(default=default, metadata={"help": help, "cli": cli})


class StrategyChoice(str, Enum):
    """Which stage strategies the search may use, on the command line."""

    both = "both"
    concurrent = "concurrent"
    merge = "merge"


class MeasureChoice(str, Enum):
    """Which stages the search measures, on the command line."""

    lazy = "lazy"
    all = "all"


#: Which kernels the stages run with, on the command line: :data:`~ios_ray.vocabulary.KERNEL_CHOICES`.
KernelsChoice = Enum("KernelsChoice", {choice: choice for choice in KERNEL_CHOICES}, type=str)  # type: ignore[misc]


def parse_input_shape(text: str | None) -> tuple[int, ...] | None:
    """Parse ``3x224x224`` into a per-sample input shape (None stays None); anything else is a UserError."""
    if text is None:
        return None
    try:
        shape = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or any(n < 1 for n in shape):
        raise UserError(f"--input-shape takes positive sizes joined by x, such as 3x224x224, not {text!r}.")
    return shape


def _strategies(choice: StrategyChoice) -> tuple[str, ...]:
    return STRATEGIES if choice is StrategyChoice.both else (choice.value,)


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """How to search: every option of ``ios_ray.search`` and ``ios-ray search`` but the model, devices and batches.
    Values are taken in any spelling the help names and kept in one (paths as ``Path``, dtypes by name...)."""

    store: Path = _option(DEFAULT_STORE_PATH, "latency store file (DuckDB): every measurement, reused by later searches")
    out: Optional[Path] = _option(None, "folder for OUT/<model>/<device>/bs<batch>.json (None: no files)",
                                  CliForm(default=DEFAULT_OUT))
    input_shape: Optional[tuple[int, ...]] = _option(
        None, "per-sample input shape CxHxW, e.g. 3x299x299 (default: the model's own)",
        CliForm(kind=Optional[str], parse=parse_input_shape))
    name: Optional[str] = _option(None, "the model's name in schedules (default: the spec's, or the class name)",
                                  None)
    r: Optional[int] = _option(DEFAULT_R, "pruning: max units per group", CliForm(flags=("-r",)))
    s: Optional[int] = _option(DEFAULT_S, "pruning: max groups per stage", CliForm(flags=("-s",)))
    strategies: tuple[str, ...] = _option(
        STRATEGIES, "stage strategies to consider (concurrent, merge)",
        CliForm(flags=("--strategy",), kind=StrategyChoice, default=StrategyChoice.both, parse=_strategies))
    address: Optional[str] = _option(None, "join a Ray cluster (auto or ray://...); default: start Ray locally "
                                     "in-process")
    sim_actors: int = _option(DEFAULT_SIM_ACTORS, "actors per sim: device where no node offers its GPU")
    warmup: Optional[int] = _option(None, "untimed runs per stage (default: cpu 3 calls; gpu 3 replays of its CUDA "
                                    "graph)")
    repeat: Optional[int] = _option(None, "timed runs per stage (default: cpu 10 calls; gpu 10 replays of a graph of "
                                    "8 copies)")
    check_rounds: int = _option(DEFAULT_CHECK_ROUNDS, "most rounds of the end-to-end check, which times the IOS and "
                                "sequential schedules whole in paired rounds and keeps IOS only where it is faster "
                                "beyond noise (0: no check)")
    check_confidence: float = _option(DEFAULT_CHECK_CONFIDENCE, "confidence of the check's interval of IOS / "
                                      "sequential")
    check_seconds: Optional[float] = _option(DEFAULT_CHECK_SECONDS, "the check goes on to its next look only where "
                                             "it would reach it within this many seconds, and runs a candidate after "
                                             "the IOS schedule only where its first calls (compiles) start within "
                                             "half of them (None: no time cap)",
                                             CliForm(kind=float))
    compile_workers: Optional[int] = _option(None, "worker processes that compile the check's Inductor regions "
                                             "beside the device's actor (default: one per core of its host but the "
                                             "actor's, at most 8, one per 8 regions; 0: none)")
    measure: str = _option(DEFAULT_MEASURE, "lazy: only the stages that can change the schedule, round by round; "
                           "all: every candidate stage", CliForm(kind=MeasureChoice, default=MeasureChoice.lazy,
                                                                 parse=lambda choice: choice.value))
    budget: Optional[int] = _option(None, "lazy: at most this many stages per device and batch (stored ones "
                                    "included)")
    dtype: Optional[str] = _option(None, "float32, float16 or bfloat16: the precision stages are measured in "
                                   "(default: a model object's own, float32 for a spec; other than float32 the files "
                                   "are bs<batch>-<dtype>.json)")
    memory_format: Optional[str] = _option(None, "contiguous (NCHW) or channels_last (NHWC): the layout stages are "
                                           "measured in (default: a model object's own, contiguous for a spec; "
                                           "channels_last files are bs<batch>[-<dtype>]-channels_last.json)")
    kernels: str = _option(DEFAULT_KERNEL_CHOICE, "the kernels units run with: fused (activations channels-last, "
                           "each conv one call with its bias and activation: oneDNN on a CPU, cuDNN on a GPU), eager "
                           "(torch's own ops, as the model calls them), inductor (as eager, each run of stages not of "
                           "several groups, and each group of the others, compiled by Inductor into one region), or "
                           "auto: on a measured device each in turns as the sequential schedule runs whole, a "
                           "challenger kept only where faster than the one kept beyond noise",
                           CliForm(kind=KernelsChoice, default=KernelsChoice(DEFAULT_KERNEL_CHOICE),
                                   parse=lambda choice: choice.value))
    memory_budget: Optional[str | int] = _option(
        None, "keep each schedule's peak activation memory within this many bytes, or a factor of the sequential "
        "schedule's peak such as 1.1x (default on GPU labels such as sim:v100 or t4: their memory less the weights "
        "and a margin; none: no budget)", CliForm(kind=Optional[str]))

    def __post_init__(self) -> None:
        """Keep every value in one spelling: paths as ``Path``, shapes and strategies as tuples, canonical names;
        UserError naming the first option given a value of the wrong kind (``store=123``)."""
        from ios_ray.dtypes import dtype_name, memory_format_name  # torch: loaded when a search is made, not by the CLI

        for f in dataclasses.fields(SearchOptions):
            _check_kind(f.name, getattr(self, f.name), str(f.type))

        tidy = {"store": Path(self.store), "out": None if self.out is None else Path(self.out),
                "input_shape": None if self.input_shape is None else tuple(self.input_shape),
                "strategies": tuple(self.strategies),
                "dtype": None if self.dtype is None else dtype_name(self.dtype),
                "memory_format": None if self.memory_format is None else memory_format_name(self.memory_format)}
        for name, value in tidy.items():
            object.__setattr__(self, name, value)

    @property
    def params(self) -> SearchParams:
        """The DP's bounds and strategies (UserError where they are not valid)."""
        from ios_ray.scheduler import SearchParams

        return SearchParams(r=self.r, s=self.s, strategies=self.strategies)  # type: ignore[arg-type]

    @property
    def options(self) -> SearchOptions:
        """These options alone (a request's, without its model, devices and batches)."""
        return SearchOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SearchOptions)})


#: What each kind of option takes, by its annotation: (the types, what to call them in an error).
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "Path": ((str, os.PathLike), "a path (str or Path)"),
    "int": ((numbers.Integral,), "a whole number"),
    "float": ((numbers.Real,), "a number"),
    "str": ((str,), "a string"),
}


def _check_kind(name: str, value: Any, annotation: str) -> None:
    """UserError where ``value`` is not of the kind ``annotation`` names (``Optional[...]`` also takes None; a tuple
    annotation takes a list or tuple of its items; dtypes and memory formats are checked by name elsewhere)."""
    optional = annotation.startswith("Optional[")
    inner = annotation[len("Optional["):-1] if optional else annotation
    if (optional and value is None) or name in ("dtype", "memory_format"):
        return
    if inner.startswith("tuple["):
        item = inner[len("tuple["):-len(", ...]")]
        if isinstance(value, (list, tuple)) and all(_is(v, _KINDS[item][0]) for v in value):
            return
        wanted = f"a list or tuple of {_KINDS[item][1].removeprefix('a ')}s"
    else:
        kinds = [_KINDS[part.strip()] for part in inner.split("|")]
        if any(_is(value, types) for types, _ in kinds):
            return
        wanted = " or ".join(words for _, words in kinds)
    raise UserError(f"{name} must be {wanted}{' or None' if optional else ''}, not {value!r}.")


def _is(value: Any, types: tuple[type, ...]) -> bool:
    """``isinstance``, where a bool is no number."""
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def api_parameters() -> list[inspect.Parameter]:
    """``ios_ray.search``'s keyword parameters, one per option, with its default."""
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
            for f in dataclasses.fields(SearchOptions)]


def check_option_names(options: Iterable[str], function: str = "search", also: Sequence[str] = ()) -> None:
    """TypeError, as Python raises it for an unexpected keyword argument, naming ``function`` (not the dataclass
    behind it) and the closest option, where ``options`` names one that neither :class:`SearchOptions` nor ``also``
    (the function's own keyword arguments) has."""
    known = [f.name for f in dataclasses.fields(SearchOptions)] + list(also)
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; its options are {', '.join(known)}."
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}{hint}")


def api_doc() -> str:
    """One line per option for ``ios_ray.search``'s docstring."""
    return "\n".join(f"    ``{f.name}``: {f.metadata['help']}." for f in dataclasses.fields(SearchOptions))


def cli_parameters() -> list[inspect.Parameter]:
    """``ios-ray search``'s options, one typer option per option with a command-line form."""
    import typer

    found = []
    for f in dataclasses.fields(SearchOptions):
        cli: CliForm | None = f.metadata["cli"]
        if cli is None:
            continue
        flags = cli.flags or ("--" + f.name.replace("_", "-"),)
        default = f.default if cli.default is _OWN else cli.default
        kind = cli.kind or _cli_type(str(f.type))
        found.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=kind,
                                       default=typer.Option(default, *flags, help=f.metadata["help"])))
    return found


def from_cli(values: dict[str, Any]) -> dict[str, Any]:
    """The Python values of the options ``ios-ray search`` was given."""
    forms = {f.name: f.metadata["cli"] for f in dataclasses.fields(SearchOptions)}
    return {name: forms[name].parse(value) if forms[name].parse else value for name, value in values.items()}


def _cli_type(annotation: str) -> Any:
    """The type typer reads an option as, from its annotation's text (``from __future__ import annotations``)."""
    return {"Path": Path, "Optional[Path]": Optional[Path], "Optional[int]": Optional[int], "int": int,
            "Optional[str]": Optional[str], "str": str, "float": float, "Optional[float]": Optional[float]}[annotation]
