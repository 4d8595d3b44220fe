"""A SIGTERM stops a command as a Ctrl-C does, and is told apart from one however the stop surfaces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from ios_ray import interrupts
from ios_ray.interrupts import Terminated, ctrl_c_held, stop_on_sigterm, was_terminated
from tests.helpers import HANG_S


@pytest.fixture
def sigterm_stops() -> Iterator[None]:
    """SIGTERM raises Terminated for the test; the handler and the record are put back after it."""
    before = signal.getsignal(signal.SIGTERM)
    stop_on_sigterm()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
        interrupts._terminated.clear()


def test_a_ctrl_c_alone_is_no_sigterm(sigterm_stops: None) -> None:
    assert not was_terminated(KeyboardInterrupt())


def test_a_sigterm_raises_terminated_and_a_stop_after_it_still_counts_as_one(sigterm_stops: None) -> None:
    """Killed with its process group, Ray's processes end the driver's calls their own way: the exception that
    reaches the command can be a plain KeyboardInterrupt, which must still exit as a SIGTERM does (143)."""
    with pytest.raises(Terminated) as raised:
        os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler right after the call, in this thread
    assert was_terminated(raised.value)
    assert was_terminated(KeyboardInterrupt())


def test_a_sigterm_inside_a_held_block_is_delivered_after_it(sigterm_stops: None) -> None:
    ended = False
    with pytest.raises(Terminated):
        with ctrl_c_held():
            os.kill(os.getpid(), signal.SIGTERM)
            ended = True
    assert ended and was_terminated(KeyboardInterrupt())


#: The command has ended and its process ends (``_end_now``); Ray's shutdown there takes a second or so, and a Ctrl-C
#: and a SIGTERM arrive meanwhile.
STOPS_WHILE_THE_COMMAND_ENDS = textwrap.dedent(
    """
    import os, signal, sys, time
    from types import SimpleNamespace
    from ios_ray.app.cli.util import _end_now
    from ios_ray.interrupts import stop_on_sigterm

    def shutdown():
        for signum in (signal.SIGINT, signal.SIGTERM):
            os.kill(os.getpid(), signum)
            time.sleep(0.05)  # Python runs a handler between two bytecodes: here, inside the shutdown
        print("shut down", flush=True)

    sys.modules["ray"] = SimpleNamespace(is_initialized=lambda: True, shutdown=shutdown)
    stop_on_sigterm()
    _end_now(0)
    """
)


def test_a_stop_while_the_command_ends_changes_nothing() -> None:
    """A Ctrl-C after a search had written its files, while the command shut Ray down, raised out of the shutdown
    as a traceback and exit -2 (or Ray's own exit 1); there is nothing left to stop then."""
    ran = subprocess.run([sys.executable, "-c", STOPS_WHILE_THE_COMMAND_ENDS], capture_output=True, text=True,
                         timeout=HANG_S)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "shut down\n", "")
