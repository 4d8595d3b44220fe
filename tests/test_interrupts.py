"""A SIGTERM stops a command as a Ctrl-C does, and is told apart from one however the stop surfaces."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from ios_ray import interrupts
from ios_ray.interrupts import Terminated, ctrl_c_held, stop_on_sigterm, was_terminated


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
