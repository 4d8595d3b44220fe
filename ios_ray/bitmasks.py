"""Sets of units as bit masks (bit ``i`` for the ``i``-th unit): the one operation both block detection and the
scheduler need beyond integer arithmetic."""

from __future__ import annotations

from typing import Iterator


def bits(mask: int) -> Iterator[int]:
    """The indices of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
