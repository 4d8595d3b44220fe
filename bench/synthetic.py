"""A deterministic, non-additive synthetic latency model, for testing and benchmarking the search (outside the
package: only tests and benchmarks use it, and the tests import it from here, as they import the rest of bench/).

Its numbers mean nothing about any device (the ``sim:`` devices of the profiler model those); they only have the
shape that makes scheduling non-trivial:

* a unit costs its FLOPs times ``ms_per_gflop`` (units without FLOPs get a fixed pseudo-random cost from a hash
  of their id);
* a ``concurrent`` stage costs the slowest group, plus ``contention`` times the other groups (they slow each
  other down), plus ``launch_ms``: grouping saves time, but not all of it;
* a ``merge`` stage costs ``merge_factor`` times the sum of its convs, plus ``launch_ms``;
* with ``hiding`` above 0, that share of the concurrent stages of three or more groups (fixed by a hash of their
  groups' costs) hides one group behind the others: such a stage costs its largest sub-stage (one group dropped),
  less than estimates composed from pairs of groups predict.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from ios_ray.ir import Graph
from ios_ray.stage import Stage


@dataclass(frozen=True)
class SyntheticCost:
    """Made-up stage latencies in milliseconds for the units of ``graph`` (see the module docstring)."""

    graph: Graph
    ms_per_gflop: float = 10.0
    contention: float = 0.5
    merge_factor: float = 0.6
    launch_ms: float = 0.01
    hiding: float = 0.0

    @cached_property
    def unit_ms(self) -> dict[str, float]:
        """The cost of each unit on its own, without launch overhead, by unit id."""
        return {
            u.id: u.flops * self.ms_per_gflop / 1e9 if u.flops else 0.01 + 0.1 * _hash_fraction(u.id)
            for u in self.graph.units
        }

    def latency(self, stage: Stage) -> float:
        """The synthetic latency of ``stage``."""
        unit_ms = self.unit_ms
        if stage.strategy == "merge":
            return self.launch_ms + self.merge_factor * sum(unit_ms[u] for u in stage.units)
        groups = [sum(unit_ms[u] for u in group) for group in stage.groups]
        if len(groups) >= 3 and _hash_fraction(repr(sorted(round(ms, 9) for ms in groups))) < self.hiding:
            subs = (Stage("concurrent", stage.groups[:j] + stage.groups[j + 1:]) for j in range(len(groups)))
            return max(self.latency(sub) for sub in subs)
        slowest = max(groups)
        return self.launch_ms + slowest + self.contention * (sum(groups) - slowest)


def _hash_fraction(text: str) -> float:
    """A number in [0, 1) fixed by ``text``, the same in every process."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 16**8
