"""Ray for a search: joined at an address, or started locally in this process and kept for the searches after it.

Starting a local Ray takes seconds (its processes and workers), and a notebook runs many searches in one process,
so the local Ray that a search starts stays up until the process exits (Ray shuts it down then) or the caller runs
``ray.shutdown()``; the next search without an address uses it. A search that fails (or is interrupted) shuts the
kept Ray down, with whatever it left behind (tasks still running, errors nobody will read), and the next search
starts afresh. A local start that fails (Ray's own start-up deadline, missed on a loaded machine) is tried once
more, then is one sentence. A cluster joined at an address is left when the search ends. A Ray the caller connected
to before the search is used as it is, whatever the address: the caller chose it.

Stopping a search is this process's to do, whenever the stop comes (:func:`_started_apart`): a Ctrl-C or a SIGTERM
while Ray starts is held until it has started, then stops the search (and Ray) as any other does; Ray's start is
kept from replacing the process's SIGTERM handler (the command line's stops a search as Ctrl-C does); and the local
Ray's processes run in a session of their own, so that a signal to the search's process group (a terminal's Ctrl-C,
``timeout``'s or systemd's SIGTERM) reaches the search alone, which then shuts them down.
"""

from __future__ import annotations

import functools
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Sequence

from ios_ray.errors import UserError, first_line
from ios_ray.interrupts import ctrl_c_held

#: How many times a search tries to start a local Ray before it gives up.
LOCAL_START_TRIES = 2

if TYPE_CHECKING:
    from ios_ray.profiler.cluster import Node

#: The GCS address of the local Ray a search started and keeps (None: none).
_kept_address: str | None = None
#: The GCS address of the cluster the running search joined at its address (None: none).
_joined_address: str | None = None


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Ray for the duration of a search: a local one without ``address`` (started once, then kept), else joined."""
    global _joined_address
    import ray

    if ray.is_initialized() and ray.get_runtime_context().gcs_address != _kept_address:
        yield  # the caller's own Ray
        return
    if ray.is_initialized() and address is not None:
        _forget(ray)  # ours and local, but this search joins a cluster
    try:
        if not ray.is_initialized():
            # Ray's start forks processes, and a Ctrl-C inside a fork handler would be lost: held until it has ended
            with ctrl_c_held() as held, _started_apart(ray):
                _start(ray, address, stopped=lambda: bool(held))
        yield
    except BaseException:
        if address is None:
            _forget(ray)
        raise
    finally:
        if address is not None:
            ray.shutdown()
            _joined_address = None


def joined(address: str | None) -> ContextManager[None]:
    """For a search at an address, the cluster there, joined now (and left when the search ends); else nothing yet
    (a local Ray starts only where something is measured)."""
    return ray_session(address) if address is not None else nullcontext()


@dataclass(frozen=True)
class ClusterInUse:
    """The Ray a search runs on: in words (``where``) and its live nodes (this machine, foreseen, before a local
    Ray starts)."""

    where: str
    nodes: Sequence[Node]

    def summary(self) -> str:
        """One line: where, how many nodes, CPUs and GPUs, and the devices they offer."""
        from ios_ray.profiler.cluster import describe_nodes, offered_labels

        offered = ", ".join(offered_labels(self.nodes))
        return f"cluster: {self.where}: {describe_nodes(self.nodes)}; devices offered: {offered}"


def cluster_in_use(address: str | None) -> ClusterInUse:
    """The Ray a search at ``address`` runs on (one at an address must be joined already, :func:`joined`)."""
    from ios_ray.profiler.cluster import live_nodes, local_node

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return ClusterInUse("this machine's local Ray (no address given)", [local_node()])
    gcs = ray.get_runtime_context().gcs_address
    if gcs == _kept_address:
        where = f"the local Ray at {gcs} (started by an earlier search of this process)"
    elif gcs == _joined_address:
        where = f"the Ray cluster at {gcs}" + ("" if address == gcs else f" (address {address})")
    else:
        where = f"the Ray at {gcs} (connected before the search, so used whatever the address)"
    return ClusterInUse(where, live_nodes())


def runs_here(address: str | None) -> bool:
    """Whether a search at ``address`` measures on this machine only: no address, and the Ray it will use (a local
    one it starts, or the caller's own) has no node on another machine."""
    if address is not None:
        return False
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return True
    here = ray.util.get_node_ip_address()
    return all(node["NodeManagerAddress"] == here for node in ray.nodes() if node["Alive"])


@contextmanager
def _started_apart(ray: Any) -> Iterator[None]:
    """Ray's start, in this block, leaves stopping the search to this process. By default it makes a SIGTERM call
    ``sys.exit`` (which unwinds a search halfway, or, raised inside a fork handler, is lost and the search runs on),
    then installs its C++ crash handler for SIGTERM too (a stack dump, then an abort), and it starts its processes in
    this process's group, where a SIGTERM to the group (as ``timeout`` and systemd send it) ends them halfway through
    the start (the driver then waits a minute for them) or halfway through the search. Here none of that: the
    handlers are not installed (the crash handler, installed once as Ray's driver connects, not for good) and the
    processes start in a session of their own where the kernel ends them with this process should it be killed
    (Ray's fate sharing, Linux's parent-death signal; elsewhere Ray kills its process group from a reaper, so they stay
    in it). Ray reads these settings of ``ray._private`` (as Ray 2.60 names them) while it starts; they are put back
    after."""
    utils, constants, services = ray._private.utils, ray._private.ray_constants, ray._private.services
    install, no_crash_handler, popen = (utils.set_sigterm_handler, constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER,
                                        services.ConsolePopen)
    utils.set_sigterm_handler = lambda handler: None
    constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    if utils.detect_fate_sharing_support():
        services.ConsolePopen = functools.partial(popen, start_new_session=True)
    try:
        yield
    finally:
        utils.set_sigterm_handler, constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = install, no_crash_handler
        services.ConsolePopen = popen


def _start(ray: Any, address: str | None, stopped: Callable[[], bool]) -> None:
    """Start a local Ray (and keep it) without ``address``, else join the cluster there; ``stopped`` says whether a
    stop (Ctrl-C, SIGTERM) arrived meanwhile."""
    global _kept_address, _joined_address
    if address is None:
        _start_local(ray, stopped)
        _kept_address = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
        return
    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        _joined_address = ray.get_runtime_context().gcs_address
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        raise UserError(f"cannot reach a Ray cluster at {address!r}: {first_line(exc)}") from None


def _start_local(ray: Any, stopped: Callable[[], bool], tries: int = LOCAL_START_TRIES) -> None:
    """Start Ray on this machine, trying again once where it fails: on a loaded machine, and beside another search
    starting its own at the same moment, its processes can miss their start-up deadline (Ray raises a bare
    ``Exception``: "The current node timed out during startup"). UserError where every try failed; where a stop
    arrived meanwhile (a SIGTERM to the process group may be what ended Ray's processes), no more tries: the caller
    delivers the stop."""
    for attempt in range(1, tries + 1):
        try:
            ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR")
            return
        except Exception as exc:  # noqa: BLE001 - Ray's start fails in many kinds, the time-out a bare Exception
            ray.shutdown()  # whatever the failed start left running
            if stopped():
                return
            if attempt == tries:
                raise UserError(f"Ray did not start on this machine in {tries} tries ({first_line(exc).rstrip('.')})"
                                "; it starts slowly on a loaded machine: run the search again, or start Ray once "
                                "(ray start --head) and search with address='auto' (--address auto).") from exc


def _forget(ray: Any) -> None:
    """Shut down the local Ray a search kept."""
    global _kept_address
    ray.shutdown()
    _kept_address = None
