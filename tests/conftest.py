"""Shared fixtures: a local Ray for the session, a fake heterogeneous Ray cluster, and a small Inception-like graph."""

from __future__ import annotations

import signal
from typing import Iterator

import pytest
import ray
from ray.cluster_utils import Cluster

from ios_ray.ir import GRAPH_INPUT, Block, Graph, Unit, Value

OBJECT_STORE_BYTES = 100 * 1024 * 1024
LOCAL_CPUS = 2

#: The fake cluster's worker nodes: custom GPU resources, no real GPUs.
FAKE_GPU_NODES = ({"V100": 2}, {"K80": 2}, {"2080Ti": 1})


def pytest_configure(config: pytest.Config) -> None:
    """Let SIGINT reach the commands the tests start and interrupt: a shell that starts the suite in the background
    hands it SIGINT ignored, and a child started with SIGINT ignored keeps ignoring it."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


#: The slow suite's longest files, longest first (each 45-150 s of tests on CI's two cores, 2026-11-29). CI runs the
#: slow suite with ``--no-loadscope-reorder``, so pytest-xdist hands out files in this order: a long file started
#: last would run alone while the other worker idles. Every other file follows in its usual order.
LONGEST_FIRST = ("test_search_cli.py", "test_readme.py", "test_readme_python.py", "test_gpu_check.py",
                 "test_profiler.py", "test_api.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the tests of :data:`LONGEST_FIRST`'s files first, in its order (a stable sort: nothing else moves)."""
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def _init_local_ray() -> None:
    """Start (or join, if this process already started it) the session's local Ray."""
    ray.init(
        address="local", num_cpus=LOCAL_CPUS, object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False,
        ignore_reinit_error=True,
    )


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """A local Ray instance (2 CPUs) shared by the whole session; shut down at its end."""
    _init_local_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    """A fake heterogeneous cluster (head with 1 CPU, nodes advertising V100, K80 and 2080Ti), connected.

    The session's local Ray, if running, is shut down first and restarted afterwards, so only one is connected.
    """
    was_local = ray.is_initialized()
    ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False},
    )
    for resources in FAKE_GPU_NODES:
        cluster.add_node(num_cpus=0, resources=resources, object_store_memory=OBJECT_STORE_BYTES)
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if was_local:
            _init_local_ray()


def conv_unit(
    unit_id: str, source: str, in_shape: tuple[int, int, int], out_channels: int,
    kernel: tuple[int, int] = (1, 1), padding: tuple[int, int] = (0, 0),
) -> Unit:
    """A stride-1 conv unit (folded batch-norm, ReLU) with realistic attrs, FLOPs and bytes per sample."""
    in_channels, height, width = in_shape
    weights = out_channels * in_channels * kernel[0] * kernel[1]
    return Unit(
        unit_id, "conv", (Value.of(source),), (out_channels, height, width),
        attrs={"in_channels": in_channels, "out_channels": out_channels, "kernel": kernel, "stride": (1, 1),
               "padding": padding, "dilation": (1, 1), "groups": 1, "bias": True, "act": "relu", "pre_act": None},
        flops=2 * weights * height * width,
        bytes=4 * (in_channels + out_channels) * height * width,
        weight_bytes=4 * weights,
    )


def inception_c_graph(channels_7x7: int = 128) -> Graph:
    """An Inception-C-like block at 17x17x768: four 1x1 heads, a 1x7 -> 7x1 chain, and a concat exit."""
    shape = (768, 17, 17)
    c7 = (channels_7x7, 17, 17)
    units = (
        conv_unit("b1", GRAPH_INPUT, shape, 192),
        conv_unit("b7a", GRAPH_INPUT, shape, channels_7x7),
        conv_unit("b7b", "b7a", c7, channels_7x7, (1, 7), (0, 3)),
        conv_unit("b7c", "b7b", c7, 192, (7, 1), (3, 0)),
        conv_unit("bda", GRAPH_INPUT, shape, channels_7x7),
        conv_unit("bp", GRAPH_INPUT, shape, 192),
        Unit("cat", "concat", (Value((("b1",), ("b7c",), ("bda",), ("bp",))),), (192 * 3 + channels_7x7, 17, 17)),
    )
    return Graph("inception_c_like", shape, units, Value.of("cat"), (Block(0, tuple(u.id for u in units)),))


@pytest.fixture(scope="session")
def small_graph() -> Graph:
    """An Inception-C-like block (see :func:`inception_c_graph`)."""
    return inception_c_graph()
