"""How many stages a lazy search's round asks for: enough that the devices, not the driver, set the pace.

Each lazy round costs the driver the DPs that choose its stages (:func:`~ios_ray.scheduler.next_round`) and the
devices the measuring of them. Small rounds measure fewest stages, since every answer informs the next choice;
but on a large search space (PNASNet-5 Large: 120,000 candidate stages, blocks of millions of transitions) the
choosing takes about half a second a round whatever the round's size, while a simulated device measures 64
stages in milliseconds, so a search of 64-stage rounds would be hundreds of rounds of idle devices. So a round
starts at :data:`ROUND_STAGES_PER_ACTOR` per actor and doubles whenever choosing took more than
:data:`DRIVER_SHARE` of the last round, up to :data:`MAX_GROWTH` times; it halves again when choosing falls
under a quarter of that share. Choosing under :data:`QUICK_CHOICE_S` never grows a round: the whole search is
then quick anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Stages a lazy round asks of each setting, per actor of its device, at first (a few batches for every actor).
ROUND_STAGES_PER_ACTOR = 32
#: Rounds grow while choosing their stages takes more than this share of a round (choosing and measuring).
DRIVER_SHARE = 0.25
#: Rounds grow to at most this many times their first size.
MAX_GROWTH = 64
#: Choosing that takes less than this (seconds) never grows a round.
QUICK_CHOICE_S = 0.2


@dataclass(frozen=True)
class RoundSize:
    """The size of the next lazy round, as a multiple (``growth``) of its first size."""

    growth: int = 1

    def stages(self, actors: int) -> int:
        """Stages a round asks of one setting on a device with ``actors`` actors."""
        return ROUND_STAGES_PER_ACTOR * max(actors, 1) * self.growth

    def after(self, choosing_s: float, measuring_s: float) -> RoundSize:
        """The size of the round after one whose stages took ``choosing_s`` to choose and ``measuring_s`` to
        measure (seconds): doubled, halved or the same (see the module docstring)."""
        share = choosing_s / max(choosing_s + measuring_s, 1e-9)
        if choosing_s >= QUICK_CHOICE_S and share > DRIVER_SHARE:
            return RoundSize(min(self.growth * 2, MAX_GROWTH))
        if share < DRIVER_SHARE / 4:
            return RoundSize(max(self.growth // 2, 1))
        return self
