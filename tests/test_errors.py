"""The typed errors a caller can catch (``ios_ray.ImportRefused``, ``DeviceUnavailable``, ``StoreUnusable``): each
is a ``UserError`` of one sentence, raised where its case is found."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import ios_ray
from ios_ray.devices import parse_device
from ios_ray.frontend import import_model
from ios_ray.profiler.cluster import Node, check_offered
from ios_ray.store import LatencyStore


class _TwoInputs(nn.Module):
    input_shape = (3, 8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class _NoTensor(nn.Module):
    input_shape = (3, 8, 8)

    def forward(self, x: torch.Tensor) -> str:
        return "no tensor"


def _one_sentence(error: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(error.value)
    assert isinstance(error.value, ios_ray.UserError) and "\n" not in text and text.endswith(".")
    return text


@pytest.mark.parametrize("model, said", [
    (_TwoInputs(), "takes 2 inputs"), (_NoTensor(), "the model returned no tensor"),
    (42, "model must be an nn.Module or a model spec string, not a int"),
])
def test_a_model_the_frontend_cannot_import_is_import_refused(model: object, said: str) -> None:
    with pytest.raises(ios_ray.ImportRefused) as refused:
        import_model(model, input_shape=(3, 8, 8))  # type: ignore[arg-type]
    assert said in _one_sentence(refused)


def test_a_device_no_one_knows_or_no_node_offers_is_device_unavailable() -> None:
    with pytest.raises(ios_ray.DeviceUnavailable) as unknown:
        parse_device("tpu")
    assert "unknown device 'tpu'" in _one_sentence(unknown)
    with pytest.raises(ios_ray.DeviceUnavailable) as absent:
        check_offered([parse_device("v100")], [Node("head", {"CPU": 2.0}, is_driver=True)])
    assert "no node offers device 'v100'" in _one_sentence(absent)


def test_a_store_that_cannot_be_used_is_store_unusable(tmp_path: Path) -> None:
    with pytest.raises(ios_ray.StoreUnusable) as folder:
        LatencyStore(tmp_path)
    assert "is a folder, not a latency store file" in _one_sentence(folder)
    with pytest.raises(ios_ray.StoreUnusable) as missing:
        LatencyStore(tmp_path / "missing.duckdb", create=False)
    assert "no latency store at" in _one_sentence(missing)
    garbage = tmp_path / "garbage.duckdb"
    garbage.write_bytes(b"not a store at all" * 100)
    with pytest.raises(ios_ray.StoreUnusable) as unreadable:
        LatencyStore(garbage)
    assert "is not a readable latency store" in _one_sentence(unreadable)
    assert garbage.read_bytes() == b"not a store at all" * 100


def test_the_typed_errors_are_user_errors_exported_at_the_top() -> None:
    for name in ("UserError", "ImportRefused", "DeviceUnavailable", "StoreUnusable"):
        assert name in ios_ray.__all__ and issubclass(getattr(ios_ray, name), ios_ray.UserError)
