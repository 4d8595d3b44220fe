"""The Ray a search runs on: a local one started once and kept, a cluster joined and left, the caller's own used
as it is; a stop while Ray starts, held until it has. A fake ``ray`` module records what the session asks of Ray
(and one test starts the real one, in a process of its own)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import Iterator

import pytest

from ios_ray import interrupts
from ios_ray.app.search import ray_session as session_module
from ios_ray.app.search.ray_session import ray_session
from ios_ray.errors import UserError
from ios_ray.interrupts import Terminated, stop_on_sigterm
from tests.helpers import HANG_S


def ray_private() -> SimpleNamespace:
    """What Ray's start reads of ``ray._private``: how it installs its SIGTERM handler, whether its C++ crash handler
    is left out, and how it starts its processes."""
    utils = SimpleNamespace(set_sigterm_handler=functools.partial(signal.signal, signal.SIGTERM),
                            detect_fate_sharing_support=lambda: True)
    return SimpleNamespace(utils=utils, ray_constants=SimpleNamespace(RAY_DISABLE_FAILURE_SIGNAL_HANDLER=False),
                           services=SimpleNamespace(ConsolePopen=subprocess.Popen))


class FakeRay:
    """Enough of ``ray`` for the session: init, shutdown, is_initialized and the GCS address, with a call log; its
    init installs a SIGTERM handler through ``_private`` first, as Ray's does."""

    def __init__(self, reachable: bool = True) -> None:
        self.calls: list[str] = []
        self.gcs: str | None = None
        self.reachable = reachable
        self.started = 0
        self._private = ray_private()

    def is_initialized(self) -> bool:
        return self.gcs is not None

    def init(self, address: str, **_: object) -> None:
        self._private.utils.set_sigterm_handler(lambda signum, frame: sys.exit(signum))
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
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRay]:
    """A fake ``ray`` in place of the real one, no local Ray kept from before, the SIGTERM handler put back after."""
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(session_module, "_kept_address", None)
    before = signal.getsignal(signal.SIGTERM)
    yield fake
    signal.signal(signal.SIGTERM, before)


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


@pytest.fixture
def sigterm_stops() -> Iterator[None]:
    """A SIGTERM raises Terminated, as the command line makes it (the fake_ray fixture puts the handler back)."""
    stop_on_sigterm()
    yield
    interrupts._terminated.clear()


def test_a_sigterm_while_ray_starts_is_held_and_then_stops_the_search(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch, sigterm_stops: None,
) -> None:
    """Ray's start installs a SIGTERM handler that calls sys.exit (exit 15, no word said) and its C++ crash handler
    (a stack dump): a SIGTERM then, as ``timeout`` sends it to the process group, must stop the search as one after
    the start does."""
    init, seen = fake_ray.init, []

    def init_then_sigterm(address: str, **options: object) -> None:
        init(address, **options)
        seen.extend([fake_ray._private.ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER,
                     fake_ray._private.services.ConsolePopen.keywords])
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(fake_ray, "init", init_then_sigterm)
    with pytest.raises(Terminated):
        with ray_session(None):
            pytest.fail("the search ran on")
    # while Ray started, its crash handler was left out and its processes started in a session of their own
    assert fake_ray.calls == ["init local", "shutdown"] and seen == [True, {"start_new_session": True}]
    assert signal.getsignal(signal.SIGTERM) is interrupts._terminate
    private = fake_ray._private  # put back for anything else that starts Ray's processes
    assert private.ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER is False
    assert private.services.ConsolePopen is subprocess.Popen


def test_a_local_start_that_fails_after_a_sigterm_is_not_tried_again(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch, sigterm_stops: None,
) -> None:
    """A SIGTERM to the process group ends Ray's own processes too, and the start fails: it stops the search."""
    tries = []

    def failing_init(address: str, **options: object) -> None:
        tries.append(address)
        os.kill(os.getpid(), signal.SIGTERM)
        raise Exception("The current node timed out during startup.")

    monkeypatch.setattr(fake_ray, "init", failing_init)
    with pytest.raises(Terminated):
        with ray_session(None):
            pytest.fail("the search ran on")
    assert tries == ["local"] and not fake_ray.is_initialized()


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
        _private = SimpleNamespace(
            utils=SimpleNamespace(set_sigterm_handler=print, detect_fate_sharing_support=lambda: True),
            ray_constants=SimpleNamespace(RAY_DISABLE_FAILURE_SIGNAL_HANDLER=False),
            services=SimpleNamespace(ConsolePopen=subprocess.Popen))
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
    ran = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_RAY_STARTS], capture_output=True, text=True,
                         timeout=HANG_S)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["shutdown", "interrupted"] and "Exception ignored" not in ran.stderr, ran.stderr


#: A SIGTERM to the whole process group (as ``timeout`` sends it) while Ray's driver connects to the local Ray it
#: started: Ray's own handlers (``sys.exit``, and its C++ crash handler's stack dump) and Ray's processes dying
#: would each end the search otherwise than with its one line.
SIGTERM_WHILE_RAY_STARTS = textwrap.dedent(
    """
    import os, signal
    import ray
    import ray._private.worker as worker
    from ios_ray.app.search.ray_session import ray_session
    from ios_ray.interrupts import Terminated, stop_on_sigterm

    connect = worker.connect

    def connect_then_sigterm(*args, **kwargs):
        connected = connect(*args, **kwargs)
        processes = [info.process for infos in worker._global_node.all_processes.values() for info in infos]
        print("ray apart", all(os.getpgid(process.pid) != os.getpgrp() for process in processes))
        os.killpg(0, signal.SIGTERM)
        return connected

    worker.connect = connect_then_sigterm
    stop_on_sigterm()
    try:
        with ray_session(None):
            print("searched on")
    except Terminated:
        print("terminated, ray up", ray.is_initialized())
    """
)


@pytest.mark.slow
def test_a_sigterm_to_the_process_group_while_ray_starts_stops_the_search_and_spares_rays_processes() -> None:
    ran = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_RAY_STARTS], capture_output=True, text=True,
                         timeout=HANG_S, start_new_session=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["ray apart True", "terminated, ray up False"], ran.stdout + ran.stderr
    assert "SIGTERM received" not in ran.stderr, ran.stderr
