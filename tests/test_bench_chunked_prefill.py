"""benchmarks/chunked_prefill.py (chapter 05's long-prompt rounds on either engine): the skip where the
engine is missing, and the printed ratio and verdict from made-up rounds (the rounds themselves are
labkit.experiments.prefill_interference's, tested in test_prefill_interference.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from labkit.engines import vllm
from labkit.experiments import prefill_interference
from labkit.experiments.prefill_interference import Interference

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the benchmark imports _common from its own folder
    spec = importlib.util.spec_from_file_location("bench_chunked_prefill", BENCH / "chunked_prefill.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("_common", None)


def _rounds(whole, chunked):
    def measure(long, batches, rounds, threads, engine):
        assert batches == (2048, 64) and engine == "vllm" and len(whole) == rounds
        return {2048: Interference(2048, list(whole), [0.1] * rounds, [2.0] * rounds, 468),
                64: Interference(64, list(chunked), [0.1] * rounds, [3.0] * rounds, 468)}
    return measure


def test_a_missing_engine_is_skipped_with_its_reason(bench, monkeypatch, capsys):
    monkeypatch.setattr(vllm, "vllm_available", lambda: False)
    monkeypatch.setattr(vllm, "unavailable_reason", lambda: "run make serve-setup")
    assert bench.main(["--engine", "vllm"]) == 0
    assert "vLLM cannot run here: run make serve-setup; skipped" in capsys.readouterr().out


@pytest.mark.parametrize("chunked, verdict", [((0.5, 0.4, 0.6), "ok"), ((0.5, 1.5, 0.6), "MISS")])
def test_the_ratio_over_every_round_decides_the_target(bench, monkeypatch, capsys, tmp_path, chunked,
                                                        verdict):
    monkeypatch.setattr(vllm, "vllm_available", lambda: True)
    monkeypatch.setattr(prefill_interference, "measure", _rounds((2.0, 2.2, 2.1), chunked))
    out = tmp_path / "f.json"
    assert bench.main(["--engine", "vllm", "--rounds", "3", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"target >= 2x for the whole range: {verdict}" in printed
    figures = json.loads(out.read_text())
    assert figures["engine"] == "vllm" and figures["long_tokens"] == 468
    assert figures["stall_ratio"]["n"] == 3
