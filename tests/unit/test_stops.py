"""The one stop-signal rule (ddplab.launch.stops): SIGTERM and SIGHUP stop a command as Ctrl-C does."""

import os
import signal

import pytest

from ddplab.launch import stops


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_is_a_keyboard_interrupt_naming_itself_and_the_handlers_come_back(sig):
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt) as stopped, stops.as_interrupts():
        os.kill(os.getpid(), sig)  # delivered to this thread before kill returns; the handler runs right after
    assert stops.name_of(stopped.value) == sig.name
    assert stops.interrupted_line(stopped.value) == f"ddplab: interrupted by {sig.name}"
    assert signal.getsignal(sig) == before


def test_ctrl_c_keeps_its_line():
    assert stops.name_of(KeyboardInterrupt()) == "SIGINT"
    assert stops.interrupted_line(KeyboardInterrupt()) == "ddplab: interrupted"


def test_a_signal_started_ignored_stays_ignored_as_nohup_promises():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stops.as_interrupts():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # nothing: a closed terminal stops no nohup'd command
            assert signal.getsignal(signal.SIGTERM) is stops.raise_stopped
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_every_stop_signal_is_ignored_while_a_stop_is_carried_out():
    with stops.ignored():
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in stops.STOP_SIGNALS)
        os.kill(os.getpid(), signal.SIGHUP)
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
