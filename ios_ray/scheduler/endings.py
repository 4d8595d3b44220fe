"""Enumerating the endings of a state, with the paper's pruning ``r`` and ``s``.

An *ending* of a state S is a non-empty S' ⊆ S with no edge from S' to S - S': it is closed under successors
within S, so it can run as the last stage of S. Its *groups* are its weakly connected components.

Every ending is the set of units reachable (within S) from its minimal units, and those form an antichain, so
endings and non-empty antichains of S correspond one to one. We enumerate antichains depth first, adding units
in index order and only units incomparable with those already chosen; each antichain yields its ending
``up = OR of descendants & S``. This is exact (no ending is missed, none repeats), including endings whose
minimal units share descendants.

Pruning (both bounds are optional):

* ``r``, the most units per group. Adding units to an antichain only grows its ending, and a group of a smaller
  ending lies inside a group of a larger one, so once some group has more than ``r`` units the whole subtree is
  cut. Units whose own descendants in S already exceed ``r`` are never tried.
* ``s``, the most groups. Growing an ending can merge groups, so the count is not monotone and is only checked
  per ending, never used to cut a subtree (except through ``r * s``, a bound on the ending's size). An ending
  has at most as many groups as minimal units, so the components are only computed when that could exceed ``s``.
"""

from __future__ import annotations

from ios_ray.scheduler.dag import BlockDag


def endings(dag: BlockDag, state: int, r: int | None = None, s: int | None = None) -> list[int]:
    """Every ending of ``state`` whose groups have at most ``r`` units and which has at most ``s`` groups.

    ``state`` must be closed under predecessors within the block (every DP state is); ``None`` means no bound.
    """
    if r is None and s is None:
        return _all_endings(dag, state)
    return _pruned_endings(dag, state, r, s)


def _all_endings(dag: BlockDag, state: int) -> list[int]:
    """All endings of ``state``: one per non-empty antichain, grown depth first."""
    desc, incomparable = dag.descendants, dag.incomparable
    found = []
    stack = [(0, state)]
    while stack:
        up, candidates = stack.pop()
        while candidates:
            low = candidates & -candidates
            candidates ^= low
            x = low.bit_length() - 1
            ending = up | (desc[x] & state)
            found.append(ending)
            later = candidates & incomparable[x]
            if later:
                stack.append((ending, later))
    return found


def _pruned_endings(dag: BlockDag, state: int, r: int | None, s: int | None) -> list[int]:
    """The endings of ``state`` within the bounds ``r`` and ``s``, grown like :func:`_all_endings`."""
    desc, incomparable = dag.descendants, dag.incomparable
    roots = state
    if r is not None:
        roots = sum(1 << x for x in range(dag.size) if state >> x & 1 and (desc[x] & state).bit_count() <= r)
    found = []
    stack = [(0, roots, 0)]
    while stack:
        up, candidates, minimal = stack.pop()
        minimal += 1
        while candidates:
            low = candidates & -candidates
            candidates ^= low
            x = low.bit_length() - 1
            ending = up | (desc[x] & state)
            keep, grow = _verdict(dag, ending, minimal, r, s)
            if keep:
                found.append(ending)
            later = candidates & incomparable[x]
            if grow and later:
                stack.append((ending, later, minimal))
    return found


def _verdict(dag: BlockDag, ending: int, minimal: int, r: int | None, s: int | None) -> tuple[bool, bool]:
    """(keep, grow): whether ``ending`` (from ``minimal`` minimal units) is within bounds, and larger ones can be."""
    units = ending.bit_count()
    if r is not None and s is not None and units > r * s:
        return False, False
    if (r is None or units <= r) and (s is None or minimal <= s):
        return True, True
    groups = dag.components(ending)
    if r is not None and any(g.bit_count() > r for g in groups):
        return False, False
    return s is None or len(groups) <= s, True
