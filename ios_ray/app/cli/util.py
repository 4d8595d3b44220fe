"""Shared pieces of the command line: turning UserError into one sentence and an exit code, parsing lists, and the
search a command's missing schedules need."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, TypeVar

import typer

from ios_ray.errors import UserError
from ios_ray.interrupts import ignore_stops, stop_on_sigterm, was_terminated
from ios_ray.vocabulary import DEFAULT_DTYPE, DEFAULT_MEMORY_FORMAT, checked_batches

if TYPE_CHECKING:
    from ios_ray.app.search.budgets import Lookup

F = TypeVar("F", bound=Callable[..., Any])


#: Whether errors show their traceback (``ios-ray --debug ...``).
_show_tracebacks = False
#: The exit status after Ctrl-C, as a shell gives one (128 + SIGINT).
INTERRUPTED = 130
#: The exit status after a SIGTERM (128 + SIGTERM).
TERMINATED = 143


class CommandLine(typer.Typer):
    """The ``ios-ray`` app. Called as the process's command (the console script, ``python -m ios_ray``), a SIGTERM
    stops a command as a Ctrl-C does (:func:`~ios_ray.interrupts.stop_on_sigterm`), and the process ends at once when
    the command has (:func:`_end_now`): the local Ray a search kept is shut down, the output flushed, and the
    interpreter's own exit skipped. That exit (Ray's exit hook sleeps, the modules' teardown) held every search for a
    second or two (bench/RESULTS.md, "How a command ends") and, after a Ctrl-C, raced the threads Ray leaves winding
    down (a segfault now and then, bench/ctrl_c.py). Run in-process (``CliRunner``), it behaves as any Typer app."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the command line, then end the process with its exit status (130 after a Ctrl-C, 143 after a
        SIGTERM)."""
        stop_on_sigterm()
        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as done:
            _end_now(done.code)


def _end_now(code: int | str | None) -> NoReturn:
    """End the process with ``code`` as ``sys.exit`` would, but at once: a local Ray still up is shut down first (the
    one a search keeps for the searches after it), the output streams flushed, then ``os._exit``. The command has
    ended, so a Ctrl-C or a SIGTERM from here on has nothing left to stop and is ignored (one that came during Ray's
    shutdown, a second or so, raised out of it as a traceback and exit -2, or Ray's own exit 1)."""
    ignore_stops()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a reader that went away (``ios-ray show | head``) has all it wanted
            stream.flush()
    os._exit(0 if code is None else code if isinstance(code, int) else 1)


def debug_option(debug: bool = typer.Option(False, "--debug", help="show the traceback behind an error")) -> None:
    """Options of every command (the typer callback of the ``ios-ray`` app)."""
    global _show_tracebacks
    _show_tracebacks = debug


def user_errors(command: F, stopped: str = "") -> F:
    """Decorate a CLI command: UserError prints one line on stderr (with ``--debug`` also the traceback of what
    caused it) and exits 1; Ctrl-C exits 130, a SIGTERM 143, after one line (``interrupted.``, or ``interrupted:``
    and ``stopped``, what a stopped command leaves behind: a search, what it measured)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            if _show_tracebacks:
                traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
        except KeyboardInterrupt as stop:
            terminated = was_terminated(stop)
            word = "terminated" if terminated else "interrupted"
            print(f"{word}: {stopped}" if stopped else f"{word}.", file=sys.stderr)
            raise typer.Exit(TERMINATED if terminated else INTERRUPTED) from None

    return wrapper  # type: ignore[return-value]


def parse_batches(text: str) -> list[int]:
    """Parse ``1,32,128`` into batch sizes (:func:`~ios_ray.vocabulary.checked_batches`); anything else is a
    UserError."""
    try:
        batches = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"--batches takes comma-separated positive integers, not {text!r}.") from None
    return list(checked_batches(batches))


def at_least_one(**counts: int) -> None:
    """UserError unless every named count (``--repeat``, ``--rounds``...) is at least 1."""
    for name, value in counts.items():
        if value < 1:
            raise UserError(f"--{name} must be at least 1, not {value}.")


def parse_list(text: str, what: str) -> list[str]:
    """Parse a comma-separated list of names (devices, say); an empty list is a UserError."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise UserError(f"{what} must name at least one item.")
    return items


def store_lookup(path: Path) -> "Lookup | None":
    """The latency store's lookup as a plain function, or None where there is no store yet."""
    if not Path(path).exists():
        return None
    from ios_ray.store import LatencyStore

    store = LatencyStore(path, create=False)
    return lambda keys, fingerprint, batch, dtype: store.lookup(list(keys), fingerprint, batch, dtype)


def search_command(model: str, devices: str, batches: str | None = None, dtype: str = DEFAULT_DTYPE,
                   memory_format: str = DEFAULT_MEMORY_FORMAT, input_shape: str | None = None,
                   out: str | Path | None = None) -> str:
    """The ``ios-ray search`` command that writes the schedules a command looked for, options at their defaults (or
    None) left out."""
    options = {"--model": model, "--devices": devices, "--batches": batches,
               "--dtype": None if dtype == DEFAULT_DTYPE else dtype,
               "--memory-format": None if memory_format == DEFAULT_MEMORY_FORMAT else memory_format,
               "--input-shape": input_shape, "--out": out}
    return " ".join(["ios-ray search", *(f"{name} {value}" for name, value in options.items() if value)])
