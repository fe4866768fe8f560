"""Build llama.cpp's tools once, from the source PyPI ships (chapters 02, 04, 05, 06 and 08).

``llama-cpp-python`` is published as an sdist that carries llama.cpp's full source under
``vendor/llama.cpp``. ``make llamacpp`` (= ``python -m labkit.engines.llamacpp_build``) downloads the
pinned sdist with pip, unpacks only that folder, and builds four tools with cmake:

* ``llama-server``: the OpenAI-compatible HTTP server (``--metrics`` for Prometheus);
* ``llama-bench``: llama.cpp's own speed benchmark (prompt and generation tok/s);
* ``llama-quantize``: GGUF to GGUF at another precision (chapter 06's quantization levels);
* ``llama-perplexity``: perplexity of a GGUF on a text file.

They go into ``<cache>/llamacpp/<version>-<flags hash>/bin`` (the cache is ``$LABKIT_CACHE``, default
``~/.cache/labkit``), so a second ``make`` finds them and builds nothing. Flags (:func:`build_flags`):

* Linux/Windows x86-64: portable, not native: ``GGML_NATIVE=OFF`` with AVX2, FMA and F16C on. A native
  build once crashed at its first token on a VM whose CPU reports AMX the VM does not allow; AVX2 runs
  on every x86-64 CPU of the last decade (Intel Haswell, AMD Zen). ``make llamacpp`` prints how long
  the build took (minutes on 2 cores).
* macOS: llama.cpp's defaults, which build with Metal on Apple silicon (not tried here: no Mac).
* ``LABKIT_LLAMACPP_CUDA=1``: ``GGML_CUDA=ON`` for an NVIDIA machine with the CUDA toolkit (not
  tried here: the lab's GPU machines have no compiler toolkit).

No cmake, no C++ compiler: one line says what to install and the rest of the lab still works (the
chapters fall back to vLLM, or to the labelled simulation). cmake itself can come from PyPI
(``pip install cmake``); a compiler cannot.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from ..settings import cache_dir

#: The pinned sdist whose ``vendor/llama.cpp`` is built.
VERSION = "0.3.36"
PACKAGE = "llama-cpp-python"
TOOLS = ("llama-server", "llama-bench", "llama-quantize", "llama-perplexity")
PORTABLE_X86 = ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
COMMON = ["-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
          "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF"]


class BuildError(RuntimeError):
    """The tools could not be built; the message says what to install or where the log is."""


def build_flags(system: str | None = None, machine: str | None = None, cuda: bool | None = None) -> list[str]:
    """cmake ``-D`` flags for this platform (see the module doc); ``cuda`` defaults to
    ``$LABKIT_LLAMACPP_CUDA``."""
    system = system or platform.system()
    machine = (machine or platform.machine()).lower()
    if cuda is None:
        cuda = os.environ.get("LABKIT_LLAMACPP_CUDA", "").lower() not in ("", "0", "false")
    flags = list(COMMON)
    if system != "Darwin" and machine in ("x86_64", "amd64"):
        flags += PORTABLE_X86
    if cuda:
        flags.append("-DGGML_CUDA=ON")
    return flags


def build_key(flags: list[str], version: str = VERSION) -> str:
    """``<version>-<12 hex of the flags>``: a change of either builds into a new folder."""
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
    return f"{version}-{digest}"


def build_dir(flags: list[str] | None = None) -> Path:
    """Where this platform's build lives (``bin/`` holds the tools, ``build.json`` how they were made)."""
    return cache_dir() / "llamacpp" / build_key(build_flags() if flags is None else flags)


def tool(name: str) -> Path | None:
    """Path of a built tool (``llama-server``, ...), or None when ``make llamacpp`` has not built it.
    ``$LABKIT_LLAMACPP_BIN`` points at a folder of tools built elsewhere (a Homebrew install, say)."""
    if name not in TOOLS:
        raise ValueError(f"unknown llama.cpp tool {name!r}; the lab builds {', '.join(TOOLS)}")
    env = os.environ.get("LABKIT_LLAMACPP_BIN", "").strip()
    folder = Path(env) if env else build_dir() / "bin"
    exe = folder / (name + (".exe" if platform.system() == "Windows" else ""))
    if not exe.exists():
        return None
    if not env and not (build_dir() / "build.json").exists():
        return None  # a build that stopped half-way
    return exe


def available() -> bool:
    """Whether all four tools are built here."""
    return all(tool(t) is not None for t in TOOLS)


def unavailable_reason() -> str:
    """Why :func:`available` is False, and what to do."""
    missing = missing_prerequisites()
    if missing:
        return missing
    return (f"llama.cpp's tools are not built in {build_dir()}: run `make llamacpp` "
            "(about 4-5 minutes on 2 cores)")


def missing_prerequisites() -> str:
    """One line naming what to install before building ('' when cmake and a C++ compiler are here)."""
    need = []
    if not (shutil.which("cmake") or _venv_tool("cmake")):
        need.append("cmake (apt install cmake / brew install cmake / pip install cmake)")
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++", "cl")):
        need.append("a C++ compiler (apt install build-essential / xcode-select --install)")
    if not need:
        return ""
    return ("cannot build llama.cpp: install " + " and ".join(need)
            + ", then `make llamacpp`; the chapters meanwhile use vLLM or the simulation")


def _venv_tool(name: str) -> str | None:
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else None


def build_info() -> dict:
    """``build.json`` of this platform's build: version, flags, seconds the build took, when."""
    path = build_dir() / "build.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _step(i: int, n: int, text: str) -> None:
    print(f"== llama.cpp {i}/{n} {text}", flush=True)


def build(jobs: int | None = None, force: bool = False) -> Path:
    """Build the four tools (see the module doc) unless this platform's build is already there;
    the folder of the tools. Prints a numbered line per step and the seconds each took."""
    flags = build_flags()
    out = build_dir(flags)
    if available() and not force and not os.environ.get("LABKIT_LLAMACPP_BIN"):
        info = build_info()
        print(f"llama.cpp {info.get('version', VERSION)} tools already built in {out / 'bin'} "
              f"({info.get('build_s', float('nan')):.0f} s, {info.get('built', '?')}); nothing to do",
              flush=True)
        return out / "bin"
    missing = missing_prerequisites()
    if missing:
        raise BuildError(missing)
    cmake = shutil.which("cmake") or _venv_tool("cmake") or "cmake"
    jobs = jobs or os.cpu_count() or 2
    t_all = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llamacpp-") as tmp:
        t0 = time.perf_counter()
        _step(1, 3, f"downloading the {PACKAGE}=={VERSION} sdist from PyPI (about 77 MB)")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", tmp, f"{PACKAGE}=={VERSION}"], check=True)
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if not sdists:
            raise BuildError(f"pip downloaded no sdist of {PACKAGE}=={VERSION} into {tmp}")
        src = out / "src"
        shutil.rmtree(src, ignore_errors=True)
        with tarfile.open(sdists[0]) as tar:
            prefix = f"{sdists[0].name[:-len('.tar.gz')]}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(src, members=[m for m in members if m.name], filter="data")
        print(f"   {len(members)} files of llama.cpp's source in {src} ({time.perf_counter() - t0:.0f} s)")
        t1 = time.perf_counter()
        _step(2, 3, "configuring with cmake: " + " ".join(flags))
        log = out / "build.log"
        with open(log, "w") as f:
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            r = subprocess.run([cmake, "-S", str(src), "-B", str(out / "cmake"), *gen, *flags],
                               stdout=f, stderr=subprocess.STDOUT)
            if r.returncode:
                raise BuildError(f"cmake could not configure llama.cpp; see {log}")
            print(f"   configured ({time.perf_counter() - t1:.0f} s)", flush=True)
            t2 = time.perf_counter()
            _step(3, 3, f"compiling {', '.join(TOOLS)} with {jobs} jobs (about 4 minutes on 2 cores)")
            r = subprocess.run([cmake, "--build", str(out / "cmake"), "-j", str(jobs), "--target", *TOOLS],
                               stdout=f, stderr=subprocess.STDOUT)
            if r.returncode:
                raise BuildError(f"compiling llama.cpp failed; the end of {log} says why")
        bin_dir = out / "bin"
        bin_dir.mkdir(exist_ok=True)
        for t in TOOLS:
            built = next((out / "cmake" / "bin").glob(t + "*"), None)
            if built is None:
                raise BuildError(f"the build finished without {t}; see {log}")
            shutil.copy2(built, bin_dir / built.name)
        shutil.rmtree(out / "cmake", ignore_errors=True)
        shutil.rmtree(src, ignore_errors=True)
        took = time.perf_counter() - t_all
        info = {"version": VERSION, "flags": flags, "build_s": round(took, 1), "compile_s":
                round(time.perf_counter() - t2, 1), "built": time.strftime("%Y-%m-%d %H:%M"),
                "machine": platform.machine(), "system": platform.system()}
        (out / "build.json").write_text(json.dumps(info, indent=1))
    print(f"llama.cpp tools built in {took:.0f} s: {bin_dir}", flush=True)
    return bin_dir


def main(argv: list[str] | None = None) -> int:
    """``make llamacpp``: build (once) and print where the tools are; exit 0 with one line when the
    machine cannot build them (the lab runs on without them), 1 when a build started and failed."""
    ap = argparse.ArgumentParser(description="build llama.cpp's tools from the pinned PyPI sdist")
    ap.add_argument("--force", action="store_true", help="build again even if built")
    ap.add_argument("--jobs", type=int, default=None)
    a = ap.parse_args(argv)
    missing = missing_prerequisites()
    if missing and not available():
        print(f"note: {missing}", file=sys.stderr)
        return 0
    try:
        build(a.jobs, a.force)
    except (BuildError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
