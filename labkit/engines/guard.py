"""Run a server so that it dies with the process that started it (every engine the lab starts:
chapters 02, 04, 05, 06 and 08).

Run as a script, before anything else of the lab is imported (``python -S guard.py PARENT SIGNAL --
CMD...``), it starts ``CMD`` as its child and stays as a small watcher. It blocks on its stdin, a
pipe whose write end only the parent process holds: when the parent dies, however it dies (SIGTERM,
SIGINT, SIGKILL, a crash), the kernel closes the pipe and the watcher sends ``SIGNAL`` to ``CMD``
(SIGKILL 10 s later if it is still there). SIGTERM and SIGINT sent to the watcher are passed on.

Why a pipe and not only the kernel's ``PR_SET_PDEATHSIG``: that signal follows the *thread* that
started the child, so a server started from a worker thread (a thread pool in a notebook) died as
soon as that thread finished. The pipe closes with the process. On Linux ``CMD`` also gets
``PR_SET_PDEATHSIG`` with the watcher as its parent (single-threaded), so killing the watcher itself
takes the server down too.

``labkit.engines.process.spawn`` is what starts it; nothing imports this file.
"""

import ctypes
import os
import signal
import subprocess
import sys
import threading


def _die_with_parent(sig: int) -> None:
    """In the child, before ``exec``: ask Linux for ``sig`` when the watcher dies."""
    ctypes.CDLL(None).prctl(1, sig, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def _watch(parent: int, sig: int, cmd: list) -> int:
    if os.getppid() != parent:  # the parent died before we got here
        return 0
    linux = sys.platform.startswith("linux")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                            preexec_fn=(lambda: _die_with_parent(sig)) if linux else None)

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
    return _watch(parent, sig, cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
