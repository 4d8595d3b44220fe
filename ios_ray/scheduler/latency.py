"""Where the DP gets stage latencies from: a lookup, never a device.

A :class:`LatencyModel` is anything with ``latency(stage) -> float`` (milliseconds). The search asks it once per
distinct candidate stage of a block. :class:`TableLatency` reads a table of measured latencies by stage key;
tests and benchmarks make latencies up with ``SyntheticCost`` (``bench/synthetic.py``, outside the package).
"""

from __future__ import annotations

from typing import Mapping, Protocol

from ios_ray.stage import Stage, StageKeys


class LatencyModel(Protocol):
    """A source of stage latencies."""

    def latency(self, stage: Stage) -> float:
        """The latency of ``stage`` in milliseconds."""
        ...


class MissingLatencyError(KeyError):
    """A stage the latency table has no entry for."""

    def __init__(self, key: str, description: str) -> None:
        super().__init__(key)
        self.key = key
        self.description = description

    def __str__(self) -> str:
        return f"no latency for stage key {self.key} ({self.description}); plan and measure the stages first."


class TableLatency:
    """Latencies looked up by stage key in a table, such as the rows of the latency store for one device.

    ``missing``: the latency of a stage the table lacks (``math.inf`` after a lazy search, so the DP keeps to
    measured stages); None raises :class:`MissingLatencyError` instead.
    """

    def __init__(self, keys: StageKeys, table: Mapping[str, float], missing: float | None = None) -> None:
        self.keys = keys
        self.table = table
        self.missing = missing

    def latency(self, stage: Stage) -> float:
        """The table's latency for ``stage`` (see ``missing`` for a stage it lacks)."""
        key = self.keys.key(stage)
        found = self.table.get(key, self.missing)
        if found is None:
            raise MissingLatencyError(key, self.keys.describe_json(stage))
        return found
