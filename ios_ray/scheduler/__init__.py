"""The search: endings, the IOS dynamic program, the baselines, and planning what to measure.

Pure functions over the graph IR: dataclasses in, dataclasses out; no device, Ray or store.

* :mod:`~ios_ray.scheduler.dag`: a block as bitmasks; :mod:`~ios_ray.scheduler.endings`: the endings of a state.
* :mod:`~ios_ray.scheduler.space`: :class:`SearchParams` and the states, endings and candidate stages of a block.
* :mod:`~ios_ray.scheduler.dp`: :func:`optimize_block`, :func:`optimize_graph`.
* :mod:`~ios_ray.scheduler.baselines`: :func:`sequential`, :func:`greedy`, and either as a whole schedule,
  :func:`baseline_schedule`.
* :mod:`~ios_ray.scheduler.plan`: :func:`plan_graph`, :func:`count_block`.
* :mod:`~ios_ray.scheduler.latency`: the :class:`LatencyModel` protocol and :class:`TableLatency`.
* The lazy search, which measures only what can change the answer: :mod:`~ios_ray.scheduler.lazy`
  (:class:`LazySpace`, :func:`next_round`), on :mod:`~ios_ray.scheduler.arrays` (the DP as array passes),
  :mod:`~ios_ray.scheduler.relations` (stages and the smaller stages they are made of) and
  :mod:`~ios_ray.scheduler.estimate` (lower bounds and guesses from measured stages).
* :mod:`~ios_ray.scheduler.outliers`: :func:`inflated`, the units alone measured slower than a stage containing them.
"""

from ios_ray.scheduler.baselines import baseline_schedule, greedy, greedy_stages, sequential, sequential_stages
from ios_ray.scheduler.dag import BlockDag
from ios_ray.scheduler.dp import BlockResult, GraphResult, SearchStats, optimize_block, optimize_graph
from ios_ray.scheduler.endings import endings
from ios_ray.scheduler.latency import LatencyModel, MissingLatencyError, TableLatency
from ios_ray.scheduler.lazy import LazyParams, LazyRound, LazySpace, lower_bounds, next_round
from ios_ray.scheduler.outliers import inflated, unit_parts
from ios_ray.scheduler.plan import BlockCounts, BlockPlan, Plan, PlannedStage, count_block, plan_graph
from ios_ray.scheduler.search_space import SearchSpace
from ios_ray.scheduler.space import BlockSpace, SearchParams

__all__ = [
    "BlockCounts", "BlockDag", "BlockPlan", "BlockResult", "BlockSpace", "GraphResult", "LatencyModel",
    "LazyParams", "LazyRound", "LazySpace", "SearchSpace", "MissingLatencyError", "Plan", "PlannedStage", "SearchParams",
    "SearchStats", "TableLatency",
    "baseline_schedule", "count_block", "endings", "greedy", "greedy_stages", "inflated", "lower_bounds", "next_round",
    "optimize_block", "optimize_graph", "plan_graph", "sequential", "sequential_stages", "unit_parts",
]
