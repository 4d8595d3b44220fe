"""The driver loop: stream batches of stages to every device's actors at once and collect the rows.

Each device's jobs are cut into batches and handed to its actors with back-pressure (at most
``MAX_IN_FLIGHT`` batches per actor). One loop waits on the futures of all devices together. Rows go to
``on_rows`` as each batch finishes, deduplicated by (stage key, batch, dtype) per device, so a stage whose batch
is re-run after an actor died is reported once. A batch whose actor died goes back to the front of its device's
queue; Ray restarts the actor (``max_restarts``), which is given batches again once it is up (while Ray restarts
it, a call fails at once, so it waits :data:`RESTART_POLL_S` between tries), and any actor of the device may take
the batch. An actor is retired once Ray says it is dead for good, or after :data:`RESTART_TIMEOUT_S` of failing.
Ctrl-C stops the loop and returns what was finished; the caller then kills the actors.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

from ios_ray.errors import UserError, first_line
from ios_ray.profiler.jobs import MeasureJob

RowsCallback = Callable[[list[dict[str, Any]]], object]  # what it returns is not read
ProgressCallback = Callable[[str, int, int], None]

#: Batches one actor may hold at once (one running, one queued behind it).
MAX_IN_FLIGHT = 2
#: The most stages sent to an actor in one call.
MAX_STAGES_PER_CALL = 32
#: Aim for at least this many batches per actor, so that the tail of a run stays balanced.
BATCHES_PER_ACTOR = 4
#: Seconds between tries of an actor that Ray is restarting.
RESTART_POLL_S = 0.2
#: Seconds an actor may keep failing (Ray restarting it) before it counts as dead.
RESTART_TIMEOUT_S = 60.0


@dataclass
class MeasureReport:
    """Stages measured per device of how many it was given, batches re-run after an actor died, and what stopped it
    (Ctrl-C)."""

    done: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    rerun: int = 0
    interrupted: KeyboardInterrupt | None = None  # what stopped it: a Ctrl-C, or a SIGTERM (Terminated)

    @property
    def complete(self) -> bool:
        """True when every device measured every stage it was given."""
        return not self.interrupted and all(self.done[d] == t for d, t in self.total.items())


@dataclass
class _Slot:
    """One actor and its bookkeeping in the loop."""

    label: str
    actor: ActorHandle[Any]
    in_flight: int = 0
    alive: bool = True
    failing_since: float | None = None
    paused_until: float = 0.0


class Dispatcher:
    """One run of the driver loop over a fixed set of actors per device."""

    def __init__(
        self,
        actors: Mapping[str, Sequence[ActorHandle[Any]]],
        on_rows: RowsCallback,
        on_progress: ProgressCallback | None = None,
        max_restarts: int = 3,
    ) -> None:
        self.slots = [_Slot(label, actor) for label, handles in actors.items() for actor in handles]
        self.on_rows = on_rows
        self.on_progress = on_progress or (lambda device, done, total: None)
        self.max_restarts = max_restarts
        self.queues: dict[str, deque[list[MeasureJob]]] = {label: deque() for label in actors}
        self.seen: dict[str, set[tuple[str, int, str, str]]] = {label: set() for label in actors}
        self.in_flight: dict[ray.ObjectRef[Any], tuple[_Slot, list[MeasureJob]]] = {}
        self.report = MeasureReport()
        self.dead: list[str] = []

    def run(self, jobs: Mapping[str, Sequence[MeasureJob]], batch_size: int | None = None) -> MeasureReport:
        """Measure every device's jobs; returns early (``interrupted``) on Ctrl-C."""
        unknown = set(jobs) - set(self.queues)
        if unknown:
            raise UserError(f"no actors were started for {', '.join(sorted(unknown))}; add it to the devices.")
        for label, device_jobs in jobs.items():
            self._enqueue(label, device_jobs, batch_size)
        try:
            self._loop()
        except KeyboardInterrupt as stop:
            self.report.interrupted = stop
            return self.report
        self._raise_for_dead_devices()
        return self.report

    def _enqueue(self, label: str, jobs: Sequence[MeasureJob], batch_size: int | None) -> None:
        """Deduplicate a device's jobs, cut them into batches and queue them."""
        unique = list({job.measurement: job for job in jobs}.values())
        actors = sum(1 for s in self.slots if s.label == label)
        size = batch_size or min(MAX_STAGES_PER_CALL, max(1, math.ceil(len(unique) / (actors * BATCHES_PER_ACTOR))))
        self.queues[label].extend(unique[i:i + size] for i in range(0, len(unique), size))
        self.report.total[label] = len(unique)
        self.report.done[label] = 0
        self.on_progress(label, 0, len(unique))

    def _loop(self) -> None:
        """Submit, wait for any finished batch, collect every finished one, repeat until nothing is left."""
        self._submit()
        while self.in_flight or self._waiting():
            if not self.in_flight:
                time.sleep(RESTART_POLL_S)  # every actor with work is being restarted
                self._submit()
                continue
            refs = list(self.in_flight)
            ready, rest = ray.wait(refs, num_returns=1, timeout=RESTART_POLL_S if self._waiting() else None)
            if rest:
                ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in ready:
                self._collect(ref)
            self._submit()

    def _waiting(self) -> bool:
        """Whether a live actor that Ray is restarting has batches of its device queued for it."""
        return any(s.alive and s.paused_until and self.queues[s.label] for s in self.slots)

    def _submit(self) -> None:
        """Give every live actor batches of its device until it holds ``MAX_IN_FLIGHT`` (an actor that Ray is
        restarting, once its pause is over)."""
        now = time.monotonic()
        for slot in self.slots:
            queue = self.queues[slot.label]
            if slot.paused_until > now:
                continue
            slot.paused_until = 0.0
            while slot.alive and slot.in_flight < MAX_IN_FLIGHT and queue:
                batch = queue.popleft()
                self.in_flight[slot.actor.measure.remote(batch)] = (slot, batch)
                slot.in_flight += 1

    def _collect(self, ref: ray.ObjectRef[Any]) -> None:
        """Hand a finished batch's new rows to ``on_rows``; requeue it if its actor died."""
        slot, batch = self.in_flight.pop(ref)
        slot.in_flight -= 1
        try:
            rows = ray.get(ref)
        except RayActorError as error:
            self._actor_failed(slot, batch, error)
            return
        except RayTaskError as error:
            batches = ", ".join(map(str, sorted({job.batch for job in batch})))
            raise task_error(error, f"measuring a stage on {slot.label} at batch {batches}") from None
        slot.failing_since = None
        fresh = [row for row in rows if self._first_time(slot.label, row)]
        if fresh:
            self.on_rows(fresh)
        self.report.done[slot.label] += len(fresh)
        self.on_progress(slot.label, self.report.done[slot.label], self.report.total[slot.label])

    def _first_time(self, label: str, row: Mapping[str, Any]) -> bool:
        """Whether a row's measurement was not reported yet for its device (and remember it)."""
        measurement = (row["stage_key"], row["batch"], row["dtype"], row["device_fingerprint"])
        if measurement in self.seen[label]:
            return False
        self.seen[label].add(measurement)
        return True

    def _actor_failed(self, slot: _Slot, batch: list[MeasureJob], error: RayActorError) -> None:
        """Requeue the batch; pause the actor while Ray restarts it, or retire it once it is dead for good or has
        failed for :data:`RESTART_TIMEOUT_S`."""
        self.queues[slot.label].appendleft(batch)
        self.report.rerun += 1
        now = time.monotonic()
        slot.failing_since = slot.failing_since or now
        if isinstance(error, ActorDiedError) or now - slot.failing_since > RESTART_TIMEOUT_S:
            slot.alive = False
        else:
            slot.paused_until = now + RESTART_POLL_S
        if not any(s.alive for s in self.slots if s.label == slot.label) and slot.label not in self.dead:
            self.dead.append(slot.label)
            self.queues[slot.label].clear()

    def _raise_for_dead_devices(self) -> None:
        """After the loop: one sentence for the devices whose actors all died before their stages were measured."""
        if not self.dead:
            return
        missing = sum(self.report.total[label] - self.report.done[label] for label in self.dead)
        raise UserError(
            f"every actor of {', '.join(map(repr, self.dead))} died (killed or crashed, out of memory perhaps, each "
            f"after up to {self.max_restarts} restarts), leaving {missing} stages "
            "unmeasured; the measured ones were kept, so run the search again to measure the rest."
        )



def task_error(error: RayTaskError, doing: str) -> UserError:
    """What failed inside an actor, as one sentence: its own UserError, or ``doing`` and what went wrong."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, UserError):
        return UserError(str(cause))
    return UserError(f"{doing} failed: {first_line(cause or error)}")
