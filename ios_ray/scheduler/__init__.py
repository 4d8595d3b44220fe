"""The search: endings, the IOS dynamic program, the baselines, and planning what to measure.

Pure functions over the graph IR: dataclasses in, dataclasses out; no device, Ray or store.

* :mod:`~ios_ray.scheduler.dag`: a block as bitmasks; :mod:`~ios_ray.scheduler.endings`: the endings of a state.
* :mod:`~ios_ray.scheduler.space`: :class:`SearchParams` and the states, endings and candidate stages of a block.
* :mod:`~ios_ray.scheduler.dp`: :func:`optimize_block`, :func:`optimize_graph`.
* :mod:`~ios_ray.scheduler.baselines`: :func:`sequential`, :func:`greedy`.
* :mod:`~ios_ray.scheduler.plan`: :func:`plan_graph`, :func:`count_block`.
* :mod:`~ios_ray.scheduler.latency`: the :class:`LatencyModel` protocol and :class:`TableLatency`;
  :mod:`~ios_ray.scheduler.synthetic`: :class:`SyntheticCost`.
"""

from ios_ray.scheduler.baselines import greedy, greedy_stages, sequential, sequential_stages
from ios_ray.scheduler.dag import BlockDag
from ios_ray.scheduler.dp import BlockResult, GraphResult, SearchStats, optimize_block, optimize_graph
from ios_ray.scheduler.endings import endings
from ios_ray.scheduler.latency import LatencyModel, MissingLatencyError, TableLatency
from ios_ray.scheduler.plan import BlockCounts, BlockPlan, Plan, PlannedStage, count_block, plan_graph
from ios_ray.scheduler.space import BlockSpace, SearchParams
from ios_ray.scheduler.synthetic import SyntheticCost

__all__ = [
    "BlockCounts", "BlockDag", "BlockPlan", "BlockResult", "BlockSpace", "GraphResult", "LatencyModel",
    "MissingLatencyError", "Plan", "PlannedStage", "SearchParams", "SearchStats", "SyntheticCost", "TableLatency",
    "count_block", "endings", "greedy", "greedy_stages", "optimize_block", "optimize_graph",
    "plan_graph", "sequential", "sequential_stages",
]
