"""The Ray a search runs on: a local one started once and kept, a cluster joined and left, the caller's own used
as it is. A fake ``ray`` module records what the session asks of Ray."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from ios_ray.app.search import ray_session as session_module
from ios_ray.app.search.ray_session import ray_session
from ios_ray.errors import UserError
from tests.helpers import HANG_S


class FakeRay:
    """Enough of ``ray`` for the session: init, shutdown, is_initialized and the GCS address, with a call log."""

    def __init__(self, reachable: bool = True) -> None:
        self.calls: list[str] = []
        self.gcs: str | None = None
        self.reachable = reachable
        self.started = 0

    def is_initialized(self) -> bool:
        return self.gcs is not None

    def init(self, address: str, **_: object) -> None:
        if not self.reachable:
            raise ConnectionError(f"could not connect to {address}\nmore detail")
        self.started += 1
        self.gcs = f"10.0.0.{self.started}:6379"
        self.calls.append(f"init {address}")

    def shutdown(self) -> None:
        self.calls.append("shutdown")
        self.gcs = None

    def get_runtime_context(self) -> SimpleNamespace:
        return SimpleNamespace(gcs_address=self.gcs)


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    """A fake ``ray`` in place of the real one, and no local Ray kept from before."""
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(session_module, "_kept_address", None)
    return fake


def test_a_local_ray_is_started_once_and_kept_for_later_searches(fake_ray: FakeRay) -> None:
    for _ in range(3):
        with ray_session(None):
            assert fake_ray.is_initialized()
    assert fake_ray.calls == ["init local"] and fake_ray.is_initialized()


def test_a_cluster_is_joined_for_one_search_and_replaces_the_kept_local_ray(fake_ray: FakeRay) -> None:
    with ray_session(None):
        pass
    with ray_session("ray://head:10001"):
        assert fake_ray.is_initialized()
    assert fake_ray.calls == ["init local", "shutdown", "init ray://head:10001", "shutdown"]
    with ray_session(None):
        pass
    assert fake_ray.calls[-1] == "init local"


def test_the_callers_own_ray_is_used_as_it_is(fake_ray: FakeRay) -> None:
    fake_ray.init("auto")
    for address in (None, "ray://elsewhere:10001"):
        with ray_session(address):
            pass
    assert fake_ray.calls == ["init auto"] and fake_ray.is_initialized()


def test_an_unreachable_cluster_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", FakeRay(reachable=False))
    with pytest.raises(UserError, match=r"^cannot reach a Ray cluster at 'ray://gone:1': could not connect to "
                                        r"ray://gone:1$"):
        with ray_session("ray://gone:1"):
            pass


@pytest.mark.parametrize("failures, started", [(1, True), (2, False)])
def test_a_local_start_that_times_out_is_tried_again_then_is_one_sentence(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch, failures: int, started: bool,
) -> None:
    """Issue 46, item 10: two searches starting at once on a loaded machine; Ray raised its time-out raw."""
    init, left = fake_ray.init, [failures]

    def slow_init(address: str, **options: object) -> None:
        if left[0]:
            left[0] -= 1
            raise Exception("The current node timed out during startup. This could happen because some of the "
                            "raylet failed to startup or the GCS has become overloaded.")
        init(address, **options)

    monkeypatch.setattr(fake_ray, "init", slow_init)
    if started:
        with ray_session(None):
            assert fake_ray.is_initialized()
        assert fake_ray.calls == ["shutdown", "init local"]
        return
    with pytest.raises(UserError, match=r"^Ray did not start on this machine in 2 tries \(The current node timed out "
                                        r"during startup.*overloaded\); .* run the search again"):
        with ray_session(None):
            pass
    assert not fake_ray.is_initialized()


def test_a_failed_search_shuts_the_kept_ray_down_and_the_next_starts_afresh(fake_ray: FakeRay) -> None:
    with ray_session(None):
        pass
    for failure in (UserError("a stage failed"), KeyboardInterrupt()):
        with pytest.raises(type(failure)):
            with ray_session(None):
                raise failure
        assert not fake_ray.is_initialized()
        with ray_session(None):
            pass
    assert fake_ray.calls == ["init local", "shutdown", "init local", "shutdown", "init local"]


def test_a_failed_search_leaves_the_callers_own_ray_up(fake_ray: FakeRay) -> None:
    fake_ray.init("auto")
    with pytest.raises(UserError):
        with ray_session(None):
            raise UserError("a stage failed")
    assert fake_ray.calls == ["init auto"] and fake_ray.is_initialized()


#: Ray's start forks processes (with a preexec_fn, so Python's fork handlers run); Ctrl-C arrives meanwhile and
#: Python raises it inside a fork handler, which prints "Exception ignored" and drops it.
CTRL_C_WHILE_RAY_STARTS = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    from types import SimpleNamespace

    forking = []

    def ctrl_c_now():
        if forking:
            os.kill(os.getpid(), signal.SIGINT)
            len(forking)  # a call: Python raises the pending KeyboardInterrupt here, inside the fork handler

    os.register_at_fork(after_in_parent=ctrl_c_now)

    class Ray:
        gcs = None
        def is_initialized(self): return self.gcs is not None
        def init(self, address, **_):
            forking.append(1)
            subprocess.run(["true"], preexec_fn=lambda: None)
            forking.clear()
            self.gcs = "local:1"
        def shutdown(self): print("shutdown"); self.gcs = None
        def get_runtime_context(self): return SimpleNamespace(gcs_address=self.gcs)

    sys.modules["ray"] = Ray()
    from ios_ray.app.search.ray_session import ray_session
    try:
        with ray_session(None):
            print("searched on")
    except KeyboardInterrupt:
        print("interrupted")
    """
)


def test_a_ctrl_c_while_ray_starts_stops_the_search_instead_of_vanishing() -> None:
    ran = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_RAY_STARTS], capture_output=True, text=True, timeout=HANG_S)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["shutdown", "interrupted"] and "Exception ignored" not in ran.stderr, ran.stderr
