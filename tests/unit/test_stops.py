"""The one stop-signal rule (ddplab.stops): SIGTERM and SIGHUP stop a command as Ctrl-C does."""

import os
import signal

import pytest

from ddplab import stops


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


def test_the_first_stop_signal_begins_the_stop_and_any_later_one_is_ignored_until_the_command_exits():
    """A scheduler's or a script's second SIGTERM, or a second Ctrl-C, while a stop is carried out: neither cuts
    the stop short (a KeyboardInterrupt raised again from a `finally`) nor turns exit 130 into 143 once the
    command's block has ended (the handler put back there was the default one, which kills)."""
    before = {s: signal.getsignal(s) for s in stops.STOP_SIGNALS}
    try:
        with stops.as_interrupts(to_exit=True):
            with pytest.raises(KeyboardInterrupt), stops.as_interrupts():  # a nested block (a sweep's, a run's)
                os.kill(os.getpid(), signal.SIGTERM)
            assert stops.stopping()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                os.kill(os.getpid(), sig)  # ignored: the stop goes on where it was
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in stops.STOP_SIGNALS)  # until the process exits
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert not stops.stopping()


def test_a_python_callers_handlers_come_back_after_a_stop_and_the_next_block_starts_afresh():
    before = {s: signal.getsignal(s) for s in stops.STOP_SIGNALS}
    with pytest.raises(KeyboardInterrupt) as stopped, stops.as_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
    assert type(stopped.value) is KeyboardInterrupt and stops.name_of(stopped.value) == "SIGINT"
    assert {s: signal.getsignal(s) for s in stops.STOP_SIGNALS} == before and not stops.stopping()
    with pytest.raises(stops.Stopped), stops.as_interrupts():  # a later call is stopped as the first was
        os.kill(os.getpid(), signal.SIGHUP)


def test_handlers_a_library_sets_inside_are_taken_back():
    """torch's elastic agent sets its own for SIGINT, SIGTERM, SIGHUP and SIGQUIT and leaves them set."""
    before = {s: signal.getsignal(s) for s in stops.TAKEN_BY_LIBRARIES}

    def library(signum, frame):
        raise RuntimeError("a library's handler")

    with stops.kept():
        for sig in stops.TAKEN_BY_LIBRARIES:
            signal.signal(sig, library)
    assert {s: signal.getsignal(s) for s in stops.TAKEN_BY_LIBRARIES} == before


def test_a_stop_begun_outside_any_block_leaves_nothing_for_a_later_call():
    """A Python caller's DDP run stopped by the agent's handler (run_agent begins the stop) must not leave this
    process ignoring the next stop signal (the Ray executor's handler asks `stopping()`)."""
    stops.begin()
    assert not stops.stopping()
