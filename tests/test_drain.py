"""SIGTERM during streams (labkit.production.drain, chapter 08), against the fake server run as its own
process: with a drain every stream gets all its tokens; without one (vLLM's default) they are cut."""

import sys
from typing import Any

import pytest

from labkit.checks import outcome
from labkit.engines import process
from labkit.production import drain
from labkit.production.drain import sigterm_during_streams


def fake(shutdown_timeout_s: float) -> process.Server:
    port = process.free_port()
    cmd = [sys.executable, "-m", "labkit.engines.fakeserver", "--port", str(port), "--step-ms", "20",
           "--shutdown-timeout", str(shutdown_timeout_s)]
    return process.start(cmd, port, "fake", "fake", "none", ready_timeout_s=30)


def test_a_drain_lets_every_stream_finish_and_refuses_new_requests():
    run = sigterm_during_streams(fake(10), "fake", n=3, max_tokens=40, at_tokens=4, timeout_s=30)
    assert (run.completed, run.cut) == (3, 0)
    assert run.tokens_at_term >= 4
    assert run.late_request == "refused"
    assert run.exit_s is not None and 0.5 < run.exit_s < 10  # ~36 steps of 20 ms left to stream


def test_no_drain_cuts_every_stream():
    run = sigterm_during_streams(fake(0), "fake", n=3, max_tokens=40, at_tokens=4, timeout_s=30)
    assert (run.completed, run.cut) == (0, 3)
    assert run.exit_s is not None and run.exit_s < 5


def test_a_drain_shorter_than_the_streams_cuts_them_at_its_end():
    run = sigterm_during_streams(fake(0.2), "fake", n=2, max_tokens=200, at_tokens=2, timeout_s=30)
    assert run.cut == 2


def test_bad_settings_say_what_to_pass():
    with pytest.raises(ValueError, match="at_tokens < max_tokens"):
        sigterm_during_streams(None, "fake", max_tokens=4, at_tokens=4)  # type: ignore[arg-type]




def _drain_figures(start, monkeypatch):
    """What :func:`drain_or_not` records with servers from ``start``."""
    values: dict[str, Any] = {}
    monkeypatch.setattr(drain, "record", lambda chapter, key, value, *_: values.__setitem__(key, value))
    drain.drain_or_not(start, "fake", drain_s=10, n=3, max_tokens=30, at_tokens=4, timeout_s=30)
    return values


def test_the_drain_check_holds_on_a_server_that_drains(monkeypatch):
    assert outcome("production", "streams_drained", _drain_figures(fake, monkeypatch)).held


def test_a_drain_setting_that_is_not_passed_fails(monkeypatch):
    """A start function that drops the drain setting (every server gets the default 0): all cut."""
    values = _drain_figures(lambda _seconds: fake(0), monkeypatch)
    assert not outcome("production", "streams_drained", values).held


def test_a_running_server_serves_as_the_undrained_one(monkeypatch):
    """Chapter 08 sends SIGTERM to its own server (vLLM's default, no drain) and starts only the other."""
    started = []

    def start(shutdown_timeout_s: float) -> process.Server:
        started.append(shutdown_timeout_s)
        return fake(shutdown_timeout_s)

    monkeypatch.setattr(drain, "record", lambda *args, **kw: None)
    runs = drain.drain_or_not(start, "fake", drain_s=10, n=3, max_tokens=30, at_tokens=4, timeout_s=30,
                              undrained=fake(0))
    assert started == [10] and runs[0.0].cut == 3 and runs[10].cut == 0
