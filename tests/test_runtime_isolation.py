"""What each side loads: the runtime imports torch and ios_ray core only (deploying a schedule never loads ray, duckdb
or pyarrow), and an actor of a simulated device never loads torch (its start is an import of ray and ios_ray)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from tests.helpers import HANG_S

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from ios_ray.frontend import import_module
    from ios_ray.runtime import ScheduledModule, measure_latency
    from ios_ray.schedule import BlockSchedule, Schedule
    from ios_ray.stage import Stage
    from ios_ray.zoo import ZOO

    model = ZOO["squeezenet"].build()
    graph = import_module(model, torch.randn(1, 3, 224, 224)).graph
    blocks = tuple(
        BlockSchedule(b.index, tuple(Stage("concurrent", ((u,),)) for u in b.units)) for b in graph.blocks
    )
    schedule = Schedule("squeezenet", graph.fingerprint, "cpu", 1, blocks, input_shape=graph.input_shape)
    scheduled = ScheduledModule(model, [schedule])
    measure_latency(scheduled, torch.randn(1, 3, 224, 224), 1, 1, "cpu")
    print(sorted(m for m in ("ray", "duckdb", "pyarrow") if m in sys.modules))
    """
)


def test_runtime_leaves_ray_duckdb_and_pyarrow_unloaded() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


SIM_ACTOR = textwrap.dedent(
    """
    import sys
    from ios_ray.profiler.actors import ProfilerActor
    from ios_ray.profiler.jobs import MeasureJob, ModelSource
    from ios_ray.stage import Stage, StageKeys
    from tests.conftest import inception_c_graph

    graph = inception_c_graph()
    keys = StageKeys(graph)
    stages = [Stage("concurrent", (("b1",), ("b7a",))), Stage("merge", (("b1",), ("bp",)))]
    jobs = [MeasureJob(keys.key(s), s, keys.describe_json(s), graph, ModelSource(graph.name, graph.input_shape), 1)
            for s in stages]
    actor = ProfilerActor("sim:v100", None, None)
    assert actor.hello().identity is not None and actor.prepare(jobs[0].model, "float32", "contiguous").problem is None
    rows = actor.measure(jobs)
    assert len(rows) == 2 and all(row["median_ms"] > 0 for row in rows), rows
    print("torch" in sys.modules)
    """
)


def test_a_simulated_devices_actor_measures_without_loading_torch() -> None:
    result = subprocess.run([sys.executable, "-c", SIM_ACTOR], capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"
