"""benchmarks/_common.py, the setup the engine benchmarks share: options, the skip where an engine is
missing, llama.cpp's default threads filled in, and the closing JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from labkit.engines import llamacpp

_spec = importlib.util.spec_from_file_location(
    "bench_common", Path(__file__).resolve().parent.parent / "benchmarks" / "_common.py")
assert _spec and _spec.loader
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)


def test_setup_skips_a_missing_engine_with_its_reason(monkeypatch, capsys) -> None:
    monkeypatch.setattr(llamacpp, "llamacpp_available", lambda: False)
    monkeypatch.setattr(llamacpp, "unavailable_reason", lambda: "run make llamacpp")
    a, _ = common.setup(common.parser("Title line.\nmore", rounds=3, threads=True), "llamacpp", [])
    assert a is None and "llama.cpp cannot run here: run make llamacpp; skipped" in capsys.readouterr().out


def test_setup_fills_in_llamacpps_threads(monkeypatch) -> None:
    monkeypatch.setattr(llamacpp, "llamacpp_available", lambda: True)
    monkeypatch.setenv("LABKIT_LLAMACPP_THREADS", "3")
    a, t0 = common.setup(common.parser("T", rounds=3, threads=True), "llamacpp", ["--json", "x.json"])
    assert a.threads == 3 and a.rounds == 3 and a.json == "x.json" and t0 > 0
    a, _ = common.setup(common.parser("T", threads=True), "llamacpp", ["--threads", "1"])
    assert a.threads == 1 and "rounds" not in a
    with pytest.raises(ValueError, match="llamacpp"):
        common.unavailable("ollama")


def test_finish_writes_the_figures(tmp_path, capsys) -> None:
    assert common.finish(0.0, {"x": 1.5}, str(tmp_path / "f.json")) == 0
    assert json.loads((tmp_path / "f.json").read_text()) == {"x": 1.5}
    assert capsys.readouterr().out.startswith("total ")
