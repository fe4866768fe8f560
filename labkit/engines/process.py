"""The life of a server process the lab starts (vLLM and llama.cpp alike; chapters 02, 04, 05, 06, 08).

* :func:`start` starts a server and waits until it answers; :func:`running` is the ``with`` form
  (:class:`labkit.engines.server.Engine` starts each engine through them).
* :func:`spawn` starts it in its own process group, through :mod:`labkit.engines.guard`, so it dies
  with the Python process that started it, whether that process ends by SIGTERM, SIGINT, SIGKILL or a
  crash (on 2 cores an orphaned server skews every later measurement), and records it in
  ``<cache>/servers/`` until :func:`stop`.
* :func:`wait_ready` polls ``/health``; :func:`stop` sends SIGTERM to the group, then SIGKILL.
* :func:`lab_servers` lists servers the lab started that are still running, and whether the process
  that started them is gone (``labkit doctor`` prints them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ..paths import REPO
from ..settings import cache_dir

GUARD = Path(__file__).with_name("guard.py")


def free_port() -> int:
    """A TCP port nobody listens on at 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A started server: ``url`` (``http://127.0.0.1:PORT``), ``pid`` (also its process group),
    ``log`` (file with its output), ``model`` (served name), ``startup_s`` (seconds to ready),
    ``dtype`` (the weights' and compute dtype, or the GGUF's type), ``engine`` (``vllm``/``llamacpp``)."""

    url: str
    pid: int
    log: Path
    model: str
    proc: subprocess.Popen
    startup_s: float = float("nan")
    dtype: str = "float32"
    engine: str = "vllm"


def _registry() -> Path:
    path = cache_dir() / "servers"
    path.mkdir(parents=True, exist_ok=True)
    return path


def guarded(cmd: list[str], death_signal: int = signal.SIGKILL) -> list[str]:
    """``cmd`` wrapped in :mod:`labkit.engines.guard`: it receives ``death_signal`` when this process
    dies. Start it with ``stdin=subprocess.PIPE`` (the watcher used off Linux reads that pipe)."""
    return [sys.executable, "-S", str(GUARD), str(os.getpid()), str(int(death_signal)), "--", *cmd]


def spawn(cmd: list[str], log_path: Path, env: dict[str, str] | None = None, engine: str = "server",
          port: int | None = None, death_signal: int = signal.SIGKILL) -> subprocess.Popen:
    """Start ``cmd`` with its output in ``log_path`` (the command line is its first line), in a new
    process group, guarded so that it receives ``death_signal`` when this process dies (see
    :mod:`labkit.engines.guard`). SIGKILL suits a single-process server (llama-server); vLLM gets
    SIGTERM so that it stops its own engine process."""
    full = guarded(cmd, death_signal)
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                env=env, cwd=REPO, start_new_session=True)
    # The pipe's write end stays open in this process only: it closes when this process dies,
    # which is what the watcher waits for.
    with contextlib.suppress(OSError):
        (_registry() / f"{proc.pid}.json").write_text(json.dumps(
            {"pid": proc.pid, "parent": os.getpid(), "engine": engine, "port": port, "cmd": cmd,
             "log": str(log_path), "started": time.time()}))
    return proc


def _log_tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def wait_ready(server: Server, timeout_s: float = 240.0, name: str | None = None) -> float:
    """Poll ``/health`` until it answers 200; seconds waited. ``RuntimeError`` with the log's tail
    if the process exits or ``timeout_s`` passes."""
    name = name or server.engine
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {server.proc.returncode} before it was ready; "
                               f"its log ({server.log}) ends:\n{_log_tail(server.log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                return time.perf_counter() - t0
        time.sleep(0.25)
    raise RuntimeError(f"{name} did not answer {server.url}/health within {timeout_s:.0f} s; "
                       f"its log ({server.log}) ends:\n{_log_tail(server.log)}")


def stop(server: Server | subprocess.Popen, timeout_s: float = 20.0) -> None:
    """Stop a server by its process group: SIGTERM, then SIGKILL if it has not exited within
    ``timeout_s``; then forget it in the registry."""
    proc = server.proc if isinstance(server, Server) else server
    try:
        if proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
    finally:
        if proc.stdin:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        with contextlib.suppress(OSError):
            (_registry() / f"{proc.pid}.json").unlink(missing_ok=True)


def default_log(name: str, port: int) -> Path:
    """Where a server's output goes unless the caller says: ``<cache>/logs/<name>-<port>.log``."""
    folder = cache_dir() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}-{port}.log"


def start(cmd: list[str], port: int, engine: str, model: str, dtype: str, *,
          log_path: str | Path | None = None, env: dict[str, str] | None = None,
          death_signal: int = signal.SIGKILL, ready_timeout_s: float = 240.0,
          name: str | None = None) -> Server:
    """Start the server ``cmd`` (listening on ``127.0.0.1:port``) with :func:`spawn`, wait for its
    ``/health`` (:func:`wait_ready`, up to ``ready_timeout_s`` seconds) and return its :class:`Server`
    (``startup_s`` set); stopped again if it never gets ready. ``name`` labels it in errors and names
    its default log (:func:`default_log`, lower case). Every engine module starts its servers through here."""
    name = name or engine
    log = Path(log_path) if log_path is not None else default_log(name.lower(), port)
    proc = spawn(cmd, log, env if env is not None else dict(os.environ), engine, port, death_signal)
    server = Server(url=f"http://127.0.0.1:{port}", pid=proc.pid, log=log, model=model, proc=proc,
                    dtype=dtype, engine=engine)
    try:
        server.startup_s = wait_ready(server, ready_timeout_s, name)
    except BaseException:
        stop(server)
        raise
    return server


@contextlib.contextmanager
def running(start_fn: Callable[..., Server], /, **kwargs: Any) -> Iterator[Server]:
    """``with running(start_llamacpp, parallel=1) as server:`` the :class:`Server` ``start_fn(**kwargs)``
    started, stopped (:func:`stop`) on exit, however the block ends."""
    server = start_fn(**kwargs)
    try:
        yield server
    finally:
        stop(server)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def lab_servers() -> list[dict]:
    """Servers the lab started that are still running (registry entries whose process lives), each
    with ``orphan`` True when the process that started it is gone. Entries of dead servers are
    removed."""
    out = []
    for path in sorted(_registry().glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        pid = int(entry["pid"])
        line = _cmdline(pid)
        running = _alive(pid) and (line is None or Path(entry["cmd"][0]).name in line)
        if not running:
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        entry["orphan"] = not _alive(int(entry["parent"]))
        out.append(entry)
    return out


def format_lab_servers(servers: list[dict]) -> str:
    """One line per running lab server for ``labkit doctor`` ('' when there is none)."""
    lines = []
    for s in servers:
        who = "ORPHAN: its parent is gone" if s["orphan"] else f"started by PID {s['parent']}"
        lines.append(f"lab server    {s['engine']} PID {s['pid']} on port {s['port']} ({who}); "
                     f"stop it with: kill -- -{s['pid']}")
    return "\n".join(lines)
