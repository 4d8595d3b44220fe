"""Persistent CPU worker threads that run the groups of concurrent stages at once.

A :class:`ThreadTeam` is a fixed set of threads created once (never per call); each sets its own intra-op
thread count with ``torch.set_num_threads`` inside the thread, so that the groups of a stage share the cores
instead of each asking for all of them. A :class:`WorkerPool` owns one team per group count that a schedule
needs, so every stage with ``g`` groups runs on the same ``g`` threads, each with ``cores // g`` intra-op threads
(at least 1).

Thread-safety assumptions:

* torch ops are thread-safe for inference; the unit callables only read their weights and their inputs.
* Grad mode is thread-local: every worker turns gradients off once, when it starts.
* The intra-op thread count is per thread for torch's OpenMP backend, but ``torch.set_num_threads`` also sets
  process-wide defaults (the count that new threads start with, MKL's count), so a team restores the
  creating thread's count once its workers are set up.
* A team may be called from several threads at once (calls queue up on its workers); the env a stage reads
  must not change while the stage runs (the runner only changes it between stages).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, Mapping, Sequence

import torch

from ios_ray.runtime.program import Env

#: A group of a stage: reads the env, returns its units' outputs.
GroupFn = Callable[[Mapping[str, torch.Tensor]], Env]


def _start_worker(threads: int, ready: threading.Barrier) -> None:
    """Runs once in each new worker: fix its intra-op thread count, turn gradients off, wait for the team."""
    torch.get_num_threads()  # let torch initialise this thread first, or its first op would reset the count
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    ready.wait()


class ThreadTeam:
    """``size`` persistent threads, each running torch with ``threads`` intra-op threads."""

    def __init__(self, size: int, threads: int) -> None:
        self.size = size
        self.threads = threads
        caller_threads = torch.get_num_threads()
        ready = threading.Barrier(size + 1)
        self._executor = ThreadPoolExecutor(size, "ios-ray-worker", _start_worker, (threads, ready))
        for _ in range(size):
            self._executor.submit(lambda: None)
        ready.wait()
        torch.set_num_threads(caller_threads)

    def run(self, groups: Sequence[GroupFn], env: Mapping[str, torch.Tensor]) -> Env:
        """Run each group on a worker at once, wait for all of them, and return their outputs together."""
        futures: list[Future[Env]] = [self._executor.submit(group, env) for group in groups]
        wait(futures)
        outputs: Env = {}
        for future in futures:
            outputs.update(future.result())
        return outputs

    def close(self) -> None:
        """Stop the threads (they also stop when the team is garbage-collected)."""
        self._executor.shutdown(wait=True)


class WorkerPool:
    """The thread teams of one runner, one per group count, each created on first request and then reused."""

    def __init__(self, cores: int | None = None) -> None:
        self.cores = cores or torch.get_num_threads()
        self._teams: dict[int, ThreadTeam] = {}
        self._lock = threading.Lock()

    def team(self, size: int) -> ThreadTeam:
        """The team of ``size`` threads, each with ``cores // size`` intra-op threads (at least 1)."""
        with self._lock:
            team = self._teams.get(size)
            if team is None:
                team = self._teams[size] = ThreadTeam(size, max(1, self.cores // size))
            return team

    def close(self) -> None:
        """Stop every team's threads."""
        with self._lock:
            for team in self._teams.values():
                team.close()
            self._teams.clear()
