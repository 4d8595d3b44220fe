"""Which Ray nodes offer which device labels (the live ones, or this machine as a local Ray would see it before it
starts), what to do about a label none offers, and where each label's actors go.

Placement rules (one actor per device unit):

* ``cpu``: one actor per node with CPUs, holding all of that node's CPUs (less one per GPU actor of the same
  pool on the node), so two CPU measurements never share cores.
* ``cuda`` / ``cuda:<i>``: the driver's node, one actor per GPU (``cuda``) or one on GPU ``i`` (it holds one Ray
  GPU, but Ray leaves ``CUDA_VISIBLE_DEVICES`` alone so that index ``i`` means the node's GPU ``i``).
* a GPU label: one actor per GPU of that model (``num_gpus=1`` plus the label's resource), pinned to its node.
* ``sim:<gpu>``: where some node offers that GPU's resource, one actor per unit of it, pinned to that node
  (``num_gpus=0``); otherwise ``sim_actors`` free-floating actors. Sim actors take no CPUs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ios_ray.devices import GPU_MODELS, SIM_GPUS, DeviceSpec
from ios_ray.vocabulary import DEFAULT_SIM_ACTORS, SIM_PREFIX, is_simulated
from ios_ray.errors import DeviceUnavailable

#: A fraction of a resource that Ray counts once per node (``accelerator_type:*``), requested per actor.
NODE_LABEL_SHARE = 0.001
#: Tells Ray not to narrow ``CUDA_VISIBLE_DEVICES`` to the GPU it assigned (for ``cuda:<i>``).
KEEP_ALL_GPUS = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}


@dataclass(frozen=True)
class Node:
    """A live Ray node: its id, total resources, and whether the driver runs on it."""

    node_id: str
    resources: Mapping[str, float]
    is_driver: bool = False

    def count(self, resource: str) -> int:
        """How many whole units of a resource the node has."""
        return int(self.resources.get(resource, 0))


@dataclass(frozen=True)
class Placement:
    """One actor to start: its device label, node (None: anywhere), Ray resources and environment variables."""

    label: str
    node_id: str | None
    num_cpus: float = 0
    num_gpus: float = 0
    resources: Mapping[str, float] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``ActorClass.options``."""
        options: dict[str, Any] = {
            "num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "resources": dict(self.resources),
        }
        if self.node_id is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        if self.env:
            options["runtime_env"] = {"env_vars": dict(self.env)}
        return options


def live_nodes() -> list[Node]:
    """The cluster's live nodes, from ``ray.nodes()``."""
    driver = ray.get_runtime_context().get_node_id()
    return [
        Node(n["NodeID"], dict(n.get("Resources", {})), n["NodeID"] == driver)
        for n in ray.nodes()
        if n.get("Alive")
    ]


def offered_labels(nodes: Sequence[Node]) -> list[str]:
    """The labels some node offers, as the user would type them (``sim:*``: every sim GPU)."""
    labels = {"sim:*"}
    for node in nodes:
        if node.count("CPU"):
            labels.add("cpu")
        if node.is_driver and node.count("GPU"):
            labels.add("cuda")
        labels.update(g for g in GPU_MODELS if _gpu_units(node, g))
    return sorted(labels, key=lambda label: (label not in ("cpu", "cuda"), is_simulated(label), label))


def check_offered(specs: Sequence[DeviceSpec], nodes: Sequence[Node], where: str = "this cluster") -> None:
    """Raise DeviceUnavailable for the first label no node offers: one sentence naming what ``where`` (the cluster, in
    words) does offer and what to do instead."""
    for spec in specs:
        if not plan(spec, nodes, sim_actors=1):
            raise DeviceUnavailable(f"no node offers device {spec.label!r}: {where} offers "
                                    f"{', '.join(offered_labels(nodes))}; {_next_step(spec, nodes)}.")


def _next_step(spec: DeviceSpec, nodes: Sequence[Node]) -> str:
    """What to do about a label no node offers, in the words of the caller's options."""
    join = "join a cluster that has one with --address (address= in Python; cluster.yaml starts one)"
    if spec.kind == "gpu" and spec.gpu is not None:
        model = GPU_MODELS[spec.gpu]
        unusable = [n for n in nodes if any(n.resources.get(r) for r in model.resources) and not n.count("GPU")]
        simulate = f"search {SIM_PREFIX}{spec.gpu} to simulate it" if spec.gpu in SIM_GPUS else "search cpu"
        if unusable:
            return (f"a node advertises {model.custom_resource} but gives Ray no GPU to measure it on, so start that "
                    f"node with --num-gpus, or {simulate}")
        return f"{simulate}, or {join}"
    if spec.kind == "cuda":
        driver = next((n for n in nodes if n.is_driver), None)
        gpus = driver.count("GPU") if driver is not None else 0
        if gpus:
            return f"this machine has GPUs cuda:0 to cuda:{gpus - 1}, so name one of those"
        return "search cpu or a sim: device here, or run the search on a machine with a GPU"
    return "add a node with CPUs to the cluster"


def describe_nodes(nodes: Sequence[Node]) -> str:
    """The nodes in a few words: ``2 nodes, 10 CPUs, 4 GPUs``."""
    cpus = sum(n.count("CPU") for n in nodes)
    gpus = sum(n.count("GPU") for n in nodes)
    return (f"{len(nodes)} node{'s' * (len(nodes) != 1)}, {cpus} CPU{'s' * (cpus != 1)}, "
            f"{f'{gpus} GPU' + 's' * (gpus != 1) if gpus else 'no GPU'}")


def local_node() -> Node:
    """This machine as the one node of a local Ray started here would be (before starting it): the resources Ray
    itself resolves for a new head node (CPUs, the GPUs it detects with their ``accelerator_type``, resources set
    in ``RAY_OVERRIDE_RESOURCES``), so that a search can refuse a device this machine lacks before Ray starts."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        resources = ResourceAndLabelSpec().resolve(is_head=True).to_resource_dict()
    except (ImportError, AttributeError, TypeError):  # another Ray than the pinned one: count what torch sees
        import os

        import torch

        resources = {"CPU": os.cpu_count() or 1, "GPU": torch.cuda.device_count()}
    return Node("local", resources, is_driver=True)


def plan(spec: DeviceSpec, nodes: Sequence[Node], sim_actors: int = DEFAULT_SIM_ACTORS) -> list[Placement]:
    """Where the actors of one label go (empty when no node offers it)."""
    if spec.kind == "cpu":
        return [Placement("cpu", n.node_id, num_cpus=n.count("CPU")) for n in nodes if n.count("CPU")]
    if spec.kind == "cuda":
        return _cuda_placements(spec, nodes)
    if spec.kind == "gpu":
        return [
            Placement(spec.label, n.node_id, num_cpus=1, num_gpus=1, resources=_gpu_request(n, spec.gpu or ""))
            for n in nodes
            for _ in range(_gpu_units(n, spec.gpu or ""))
        ]
    return _sim_placements(spec, nodes, sim_actors)


def plan_all(specs: Sequence[DeviceSpec], nodes: Sequence[Node],
             sim_actors: int = DEFAULT_SIM_ACTORS) -> list[Placement]:
    """Placements of every label, with CPU actors leaving one core per GPU actor on their node."""
    placements = [p for spec in specs for p in plan(spec, nodes, sim_actors)]
    gpu_actors = Counter(p.node_id for p in placements if p.num_gpus)
    return [
        replace(p, num_cpus=max(1, p.num_cpus - gpu_actors[p.node_id])) if p.label == "cpu" else p
        for p in placements
    ]


def _cuda_placements(spec: DeviceSpec, nodes: Sequence[Node]) -> list[Placement]:
    """``cuda``: one actor per GPU of the driver's node; ``cuda:i``: one, if that node has GPU ``i``."""
    driver = next((n for n in nodes if n.is_driver), None)
    gpus = driver.count("GPU") if driver else 0
    if driver is None or gpus == 0 or (spec.index is not None and spec.index >= gpus):
        return []
    if spec.index is not None:
        return [Placement(spec.label, driver.node_id, num_cpus=1, num_gpus=1, env=KEEP_ALL_GPUS)]
    return [Placement(spec.label, driver.node_id, num_cpus=1, num_gpus=1) for _ in range(gpus)]


def _sim_placements(spec: DeviceSpec, nodes: Sequence[Node], sim_actors: int) -> list[Placement]:
    """Pinned to the nodes offering the sim GPU's resource, else ``sim_actors`` free-floating ones."""
    pinned = [
        Placement(spec.label, n.node_id, resources=request)
        for n in nodes
        for request, units in [_sim_request(n, spec.gpu or "")]
        for _ in range(units)
    ]
    return pinned or [Placement(spec.label, None) for _ in range(sim_actors)]


def _gpu_units(node: Node, gpu: str) -> int:
    """GPUs of this model on a node that a real measurement can use (they must also be Ray GPUs)."""
    model = GPU_MODELS[gpu]
    accelerator, custom = model.resources
    if node.resources.get(accelerator):
        return node.count("GPU")
    return min(node.count(custom), node.count("GPU"))


def _gpu_request(node: Node, gpu: str) -> dict[str, float]:
    """The label resource a real GPU actor asks for on a node (besides ``num_gpus=1``)."""
    accelerator, custom = GPU_MODELS[gpu].resources
    return {accelerator: NODE_LABEL_SHARE} if node.resources.get(accelerator) else {custom: 1}


def _sim_request(node: Node, gpu: str) -> tuple[dict[str, float], int]:
    """(resource request, actor count) for sim actors of a GPU model on one node; count 0 if it lacks it."""
    accelerator, custom = GPU_MODELS[gpu].resources
    if node.count(custom):
        return {custom: 1}, node.count(custom)
    if node.resources.get(accelerator):
        return {accelerator: NODE_LABEL_SHARE}, max(1, node.count("GPU"))
    return {}, 0
