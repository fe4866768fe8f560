"""Run a server so that it dies with the process that started it (every engine the lab starts:
chapters 02, 04, 05, 06 and 08).

Run as a script, before anything else of the lab is imported (``python -S guard.py PARENT SIGNAL --
CMD...``), it becomes ``CMD``:

* Linux: asks the kernel for ``SIGNAL`` when its parent dies (``prctl(PR_SET_PDEATHSIG)``, kept
  across ``exec``), checks the parent is still ``PARENT`` (it may have died before the ``prctl``),
  then ``exec``s ``CMD``: no extra process. The signal comes however the parent ends: SIGTERM,
  SIGINT, SIGKILL, a crash. The kernel sends it when the parent *thread* exits, so start servers
  from a thread that lives as long as the server (a notebook cell's main thread does).
* Elsewhere (macOS): stays as a small watcher. ``CMD`` runs as its child; the watcher blocks on its
  stdin, a pipe whose other end only the parent holds. When the parent dies, however it dies, the
  pipe closes and the watcher sends ``SIGNAL`` to ``CMD`` (then SIGKILL after 10 s). SIGTERM and
  SIGINT sent to the watcher are passed on to ``CMD``.

``labkit.engines.process.spawn`` is what starts it; nothing imports this file.
"""

import os
import signal
import subprocess
import sys
import threading


def _linux(parent: int, sig: int, cmd: list) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, sig, 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
        sys.exit(f"guard: prctl(PR_SET_PDEATHSIG) failed (errno {ctypes.get_errno()})")
    if os.getppid() != parent:  # the parent died before the prctl took effect
        sys.exit(0)
    os.execvp(cmd[0], cmd)


def _watch(sig: int, cmd: list) -> int:
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    def parent_gone() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    threading.Thread(target=parent_gone, daemon=True).start()
    return proc.wait()


def main(argv: list) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: guard.py PARENT_PID SIGNAL -- CMD [ARGS...]")
    parent, sig, cmd = int(argv[0]), int(argv[1]), argv[3:]
    if sys.platform.startswith("linux") and not os.environ.get("LABKIT_GUARD_WATCH"):
        _linux(parent, sig, cmd)
    return _watch(sig, cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
