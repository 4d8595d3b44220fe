"""Timing stages inside CUDA graphs, without a GPU: the control flow of capture, replay timing and the fall-back
to uncaptured timing runs against a fake ``torch.cuda`` (tests/fake_cuda.py); the rows and fingerprints around it
are real. The same code on a real GPU: tests/test_stage_capture_cuda.py."""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref
from typing import Callable

import pytest
import torch

from ios_ray.frontend import import_module
from ios_ray.ir import Graph
from ios_ray.profiler.fingerprint import CPU_TIMING, cpu_info
from ios_ray.profiler.jobs import MeasureJob, ModelSource, local_identity, make_row
from ios_ray.profiler.protocol import DEFAULT_PROTOCOL, Timing
from ios_ray.profiler.timing import STAGE_COPIES, gpu_protocol, time_stage
from ios_ray.runtime import Program, ScheduleRunner
from ios_ray.runtime.cuda_graph import CapturedForward, CaptureError, capture
from ios_ray.profiler import timing as profiler_timing
from ios_ray.profiler.timing import GRAPH_STAGES
from ios_ray.runtime.timing import BACKLOG_CYCLES, LEAST_REPLAYS, graph_batch_samples_ms, graph_samples_ms
from ios_ray.runtime.streams import StreamPool
from ios_ray.stage import Stage, StageKeys
from tests.fake_cuda import REPLAY_START_MS, UNJOINED, FakeCuda, FakeStream
from tests.helpers import captured_shapes
from tests.test_runtime_schedules import BUILDERS, Tiny, make_schedule, tiny

NOT_CAPTURABLE = "CUDA error: operation not permitted when stream is capturing"


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda().install(monkeypatch)


def test_a_stage_is_timed_per_copy_from_replays_enqueued_behind_the_warm_up(cuda: FakeCuda) -> None:
    calls: list[bool] = []

    def stage() -> None:
        calls.append(cuda.capturing is not None)
        cuda.launch(0.5)

    stream = FakeStream()
    samples = graph_samples_ms(stage, stream, warmup=2, repeat=4, copies=8)
    # one eager warm-up call, then 8 copies captured into one graph
    assert calls == [False] + [True] * 8
    assert cuda.replays == 2 + 4 and cuda.spins == [BACKLOG_CYCLES]  # replays enqueued behind a spin kernel
    assert samples == [pytest.approx(0.5 + REPLAY_START_MS / 8)] * 4  # the replay's start-up spread over 8 copies
    [graph] = cuda.graphs
    assert graph.resets == 1 and cuda.current is cuda.default  # the graph is released, the caller's stream back


def test_a_parallel_stage_forks_its_side_streams_from_the_capture_stream_and_joins_them_back(cuda: FakeCuda) -> None:
    ran_on: list[FakeStream] = []

    def group(name: str):
        def run(env: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            ran_on.append(torch.cuda.current_stream())
            cuda.launch(0.1)
            return {name: env["x"] + 1}
        return run

    fork = StreamPool(torch.device("cuda", 0)).fork(3)
    capture_stream = FakeStream()
    outputs: list[dict[str, torch.Tensor]] = []
    samples = graph_samples_ms(lambda: outputs.append(fork.run([group(n) for n in "abc"], {"x": torch.zeros(1)})),
                               capture_stream, warmup=1, repeat=2, copies=STAGE_COPIES)
    # each group on its own side stream, in the eager warm-up and in every captured copy, all inside the graph
    assert len(set(fork.streams)) == 3 and capture_stream not in fork.streams
    assert ran_on == list(fork.streams) * (1 + STAGE_COPIES)
    assert samples == [pytest.approx(0.3 + REPLAY_START_MS / STAGE_COPIES)] * 2
    assert sorted(outputs[-1]) == ["a", "b", "c"] and cuda.current is cuda.default


def test_the_fake_holds_side_streams_to_the_capture_rules(cuda: FakeCuda) -> None:
    """What makes the test above mean something: a fork not joined back, or work on a stream outside the capture,
    fails here as it would on a GPU."""
    side, fork = torch.cuda.Stream(), torch.cuda.Event()

    def unjoined() -> None:
        fork.record()
        side.wait_event(fork)
        with torch.cuda.stream(side):
            cuda.launch(0.1)

    with pytest.raises(CaptureError, match=f"^{UNJOINED}$"):
        capture(unjoined, FakeStream())
    assert cuda.current is cuda.default

    def escaped() -> None:
        with torch.cuda.stream(torch.cuda.Stream()):
            cuda.launch(0.1)

    with pytest.raises(AssertionError, match="outside the capture"):
        capture(escaped, FakeStream())


def test_a_failed_capture_names_the_op_and_restores_the_callers_stream(cuda: FakeCuda) -> None:
    def stage() -> None:
        if cuda.capturing is not None:
            raise RuntimeError(NOT_CAPTURABLE + "\nCUDA kernel errors might be asynchronously reported")
        cuda.launch(0.5)

    with pytest.raises(CaptureError, match=f"^{NOT_CAPTURABLE}$"):
        graph_samples_ms(stage, FakeStream(), warmup=1, repeat=3, copies=STAGE_COPIES)
    assert cuda.current is cuda.default and cuda.replays == 0
    assert cuda.graphs[0].resets == 1


def test_running_out_of_memory_in_a_capture_is_not_a_capture_failure(cuda: FakeCuda) -> None:
    def stage() -> None:
        if cuda.capturing is not None:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(torch.cuda.OutOfMemoryError):
        capture(stage, FakeStream())
    assert cuda.current is cuda.default


def test_captures_from_two_threads_take_turns(cuda: FakeCuda) -> None:
    """torch.cuda.graph empties the allocator's cache on entry, which fails while another capture is underway: two
    runners of a model served from two threads must not capture at once."""
    first_inside, errors = threading.Event(), []

    def slow() -> None:
        cuda.launch(0.1)
        if cuda.capturing is not None:
            first_inside.set()
            time.sleep(0.2)  # still capturing when the second thread asks for its capture

    def run(fn: Callable[[], None]) -> None:
        try:
            capture(fn, FakeStream())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    first = threading.Thread(target=run, args=(slow,))
    first.start()
    assert first_inside.wait(5)
    run(lambda: None)
    first.join()
    assert not errors and [graph.captured for graph in cuda.graphs] == [True, True]


def test_a_dropped_runner_is_freed_at_once_with_its_graphs(cuda: FakeCuda) -> None:
    """The captured forward must not hold the runner: a cycle would keep its graphs' memory pools until a full
    garbage collection, which torch.cuda.graph does not run by default."""
    cpu = Program.from_imported(import_module(tiny(), torch.randn(1, *Tiny.input_shape)))
    program = Program(cpu.graph, cpu.fns, torch.device("cuda", 0))
    runner = ScheduleRunner(program, make_schedule(program.graph, BUILDERS["ios_like"], 2), "cuda:0", cuda_graph=True)
    assert runner.captured is not None
    dropped = weakref.ref(runner)
    gc.disable()
    try:
        del runner
        assert dropped() is None
    finally:
        gc.enable()


def test_bad_counts_are_refused_before_anything_runs(cuda: FakeCuda) -> None:
    for warmup, repeat, copies in ((0, 0, 8), (-1, 3, 8), (1, 3, 0)):
        with pytest.raises(ValueError):
            graph_samples_ms(lambda: cuda.launch(1.0), FakeStream(), warmup, repeat, copies)
    assert cuda.clock_ms == 0.0 and not cuda.graphs


def test_time_stage_on_a_gpu_captures_with_the_graph_protocol(cuda: FakeCuda) -> None:
    timing = time_stage(lambda: cuda.launch(0.25), "cuda", stream=FakeStream())
    warmup, repeat = DEFAULT_PROTOCOL["graph"]
    assert (timing.warmup, timing.repeat, timing.samples, timing.uncaptured) == (warmup, repeat, repeat, None)
    assert timing.median_ms == pytest.approx(0.25 + REPLAY_START_MS / STAGE_COPIES)
    assert cuda.replays == warmup + repeat


def test_time_stage_times_an_uncapturable_stage_call_by_call_and_says_why(cuda: FakeCuda) -> None:
    def stage() -> None:
        if cuda.capturing is not None:
            raise RuntimeError(NOT_CAPTURABLE)
        cuda.launch(0.25)

    timing = time_stage(stage, "cuda", warmup=1, repeat=5, stream=FakeStream())
    assert timing.uncaptured == NOT_CAPTURABLE
    assert (timing.warmup, timing.repeat) == (1, 5) and cuda.replays == 0
    assert timing.median_ms == pytest.approx(0.25)  # events around each eager call


def test_after_an_uncapturable_stage_the_next_stage_is_captured_and_every_pool_released(cuda: FakeCuda) -> None:
    # torch leaves a failed capture's pool "underway" in the caching allocator; unless it is ended, every later
    # torch.cuda.graph fails on entry, and every later stage would be timed uncaptured without saying why
    def uncapturable() -> None:
        if cuda.capturing is not None:
            raise RuntimeError(NOT_CAPTURABLE)
        cuda.launch(0.25)

    stream = FakeStream()
    assert time_stage(uncapturable, "cuda", warmup=1, repeat=2, stream=stream).uncaptured == NOT_CAPTURABLE
    assert not cuda.pools_underway and len(cuda.released_pools) == 1
    timing = time_stage(lambda: cuda.launch(0.5), "cuda", warmup=1, repeat=2, stream=stream)
    assert timing.uncaptured is None and timing.median_ms == pytest.approx(0.5 + REPLAY_START_MS / STAGE_COPIES)
    assert not cuda.pools_underway and len(set(cuda.released_pools)) == len(cuda.graphs) == 2


def test_a_forward_captured_in_inference_mode_also_serves_calls_outside_it(cuda: FakeCuda) -> None:
    # the profile step and users: a first call under inference_mode, later ones under no_grad or plain
    seen: list[torch.Tensor] = []  # what the forward was called with: the last one is the graph's static input

    def forward(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x * 2

    captured = CapturedForward(forward, torch.device("cuda", 0))
    with torch.inference_mode():
        captured(torch.ones(3))
    with torch.no_grad():
        captured(torch.full((3,), 2.0))
    assert torch.equal(seen[-1], torch.full((3,), 2.0))  # copied into the static input the graph reads
    captured(torch.full((3,), 3.0))
    assert torch.equal(seen[-1], torch.full((3,), 3.0)) and cuda.replays == 3  # every call replays


def test_time_stage_on_a_cpu_is_call_by_call_and_primed() -> None:
    order: list[str] = []
    timing = time_stage(lambda: order.append("stage"), "cpu", warmup=1, repeat=2, before=lambda: order.append("primer"))
    assert order == ["primer", "stage"] * 3 and timing.uncaptured is None and timing.repeat == 2


def test_an_uncaptured_row_says_so_and_keeps_the_devices_fingerprint(small_graph: Graph) -> None:
    stage = Stage("concurrent", (("b1",),))
    keys = StageKeys(small_graph)
    job = MeasureJob(keys.key(stage), stage, keys.describe_json(stage), small_graph,
                     ModelSource(small_graph.name, small_graph.input_shape), 1)
    identity = local_identity("cuda", "f" * 24, {"kind": "gpu", "timing": gpu_protocol()}, "measured")
    captured = make_row(job, Timing.of_samples([1.0, 2.0], warmup=1), identity)
    uncaptured = make_row(job, Timing.of_samples([1.0, 2.0], warmup=1, uncaptured=NOT_CAPTURABLE), identity)
    assert json.loads(captured["device_info"]) == {"kind": "gpu", "timing": gpu_protocol()}
    assert json.loads(uncaptured["device_info"]) == {"kind": "gpu", "timing": gpu_protocol(),
                                                     "uncaptured": NOT_CAPTURABLE}
    assert captured["device_fingerprint"] == uncaptured["device_fingerprint"] == identity.fingerprint


def test_fingerprints_name_their_timing_protocol() -> None:
    assert gpu_protocol() == (f"graph-batch{GRAPH_STAGES}-x2-2" if profiler_timing.BATCHED_GRAPHS else
                          f"graph-x{STAGE_COPIES}-2")
    assert cpu_info()["timing"] == CPU_TIMING != gpu_protocol()


def test_a_forward_that_cannot_be_captured_runs_uncaptured_with_one_warning(cuda: FakeCuda) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        if cuda.capturing is not None:
            raise RuntimeError(NOT_CAPTURABLE)
        return x + 1

    captured = CapturedForward(forward, torch.device("cuda", 0))
    with pytest.warns(UserWarning, match="cannot be captured into a CUDA graph"):
        assert torch.equal(captured(torch.zeros(2)), torch.ones(2))
    assert torch.equal(captured(torch.ones(2)), torch.full((2,), 2.0))  # no second capture, no second warning
    assert len(cuda.graphs) == 1 and captured_shapes(captured) == () and cuda.current is cuda.default


def test_a_captured_forward_replays_from_its_static_input(cuda: FakeCuda) -> None:
    forward_calls: list[bool] = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        forward_calls.append(cuda.capturing is not None)
        cuda.launch(1.0)
        return x * 2

    captured = CapturedForward(forward, torch.device("cuda", 0), warmup=2)
    first = captured(torch.ones(3))
    captured(torch.ones(3))
    assert forward_calls == [False, False, True] and cuda.replays == 2
    assert captured_shapes(captured) == (((3,), torch.float32),) and torch.equal(first, torch.full((3,), 2.0))


def test_a_batch_of_stages_is_timed_in_one_graph_each_between_events_recorded_inside_it(cuda: FakeCuda) -> None:
    launched = {"a": 0.1, "b": 0.2, "c": 0.3}
    stages = [lambda name=name: cuda.launch(launched[name]) for name in launched]
    samples = graph_batch_samples_ms(stages, FakeStream(), warmup=1, most=10, copies=2)
    assert len(cuda.graphs) == 1 and cuda.graphs[0].resets == 1  # one graph for all, released
    assert samples == [[pytest.approx(ms)] * LEAST_REPLAYS for ms in launched.values()]  # steady: stops early
    assert cuda.replays == 1 + LEAST_REPLAYS and cuda.spins == [BACKLOG_CYCLES] * LEAST_REPLAYS


def test_replays_go_on_until_every_stage_is_tight_or_the_most_replays(cuda: FakeCuda) -> None:
    stages = [lambda: cuda.launch(0.1), lambda: cuda.launch(0.2)]
    scales = iter([1.3, 0.8] + [1.0] * 30)  # two replays far off, then a steady device
    cuda.replay_scale = lambda: next(scales)
    samples = graph_batch_samples_ms(stages, FakeStream(), warmup=0, most=20, copies=1)
    # on until the two lie outside p10-p90 of what was timed, then stopped: a burst costs replays, not the median
    assert LEAST_REPLAYS < cuda.replays < 20 and len(samples[0]) == cuda.replays
    alternating = iter([1.0, 1.3] * 20)
    cuda.replay_scale = lambda: next(alternating)
    assert len(graph_batch_samples_ms(stages, FakeStream(), warmup=0, most=5, copies=1)[0]) == 5  # never tight
    with pytest.raises(ValueError, match="most >= 1"):
        graph_batch_samples_ms(stages, FakeStream(), warmup=0, most=0, copies=1)


def test_the_profiler_times_a_gpus_stages_batched_and_a_batch_it_cannot_capture_stage_by_stage(
        cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiler_timing, "BATCHED_GRAPHS", True)
    stages = [lambda: cuda.launch(0.25)] * (GRAPH_STAGES + 4)
    timings = profiler_timing.time_stages(stages, "cuda", warmup=1, repeat=5, stream=FakeStream())
    assert len(cuda.graphs) == 2 and [t.median_ms for t in timings] == [pytest.approx(0.25)] * len(stages)
    assert all(t.uncaptured is None and t.samples == LEAST_REPLAYS for t in timings)

    def uncapturable() -> None:
        if cuda.capturing is not None:
            raise RuntimeError(NOT_CAPTURABLE)
        cuda.launch(0.5)

    cuda.graphs.clear()
    timings = profiler_timing.time_stages([lambda: cuda.launch(0.25), uncapturable], "cuda", warmup=1, repeat=3,
                                          stream=FakeStream())
    assert [t.uncaptured for t in timings] == [None, NOT_CAPTURABLE]  # the other stage still in a graph
    assert timings[0].median_ms == pytest.approx(0.25) and timings[1].median_ms == pytest.approx(0.5)
    assert not cuda.pools_underway  # every failed capture's pool handed back
