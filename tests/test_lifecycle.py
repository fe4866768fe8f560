"""Every server the lab starts dies with the process that started it (labkit.engines.process/guard).

A parent Python process starts a server, prints its port, and is killed with SIGTERM, SIGINT or
SIGKILL (a stuck Jupyter kernel is killed with SIGKILL); the port must close. First with a plain
HTTP server (also started from a worker thread, which must not take it down when the thread ends,
and with the watcher itself killed), then with llama-server and vLLM themselves where they are built
(required under CI).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from labkit.engines import process, vllm

SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGKILL]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(cond, timeout_s: float) -> bool:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _parent(code: str, env: dict | None = None, timeout_s: float = 300) -> tuple[subprocess.Popen, int, int]:
    """Run ``code`` in a new Python process; it must print ``PORT PID`` of the server it started."""
    tail = "\nprint(server_port, server_pid, flush=True)\nimport time\ntime.sleep(600)\n"
    script = textwrap.dedent(code) + tail
    # SIGINT back to its default in the parent, as in a terminal or a Jupyter kernel: a test runner started
    # as a background job of a non-interactive shell inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt (a fresh-clone run at 22:09 failed all four SIGINT cases that way)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, **(env or {})},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    line = p.stdout.readline()  # type: ignore[union-attr]
    if not line:
        p.wait(timeout_s)
        pytest.fail(f"the parent exited ({p.returncode}) before starting its server")
    port, pid = map(int, line.split())
    return p, port, pid


HTTP = """
import sys
from labkit.engines import process
server_port = process.free_port()
proc = process.spawn([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(server_port)],
                     process._registry() / "http-test.log", engine="http", port=server_port)
import socket, time
for _ in range(100):
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", server_port)) == 0:
            break
    time.sleep(0.1)
server_pid = proc.pid
"""


THREADED = """
import threading, time
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(1) as pool:  # the starting thread ends when the pool shuts down
    box = {}
    pool.submit(lambda: box.update(g=_start())).result()
server_port, server_pid = box["g"]
time.sleep(0.5)  # the worker thread is gone (the pool joined it): the server must still answer
import socket
with socket.socket() as s:
    assert s.connect_ex(("127.0.0.1", server_port)) == 0, "the server died with its starting thread"
"""


@pytest.mark.parametrize("mode", ["main thread", "worker thread"])
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_plain_server_dies_with_its_parent(sig: signal.Signals, mode: str) -> None:
    code = HTTP if mode == "main thread" else START + THREADED
    parent, port, pid = _parent(code)
    assert _port_open(port)
    assert any(s["pid"] == pid and not s["orphan"] for s in process.lab_servers())
    parent.send_signal(sig)
    parent.wait(10)
    assert _wait(lambda: not _port_open(port), 15), f"server on {port} outlived its parent ({sig}, {mode})"
    assert _wait(lambda: all(s["pid"] != pid for s in process.lab_servers()), 15)


def test_lab_servers_names_an_orphan(tmp_path) -> None:
    """A server whose starter is gone (one started without the guard, as before) is listed as an orphan."""
    port = process.free_port()
    srv = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        (process._registry() / f"{srv.pid}.json").write_text(
            f'{{"pid": {srv.pid}, "parent": {dead.pid}, "engine": "http", "port": {port}, '
            f'"cmd": ["{sys.executable}"], "log": "", "started": 0}}')
        found = [s for s in process.lab_servers() if s["pid"] == srv.pid]
        assert found and found[0]["orphan"]
        assert f"kill -- -{srv.pid}" in process.format_lab_servers(found)
    finally:
        process.stop(srv)
    assert all(s["pid"] != srv.pid for s in process.lab_servers())


OK_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_start_waits_for_health_and_running_stops_it(tmp_path) -> None:
    """process.start/running, the one way every engine module starts a server: ready when /health
    answers, stopped (port closed, registry entry gone) when the ``with`` block ends."""
    port = process.free_port()
    cmd = [sys.executable, "-c", OK_SERVER, str(port)]
    with process.running(process.start, cmd=cmd, port=port, engine="http", model="m", dtype="none",
                         log_path=tmp_path / "ok.log", ready_timeout_s=30) as s:
        assert s.url == f"http://127.0.0.1:{port}" and s.startup_s >= 0 and _port_open(port)
        assert any(x["pid"] == s.pid for x in process.lab_servers())
    assert _wait(lambda: not _port_open(port), 10)
    assert all(x["pid"] != s.pid for x in process.lab_servers())
    assert (tmp_path / "ok.log").read_text().startswith(sys.executable)  # the command line comes first


def test_start_reports_a_server_that_exits_with_its_log(tmp_path) -> None:
    cmd = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="(?s)exited with code 3.*no model here"):
        process.start(cmd, process.free_port(), "http", "m", "none", log_path=tmp_path / "bad.log",
                      ready_timeout_s=30, name="bad-server")


START = """
import sys
from labkit.engines import process

def _start():
    port = process.free_port()
    proc = process.spawn([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                         process._registry() / "http-test.log", engine="http", port=port)
    import socket, time
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    return port, proc.pid
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_killing_the_watcher_takes_the_server_down() -> None:
    parent, port, pid = _parent(HTTP)
    try:
        os.kill(pid, signal.SIGKILL)  # the guard process itself
        assert _wait(lambda: not _port_open(port), 15), "the server outlived its watcher"
    finally:
        parent.kill()


LLAMA = """
from labkit.engines.llamacpp import start_llamacpp
s = start_llamacpp(parallel=1)
server_port, server_pid = s.url.rsplit(":", 1)[1], s.pid
"""
VLLM = """
from labkit.engines.vllm import start_vllm
s = start_vllm(ready_timeout_s=300)
server_port, server_pid = s.url.rsplit(":", 1)[1], s.pid
"""


@pytest.mark.slow  # starts llama.cpp on the bundled GGUF
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_llama_server_dies_with_its_parent(sig: signal.Signals, tools) -> None:
    parent, port, _ = _parent(LLAMA)
    parent.send_signal(sig)
    parent.wait(10)
    assert _wait(lambda: not _port_open(port), 15), f"llama-server outlived its parent ({sig.name})"


@pytest.mark.slow  # starts vLLM: about 20 s each
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_vllm_dies_with_its_parent(sig: signal.Signals) -> None:
    if not vllm.vllm_available():
        if vllm.vllm_required():
            pytest.fail(f"CI must run vLLM: {vllm.unavailable_reason()}")
        pytest.skip(vllm.unavailable_reason())
    parent, port, _ = _parent(VLLM)
    parent.send_signal(sig)
    parent.wait(10)
    assert _wait(lambda: not _port_open(port), 60), f"vLLM outlived its parent ({sig.name})"


@pytest.mark.slow  # starts vLLM: about 20 s
def test_make_serve_stops_vllm_on_sigterm() -> None:
    """``make serve`` runs ``python -m labkit.engines.vllm``; SIGTERM to it used to leave vLLM serving."""
    if not vllm.vllm_available():
        if vllm.vllm_required():
            pytest.fail(f"CI must run vLLM: {vllm.unavailable_reason()}")
        pytest.skip(vllm.unavailable_reason())
    import httpx

    port = process.free_port()
    p = subprocess.Popen([sys.executable, "-m", "labkit.engines.vllm", "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        assert _wait(ready, 300), "make serve's vLLM never became ready"
        p.send_signal(signal.SIGTERM)
        p.wait(60)
        assert _wait(lambda: not _port_open(port), 30), "vLLM outlived `make serve` after SIGTERM"
    finally:
        if p.poll() is None:
            p.kill()
