"""The README's on-premise cluster recipe, run as written on one machine: a token, a head and one GPU worker started
with ``ray start`` and token authentication, then ``ios-ray search --address`` across both nodes.

The commands are read from the README's block, so the test and the README cannot drift apart. What the test changes,
and why: the head's address (``HEAD:6379`` becomes this machine at a free port, since another Ray may hold 6379
here); ``--temp-dir`` (a folder of its own, so that no other Ray on the machine sees this one as its "current"
cluster); ``--block`` (each ``ray start`` stays in the foreground, so that stopping it stops exactly the processes
it started; ``ray stop`` would stop every Ray on the machine); ``HOME`` (a folder of the test's, where the token is
written); and the search's model, devices and batch (the worker has no real 2080 Ti, so ``sim:2080ti``, whose actors
Ray can place only on the node that advertises ``2080Ti``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from tests.helpers import HANG_S, processes_holding

ROOT = Path(__file__).resolve().parent.parent
#: The seconds a node may take to start on a loaded 2-core machine.
START_S = 180


def recipe() -> list[str]:
    """The commands of the README's on-premise block, comments dropped."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"\*\*On-premise\*\*.*?```bash\n(.*?)```", readme, re.S)
    assert block is not None, "the README has no on-premise recipe"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def cluster_env(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """The environment the recipe runs in (its own HOME) and a short temp dir for Ray's sockets."""
    home = tmp_path / "home"
    home.mkdir()
    temp = Path(tempfile.mkdtemp(prefix="iosr", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    scripts = sysconfig.get_path("scripts")  # where this Python's `ray` command is, first on PATH
    env |= {"HOME": str(home), "PYTHONPATH": str(ROOT), "PATH": os.pathsep.join([scripts, env.get("PATH", "")])}
    yield env, temp
    shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_the_readme_recipe_searches_across_two_nodes(cluster_env: tuple[dict[str, str], Path], tmp_path: Path
                                                     ) -> None:
    env, temp = cluster_env
    port = free_port()
    commands = [line.replace("HEAD:6379", f"127.0.0.1:{port}").replace("--port=6379", f"--port={port}")
                for line in recipe()]
    exports = [line for line in commands if line.startswith("export ")]
    assert exports and all(line == "export RAY_AUTH_MODE=token" for line in exports)
    env["RAY_AUTH_MODE"] = "token"
    [token] = [line for line in commands if line.startswith("ray get-auth-token")]
    [head] = [line for line in commands if line.startswith("ray start --head")]
    worker = next(line for line in commands if line.startswith("ray start --address") and "2080Ti" in line)
    [search] = [line for line in commands if line.startswith("ios-ray search")]

    made = subprocess.run(["bash", "-c", token], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert made.returncode == 0, made.stderr
    assert (Path(env["HOME"]) / ".ray" / "auth_token").is_file()
    nodes: list[subprocess.Popen[str]] = []
    try:
        nodes.append(_start(f"{head} --temp-dir={temp}", env, tmp_path / "head.log"))
        _wait_for(port, nodes[0], tmp_path / "head.log")
        nodes.append(_start(worker, env, tmp_path / "worker.log"))
        _wait_for_nodes(2, port, env, nodes, tmp_path)

        argv = shlex.split(search)
        argv[argv.index("--model") + 1] = "squeezenet"
        argv[argv.index("--devices") + 1] = "sim:2080ti"
        argv[argv.index("--batches") + 1] = "1"
        argv += ["--out", str(tmp_path / "schedules"), "--store", str(tmp_path / "store.duckdb"),
                 "--warmup", "0", "--repeat", "1"]
        searched = subprocess.run([sys.executable, "-m", "ios_ray", *argv[1:]], env=env, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=HANG_S)
        assert searched.returncode == 0, searched.stdout + searched.stderr
        assert re.search(rf"cluster: the Ray cluster at [\d.]+:{port}( \(address 127.0.0.1:{port}\))?: 2 nodes",
                         searched.stdout), searched.stdout
        assert "sim:2080ti batch 1: kept IOS" in searched.stdout
        assert (tmp_path / "schedules" / "squeezenet" / "sim-2080ti" / "bs1.json").is_file()

        # The worker advertises 2080Ti without a GPU: a real 2080 Ti is refused at once, naming that node's fix.
        real = [*argv[1:]]
        real[real.index("--devices") + 1] = "2080ti"
        refused = subprocess.run([sys.executable, "-m", "ios_ray", *real], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=HANG_S)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert "no node offers device '2080ti'" in refused.stderr and "--num-gpus" in refused.stderr
    finally:
        _stop(nodes, temp)


def _start(command: str, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """One ``ray start`` of the recipe, kept in the foreground (``--block``)."""
    with log.open("w") as out:
        return subprocess.Popen(["bash", "-c", f"exec {command} --block"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait_for(port: int, node: subprocess.Popen[str], log: Path) -> None:
    """Until the head listens at its port."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert node.poll() is None, log.read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"the head did not start within {START_S} s:\n{log.read_text()}")


def _wait_for_nodes(count: int, port: int, env: dict[str, str], nodes: list[subprocess.Popen[str]],
                    tmp_path: Path) -> None:
    """Until the cluster has ``count`` live nodes (asked with a driver that authenticates as the recipe says)."""
    ask = (f"import ray; ray.init(address='127.0.0.1:{port}', logging_level='ERROR', log_to_driver=False); "
           "print(sum(n['Alive'] for n in ray.nodes()))")
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        for node, name in zip(nodes, ("head", "worker")):
            assert node.poll() is None, (tmp_path / f"{name}.log").read_text()
        found = subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True, timeout=HANG_S)
        if found.returncode == 0 and found.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(2)
    raise AssertionError(f"the cluster did not reach {count} nodes within {START_S} s")


def _stop(nodes: list[subprocess.Popen[str]], temp: Path) -> None:
    """Stop the nodes this test started (workers first), then any process of theirs still running: those whose
    command line names this test's own temp dir."""
    for node in reversed(nodes):
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=HANG_S)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
    for pid in processes_holding(str(temp), "cmdline"):  # started by this test's nodes
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
