"""Run the bundled model in a child process with networking refused (chapter 01: open weights run
offline).

No root is needed: the child's first statements, before anything else is imported, install an audit
hook (``sys.addaudithook``, PEP 578: it cannot be removed, and every Python-level socket call raises
an audit event, so it also catches code that kept its own reference to ``socket.connect``) that
raises :data:`REFUSED` (an ``OSError``, so libraries handle it as a network failure) on each connect,
send-to and name lookup; ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` tell the hub libraries not to
try. What it does not stop: native code that opens sockets itself, bypassing Python (a kernel
network namespace, ``unshare -rn`` where allowed, would). The child is started through
:mod:`labkit.engines.guard`, so it dies with the process that started it.

:func:`offline_forward` proves both halves: a connect to a port that *is* listening (this process
holds it open) succeeds from a plain child and raises in the sandboxed one, a host-name lookup
raises there, and the model still loads and generates. Output figures: seconds (wall), token counts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

from ..engines.process import guarded

REFUSED = "NetworkRefused"
MARK = "LABKIT_OFFLINE "
# audit events (https://docs.python.org/3/library/audit_events.html) that reach the network
EVENTS = ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
          "socket.sendto", "socket.sendmsg")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "DO_NOT_TRACK": "1"}
PREAMBLE = textwrap.dedent(f"""\
    import sys
    class {REFUSED}(OSError):
        pass
    def _refuse(event, args, _events={EVENTS!r}):
        if event in _events:
            target = args[1] if event in ("socket.connect", "socket.sendto", "socket.sendmsg") else args[0]
            raise {REFUSED}(f"networking is refused in this process ({{event}} {{target!r}})")
    sys.addaudithook(_refuse)
    del _refuse
    """)

PROBE = textwrap.dedent("""\
    import json, socket
    P, out = json.loads(sys.argv[1]), {}
    def connect():  # a plain connect to an IP address: no name lookup on the way
        with socket.socket() as s:
            s.settimeout(3)
            s.connect(("127.0.0.1", P["port"]))
    for what, call in (("connect", connect),
                       ("lookup", lambda: socket.getaddrinfo("huggingface.co", 443))):
        try:
            call()
            out[what] = "ok"
        except OSError as e:
            out[what] = f"{type(e).__name__}: {e}"
    """)

FORWARD = textwrap.dedent("""\
    import time, torch
    from labkit.models import chat_ids, load_llm
    t0 = time.perf_counter()
    model, tok = load_llm(dtype=P["dtype"], device=P["device"])
    ids = torch.tensor([chat_ids(tok, P["prompt"])], device=model.device)
    with torch.inference_mode():
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=P["new"],
                             do_sample=False)
    new = gen[0, ids.shape[1]:]
    out |= {"text": tok.decode(new, skip_special_tokens=True), "new_tokens": int(new.numel()),
            "prompt_tokens": int(ids.shape[1]), "seconds": time.perf_counter() - t0}
    """)


def child_source(body: str, sandbox: bool = True) -> str:
    """Python source for ``python -c``: :data:`PREAMBLE` (when ``sandbox``) then ``body``, which must
    leave a dict ``out``; it is printed as one JSON line after :data:`MARK`. The child reads its
    parameters from ``sys.argv[1]`` (JSON, see :func:`run_child`)."""
    first = (PREAMBLE if sandbox else "") + "import json, sys\n"
    return first + body + f"\nprint({MARK!r} + json.dumps(out), flush=True)\n"


def run_child(source: str, params: dict[str, Any], timeout_s: float = 120.0,
              offline_env: bool = True) -> dict[str, Any]:
    """Run ``python -c source PARAMS`` (``params`` as JSON: the child's ``sys.argv[1]``) guarded (it
    dies with this process), with :data:`OFFLINE_ENV` added
    when ``offline_env``; returns ``{"rc", "out": the dict it printed or None, "stderr_tail",
    "seconds"}``. A child still running after ``timeout_s`` seconds is killed (``rc`` None)."""
    env = {**os.environ, **(OFFLINE_ENV if offline_env else {})}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        cmd = guarded([sys.executable, "-c", source, json.dumps(params)])
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=err, env=env)
        try:
            rc: int | None = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()  # the watcher; the child gets its death signal
            proc.wait()
            rc = None
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith(MARK)]
        tail = err.read()[-1500:]
    return {"rc": rc, "out": json.loads(lines[-1][len(MARK):]) if lines else None, "stderr_tail": tail,
            "seconds": time.perf_counter() - t0}


def offline_forward(prompt: str = "Name one reason to run a model on your own machine.", new_tokens: int = 8,
                    dtype: str = "auto", device: str = "cpu", timeout_s: float = 180.0) -> dict[str, Any]:
    """Chapter 01's proof: with a socket listening on 127.0.0.1 in this process, a plain child connects
    to it (``control_connect``: "ok") while the sandboxed child's connect and host-name lookup raise
    (``connect``, ``lookup``: the exception), and the sandboxed child loads the profile's model and
    generates ``new_tokens`` greedy tokens (``ok``, ``text``, ``new_tokens``, ``seconds``: load and
    generate, wall). ``error`` holds the child's last stderr lines when it did not finish."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        params = {"port": listener.getsockname()[1], "dtype": dtype, "device": device, "prompt": prompt,
                  "new": int(new_tokens)}
        control = run_child(child_source(PROBE, sandbox=False), params, 60, offline_env=False)
        child = run_child(child_source(PROBE + FORWARD), params, timeout_s)
    out = child["out"] or {}
    ok = child["rc"] == 0 and out.get("new_tokens", 0) > 0
    return {"ok": ok, "control_connect": (control["out"] or {}).get("connect", "no answer"),
            "connect": out.get("connect"), "lookup": out.get("lookup"), "text": out.get("text"),
            "new_tokens": out.get("new_tokens", 0), "seconds": out.get("seconds"),
            "wall_s": child["seconds"], "error": None if ok else child["stderr_tail"].strip()[-600:]}


def refused(result: str | None) -> bool:
    """Whether a probe's answer is this module's refusal (not some other network error)."""
    return bool(result) and str(result).startswith(REFUSED + ":")
