"""labkit.experiments.offline (chapter 01): a child process whose networking is refused by an audit hook
installed before anything imports; the control child without it reaches the same port."""

import socket

import pytest

from labkit.experiments import offline


@pytest.fixture
def listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        yield s.getsockname()[1]


def test_sandbox_refuses_connect_and_lookup_while_a_plain_child_connects(listener):
    params = {"port": listener}
    plain = offline.run_child(offline.child_source(offline.PROBE, sandbox=False), params, 30,
                              offline_env=False)
    boxed = offline.run_child(offline.child_source(offline.PROBE), params, 30)
    assert plain["rc"] == 0 and plain["out"]["connect"] == "ok"
    assert boxed["rc"] == 0
    assert offline.refused(boxed["out"]["connect"]) and "127.0.0.1" in boxed["out"]["connect"]
    assert offline.refused(boxed["out"]["lookup"]) and "huggingface.co" in boxed["out"]["lookup"]
    assert not offline.refused(plain["out"]["connect"])


def test_no_way_around_it_from_python(listener):
    """A reference to connect taken before any patching, urllib, connect_ex and UDP sendto all hit the
    hook (a monkeypatch of socket.connect alone would miss the first and third)."""
    body = (
        "import json, socket, urllib.request\n"
        "P, out = json.loads(sys.argv[1]), {}\n"
        "raw = socket.socket.connect\n"
        "tries = {'saved reference': lambda: raw(socket.socket(), ('127.0.0.1', P['port'])),\n"
        "         'connect_ex': lambda: socket.socket().connect_ex(('127.0.0.1', P['port'])),\n"
        "         'urllib': lambda: urllib.request.urlopen('http://127.0.0.1:%d/' % P['port'], timeout=3),\n"
        "         'udp sendto': lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
        ".sendto(b'x', ('127.0.0.1', P['port']))}\n"
        "for name, call in tries.items():\n"
        "    try:\n"
        "        call(); out[name] = 'ok'\n"
        "    except OSError as e:\n"
        "        out[name] = f'{type(e).__name__}: {e}'\n"
    )
    r = offline.run_child(offline.child_source(body), {"port": listener}, 30)
    assert r["rc"] == 0, r["stderr_tail"]
    for name in ("saved reference", "connect_ex", "udp sendto"):
        assert offline.refused(r["out"][name]), (name, r["out"][name])
    assert "networking is refused" in r["out"]["urllib"]  # urllib wraps it in URLError, an OSError


def test_offline_env_reaches_the_child():
    body = "import os\nout = {k: os.environ.get(k) for k in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE')}\n"
    r = offline.run_child(offline.child_source(body), {}, 30)
    assert r["out"] == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_a_stuck_child_is_killed_at_the_timeout():
    r = offline.run_child(offline.child_source("import time\ntime.sleep(60)\nout = {}\n"), {}, 1.0)
    assert r["rc"] is None and r["out"] is None and r["seconds"] < 20


def test_offline_forward_reports_success_and_failure(monkeypatch):
    monkeypatch.setattr(offline, "FORWARD", "out |= {'text': ' hi', 'new_tokens': 2, 'seconds': 0.1}\n")
    good = offline.offline_forward(new_tokens=2)
    assert good["ok"] and good["control_connect"] == "ok" and offline.refused(good["connect"])
    assert good["error"] is None and good["new_tokens"] == 2
    # what the full profile's first run looks like: the weights are not on disk and the hub is refused
    monkeypatch.setattr(offline, "FORWARD", "raise OSError('could not connect to the Hub: offline mode')\n")
    bad = offline.offline_forward()
    assert not bad["ok"] and "offline mode" in bad["error"] and bad["new_tokens"] == 0


def test_refused_recognises_only_the_hook():
    assert offline.refused("NetworkRefused: networking is refused in this process (socket.connect ...)")
    assert not offline.refused("ConnectionRefusedError: [Errno 111] Connection refused")
    assert not offline.refused(None) and not offline.refused("ok")
