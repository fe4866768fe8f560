"""``make lab``: the JupyterLab command line that opens every chapter, for root and for everyone else.

JupyterLab refuses to start as root unless given ``--allow-root``, and root is the usual user in
Docker containers and on cloud GPU boxes; a normal user should not get the flag. :func:`lab_command`
is that decision (pure, unit-tested with a fake uid); ``python -m labkit.jupyter [--host H] [--port P]``
runs it with this process's uid, in place of itself. Without ``--host``/``--port`` JupyterLab keeps
its defaults (localhost, port 8888 or the next free one).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .paths import NOTEBOOKS


def lab_command(uid: int, host: str | None = None, port: int | str | None = None,
                notebooks: Path = NOTEBOOKS, python: str = sys.executable) -> list[str]:
    """argv that starts JupyterLab on ``notebooks``: ``--allow-root`` only when ``uid`` is 0,
    ``--ip``/``--port`` only when given (empty strings count as not given). A given port is kept or
    the start fails: an SSH tunnel or ``docker -p`` points at that port, not at the next free one."""
    cmd = [python, "-m", "jupyterlab", str(notebooks)]
    if uid == 0:
        cmd.append("--allow-root")
    if host:
        cmd.append(f"--ip={host}")
    if port not in (None, ""):
        p = int(port) if str(port).isdigit() else 0
        if not 0 < p < 65536:
            raise ValueError(f"port {port!r} is not a TCP port (1-65535)")
        cmd += [f"--port={p}", "--ServerApp.port_retries=0"]  # a tunnel expects this port, not the next
    return cmd


def main(argv: list[str] | None = None) -> int:
    """Parse ``--host``/``--port`` (``--dry-run`` prints the command instead), then exec JupyterLab."""
    ap = argparse.ArgumentParser(prog="python -m labkit.jupyter", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="", help="address to listen on, e.g. 0.0.0.0 (default: localhost)")
    ap.add_argument("--port", default="", help="TCP port (default: JupyterLab's, 8888 or the next free)")
    ap.add_argument("--dry-run", action="store_true", help="print the command and exit")
    a = ap.parse_args(argv)
    try:
        cmd = lab_command(os.getuid(), a.host, a.port)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(" ".join(cmd), flush=True)
    if a.dry_run:
        return 0
    os.execv(cmd[0], cmd)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
