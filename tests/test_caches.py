"""The CPU cache sizes the OS reports (chapter 04, labkit.hardware.caches): sysfs sizes parsed, a fake
sysfs tree read, the last level picked (instruction caches left out)."""

from __future__ import annotations

import pytest

from labkit.hardware import caches as C


@pytest.mark.parametrize("text, n", [("48K", 48 * 1024), ("2048K", 2 * 2**20), ("300M", 300 * 2**20),
                                     ("1G", 2**30), ("32KB", 32 * 1024), ("65536", 65536),
                                     (" 8M\n", 8 * 2**20)])
def test_parse_size(text, n):
    assert C.parse_size(text) == n


@pytest.mark.parametrize("text", ["", "K", "big", "1.5M"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="cache size"):
        C.parse_size(text)


def _index(root, i, level, kind, size, shared="0-1"):
    d = root / f"index{i}"
    d.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (d / name).write_text(f"{value}\n")


def test_fake_sysfs(tmp_path):
    _index(tmp_path, 0, 1, "Data", "48K", "0")
    _index(tmp_path, 1, 1, "Instruction", "32K", "0")
    _index(tmp_path, 2, 2, "Unified", "2048K", "0")
    _index(tmp_path, 3, 3, "Unified", "300M")
    got = C.cpu_caches(tmp_path)
    assert [(c["level"], c["type"], c["bytes"]) for c in got] == [
        (1, "Data", 48 * 1024), (1, "Instruction", 32 * 1024), (2, "Unified", 2 * 2**20),
        (3, "Unified", 300 * 2**20)]
    assert got[-1]["shared_cpus"] == "0-1"
    assert C.last_level_cache_bytes(got) == 300 * 2**20


def test_last_level_skips_instruction_caches_and_bad_entries(tmp_path):
    _index(tmp_path, 0, 1, "Data", "32K")
    _index(tmp_path, 1, 2, "Instruction", "1M")  # odd, but never the data path
    _index(tmp_path, 2, 3, "Unified", "n/a")  # unreadable: skipped, not a crash
    assert C.last_level_cache_bytes(C.cpu_caches(tmp_path)) == 32 * 1024
    assert C.last_level_cache_bytes([]) is None
    assert C.cpu_caches(tmp_path / "absent") == []  # a fake root never falls back to this machine


def test_this_machine_reports_something_sane():
    llc = C.last_level_cache_bytes()
    assert llc is None or 2**15 <= llc <= 2**34  # 32 KiB .. 16 GiB
