"""The CPU's caches, as the operating system reports them (chapter 04: a model small enough to sit in
the last-level cache can decode faster than the DRAM bandwidth allows, so a roofline figure needs
the cache size next to it).

Linux lists each cache of CPU 0 under ``/sys/devices/system/cpu/cpu0/cache/index*/`` (``level``,
``type``, ``size`` such as ``300M`` or ``2048K``, ``shared_cpu_list``); elsewhere glibc's
``sysconf`` names or macOS's ``sysctl`` keys give the L2/L3 sizes when they exist. A virtual machine
reports what its hypervisor passes through: on a cloud host the last-level cache is the whole
socket's, shared with other tenants.

Usage::

    from labkit.hardware.caches import cpu_caches, last_level_cache_bytes
    last_level_cache_bytes()   # e.g. 314572800 (300 MiB), or None where nothing reports it
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import TypedDict

SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


class Cache(TypedDict):
    """One cache level: ``level`` (1, 2, 3...), ``type`` (``Data``, ``Instruction``, ``Unified``),
    ``bytes``, ``shared_cpus`` (the logical CPUs sharing it, as the OS lists them, e.g. ``0-1``)."""

    level: int
    type: str
    bytes: int
    shared_cpus: str


def parse_size(text: str) -> int:
    """A sysfs cache size (``32K``, ``2048K``, ``300M``, plain bytes) in bytes; ``ValueError`` otherwise."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS and not t[-1:].isdigit() else ""
    number = t[: len(t) - len(unit)]
    if not number.isdigit():
        raise ValueError(f"not a cache size: {text!r}")
    return int(number) * _UNITS[unit]


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def cpu_caches(root: Path = SYSFS) -> list[Cache]:
    """The caches of CPU 0 from sysfs (``root``), lowest level first; on other systems the L2/L3
    sizes ``sysconf``/``sysctl`` give (type ``Unified``, ``shared_cpus`` empty). Empty when nothing
    reports them."""
    caches: list[Cache] = []
    for d in sorted(root.glob("index*")) if root.is_dir() else []:
        level, size = _read(d / "level"), _read(d / "size")
        if not level.isdigit() or not size:
            continue
        try:
            caches.append(Cache(level=int(level), type=_read(d / "type") or "Unified", bytes=parse_size(size),
                                shared_cpus=_read(d / "shared_cpu_list")))
        except ValueError:
            continue
    if not caches and root == SYSFS:
        caches = _fallback()
    return sorted(caches, key=lambda c: (c["level"], c["type"]))


def _fallback() -> list[Cache]:
    out: list[Cache] = []
    for level in (2, 3):
        size = 0
        name = f"SC_LEVEL{level}_CACHE_SIZE"
        if name in getattr(os, "sysconf_names", {}):
            try:
                size = max(0, int(os.sysconf(name)))
            except (OSError, ValueError):
                size = 0
        if not size and platform.system() == "Darwin":
            key = f"hw.l{level}cachesize" if level == 3 else "hw.perflevel0.l2cachesize"
            try:
                r = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5)
                size = int(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip().isdigit() else 0
            except (OSError, subprocess.SubprocessError):
                size = 0
        if size:
            out.append(Cache(level=level, type="Unified", bytes=size, shared_cpus=""))
    return out


def last_level_cache_bytes(caches: list[Cache] | None = None) -> int | None:
    """Bytes of the highest-level data or unified cache (``caches`` default :func:`cpu_caches`), or
    None when the system reports none."""
    usable = [c for c in (cpu_caches() if caches is None else caches) if c["type"] != "Instruction"]
    if not usable:
        return None
    top = max(c["level"] for c in usable)
    return max(c["bytes"] for c in usable if c["level"] == top)
