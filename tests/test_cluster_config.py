"""cluster.yaml passes Ray's own launcher config validation and advertises one resource per GPU type."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from ios_ray.devices import GPU_MODELS

CONFIG = Path(__file__).resolve().parent.parent / "cluster.yaml"


def _load() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_cluster_yaml_is_valid_for_ray() -> None:
    validate_config(prepare_config(_load()))


def test_validation_would_catch_a_broken_config() -> None:
    broken = copy.deepcopy(_load())
    broken["available_node_types"]["gpu_v100"]["no_such_field"] = 1
    with pytest.raises(Exception):
        validate_config(prepare_config(broken))


@pytest.mark.parametrize("node_type, label", [("gpu_v100", "v100"), ("gpu_k80", "k80"), ("gpu_2080ti", "2080ti")])
def test_each_worker_type_advertises_its_device(node_type: str, label: str) -> None:
    resources = _load()["available_node_types"][node_type]["resources"]
    assert resources.get(GPU_MODELS[label].custom_resource) == 1


def test_setup_installs_the_project() -> None:
    assert any("scripts/setup.sh" in command for command in _load()["setup_commands"])
