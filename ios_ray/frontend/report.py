"""How much of a graph stayed opaque: the count and share of opaque units, their share of FLOPs, their op kinds.

Opaque units run the original code, one op at a time: each is one more kernel and one more barrier on a GPU, and
one more candidate in every stage around it. ``ios-ray inspect`` prints this report and ``ios-ray search`` warns
in one line where more than :data:`OPAQUE_WARNING_SHARE` of the units are opaque.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

from ios_ray.ir import Graph

#: The share of opaque units above which a search warns.
OPAQUE_WARNING_SHARE = 0.10
#: How many op kinds the report names.
TOP_OPS = 5


@dataclass(frozen=True)
class OpaqueReport:
    """The opaque units of a graph: how many of all units, their share of FLOPs, and the most frequent op kinds
    (counting every op an opaque unit runs)."""

    units: int
    opaque: int
    flops_share: float
    ops: tuple[tuple[str, int], ...]

    @property
    def share(self) -> float:
        """Opaque units as a share of all units."""
        return self.opaque / self.units if self.units else 0.0

    @property
    def warrants_warning(self) -> bool:
        """Whether the share of opaque units is above :data:`OPAQUE_WARNING_SHARE`."""
        return self.share > OPAQUE_WARNING_SHARE

    def summary(self) -> str:
        """One line: ``3 of 120 units are opaque (2.5% of units, 0.1% of FLOPs): permute x2, LayerNorm x1``."""
        text = (f"{self.opaque} of {self.units} units are opaque ({self.share:.1%} of units, "
                f"{self.flops_share:.1%} of FLOPs)")
        return text + (": " + ", ".join(f"{op} x{n}" for op, n in self.ops) if self.ops else "")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {"units": self.units, "opaque": self.opaque, "share": self.share, "flops_share": self.flops_share,
                "ops": [{"op": op, "count": n} for op, n in self.ops]}


def opaque_report(graph: Graph) -> OpaqueReport:
    """The :class:`OpaqueReport` of a graph."""
    opaque = [u for u in graph.units if u.kind == "opaque"]
    total_flops = sum(u.flops for u in graph.units)
    kinds = Counter(op_kind(op) for u in opaque for op in unit_ops(u.attrs))
    return OpaqueReport(len(graph.units), len(opaque), sum(u.flops for u in opaque) / total_flops if total_flops
                        else 0.0, tuple(kinds.most_common(TOP_OPS)))


def unit_ops(attrs: Mapping[str, Any]) -> list[str]:
    """The ops an opaque unit runs: its own and those of the chain it took in (elementwise steps left out)."""
    then = [text.partition("(")[0] for text in attrs.get("then", ()) if text.startswith("call_")]
    return [str(attrs.get("op", "?")), *then]


def op_kind(op: str) -> str:
    """The short name of an opaque unit's op: ``call_function:torch.nn.functional.pad`` is ``pad``."""
    return op.partition(":")[2].rpartition(".")[2] or op
