"""Where a search's time goes: seconds per phase on the driver's clock (:class:`Stopwatch`), and what a setting's
outcome, its schedule file and the search's last line say of them (:class:`SearchTimes`).

The phases, in the order a search reaches them (:data:`PHASES`):

* ``start-up``: the checks of the request and the cluster, Ray and the device actors starting (on a measured device
  the driver's import and plan begin meanwhile, on a thread of their own);
* ``import``: the model built and imported on the driver, its candidate stages planned, the store opened (on a
  measured device what is left of them to wait for, while the actors build the model; where no device is a CPU,
  the plan's rest only after the kernels);
* ``build``: waiting, after the import, for the actors' own build of the model;
* ``kernels``: choosing each setting's kernels (on a measured device the sequential schedule timed whole with each)
  and reading the corrections fitted by earlier searches;
* ``choosing``: deciding which stages to measure next (a lazy search's DP over what is measured so far);
* ``measuring``: the devices measuring stages (the driver storing their rows as they come);
* ``DP``: the DP's schedule and its alternatives, per setting;
* ``check``: the end-to-end check of the candidates, per setting.

What is in none of them (writing files, reading the store back) is ``other``: the phases and ``other`` add up to
the wall time. On a GPU search the figures say which part stands between a search and its target (bench/RESULTS.md,
gpu_check).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

#: The phases of a search, in the order it reaches them.
PHASES = ("start-up", "import", "build", "kernels", "choosing", "measuring", "DP", "check")


@dataclass(frozen=True)
class SearchTimes:
    """Seconds from a search's start to a moment (``wall_s``), and how many of them each phase took (in
    :data:`PHASES` order, those it reached); the rest is ``other_s``."""

    wall_s: float
    phases: tuple[tuple[str, float], ...] = ()

    @property
    def other_s(self) -> float:
        """Seconds in no phase (writing files, reading the store back)."""
        return max(0.0, self.wall_s - sum(seconds for _, seconds in self.phases))

    def to_json(self) -> dict[str, float]:
        """``{"wall": s, phase: s, ..., "other": s}``, to 0.01 s (a schedule file's ``params["search_s"]``)."""
        return {"wall": round(self.wall_s, 2), **{name: round(s, 2) for name, s in self.phases},
                "other": round(self.other_s, 2)}

    def summary(self) -> str:
        """One line: the wall time and each phase's share (``10.7 s: start-up 5.5, import 1.8, ..., other 0.0``)."""
        parts = [f"{name} {seconds:.1f}" for name, seconds in self.phases] + [f"other {self.other_s:.1f}"]
        return f"{self.wall_s:.1f} s: {', '.join(parts)}"


@dataclass
class Stopwatch:
    """Adds up the seconds a search spends in each phase (:meth:`phase`) from its start; :meth:`read` says where it
    stands. ``clock`` reads seconds (tests pass a fake)."""

    clock: Callable[[], float] = time.perf_counter
    started: float = field(init=False)
    seconds: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.started = self.clock()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the time of the ``with`` body (an exception's too) to phase ``name``, one of :data:`PHASES`."""
        if name not in PHASES:
            raise ValueError(f"no search phase {name!r}; the phases are {', '.join(PHASES)}")
        begun = self.clock()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - begun

    def read(self) -> SearchTimes:
        """The seconds since the start, and per phase reached, in :data:`PHASES` order."""
        return SearchTimes(self.clock() - self.started,
                           tuple((name, self.seconds[name]) for name in PHASES if name in self.seconds))
