"""labkit.results.record: what every chapter keeps for the lab report. Incremental writes, one run per
process (a new run replaces the old values), numpy and torch scalars, strict JSON, bad input."""

import json
import subprocess
from typing import Any

import numpy as np
import pytest

from labkit import paths, results

MACHINE = ("cpu · Test CPU (x86_64, 2 cores / 2 threads, 8 GiB RAM, ISA avx2) · torch 0 · Linux", "cpu")
SOURCE = {"commit": "a" * 40, "dirty": False, "diff_sha": None}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """Results go to tmp_path; machine and git source are fixed (no torch import, no git call)."""
    monkeypatch.setenv(results.ENV_VAR, str(tmp_path))
    monkeypatch.setattr(results, "machine_key", lambda: MACHINE)
    monkeypatch.setattr(results, "source", lambda: SOURCE)
    monkeypatch.setenv("LABKIT_PROFILE", "small")
    return tmp_path


def strict(path):
    """The file as JSON, refusing NaN/Infinity (which json.dumps would write by default)."""
    def bad(c):
        raise AssertionError(f"non-standard JSON constant {c} in {path}")
    return json.loads(path.read_text(), parse_constant=bad)


def test_each_call_writes_the_file_with_its_header(folder):
    results.record("setup", "bandwidth_gbps", 16.8, "GB/s", "copy, median")
    data = strict(folder / "setup.json")  # on disk after the first call: a run killed now keeps it
    assert data["values"] == {"bandwidth_gbps": {"value": 16.8, "unit": "GB/s", "note": "copy, median",
                                                 "at": data["values"]["bandwidth_gbps"]["at"]}}
    assert (data["machine"], data["device"], data["commit"], data["dirty"], data["profile"]) == (
        MACHINE[0], "cpu", "a" * 40, False, "small")
    assert data["run"] == results.RUN_ID
    assert (data["chapter"], data["notebook"]) == ("setup", "00_setup.ipynb")
    results.record("setup", "compute_dtype", "float32")
    results.record("setup", "bandwidth_gbps", 17.0, "GB/s")  # same run: the key is overwritten
    values = strict(folder / "setup.json")["values"]
    assert list(values) == ["bandwidth_gbps", "compute_dtype"]
    assert values["bandwidth_gbps"]["value"] == 17.0 and values["compute_dtype"]["value"] == "float32"
    assert not list(folder.glob(".*.tmp")), "the temporary file of the atomic write must be gone"


def test_a_new_run_replaces_the_old_values(folder, monkeypatch):
    results.record("hardware", "old_key", 1.0)
    results.record("hardware", "kept_name", 2.0)
    first = strict(folder / "hardware.json")
    monkeypatch.setattr(results, "RUN_ID", "a-new-kernel-process")
    results.record("hardware", "kept_name", 3.0)
    data = strict(folder / "hardware.json")
    assert data["run"] == "a-new-kernel-process" != first["run"]
    assert data["values"].keys() == {"kept_name"} and data["values"]["kept_name"]["value"] == 3.0


def test_chapters_keep_separate_files(folder):
    results.record("setup", "x", 1)
    results.record("beyond", "y", 2)
    assert sorted(p.name for p in folder.iterdir()) == ["beyond.json", "setup.json"]
    assert (results.load("setup") or {})["values"]["x"]["value"] == 1 and results.load("concepts") is None


def test_numpy_and_torch_scalars_become_plain_json(folder):
    import torch

    cases = {"f32": (np.float32(1.5), 1.5), "i64": (np.int64(7), 7), "bool": (np.bool_(True), True),
             "zero_d": (np.array(2.25), 2.25), "tensor": (torch.tensor(0.5), 0.5), "int": (3, 3)}
    for key, (value, _) in cases.items():
        results.record("internals", key, value)
    values = strict(folder / "internals.json")["values"]
    for key, (_, expected) in cases.items():
        assert values[key]["value"] == expected and type(values[key]["value"]) is type(expected), key


def test_nonfinite_floats_are_null_with_a_label(folder):
    results.record("optimization", "nan", float("nan"))
    results.record("optimization", "inf", np.float64("-inf"))
    values = strict(folder / "optimization.json")["values"]
    assert values["nan"]["value"] is None and values["nan"]["nonfinite"] == "nan"
    assert values["inf"]["value"] is None and values["inf"]["nonfinite"] == "-inf"


@pytest.mark.parametrize("args, word", [
    (("nochapter", "k", 1), "chapter"),
    (("08", "k", 1), "chapter"),  # the short name only
    (("setup", "", 1), "key"),
    (("setup", "has space", 1), "key"),
    (("setup", "k", [1, 2]), "value"),
    (("setup", "k", np.array([1.0, 2.0])), "value"),
    (("setup", "k", {"a": 1}), "value"),
    (("setup", "k", 1, 5), "unit"),
])
def test_bad_input_is_a_value_error_naming_the_argument(folder, args, word):
    with pytest.raises(ValueError, match=word):
        results.record(*args)
    assert not list(folder.glob("*.json")), "nothing is written for a refused call"


def test_results_dir_follows_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(results.ENV_VAR, raising=False)
    assert paths.results_dir() == paths.REPO / "build" / "results"
    monkeypatch.setenv(results.ENV_VAR, str(tmp_path / "elsewhere"))
    assert results.results_path("beyond") == tmp_path / "elsewhere" / "beyond.json"


def test_machine_line_names_the_stable_fields():
    info: dict[str, Any] = {"device": "cuda", "torch": "2.13.0", "python": "3.11.7", "os": "Linux 6.1",
            "accelerator": {"name": "NVIDIA H100", "memory_bytes": 80 * 2**30, "compute_capability": "9.0",
                            "count": 1},
            "cpu": {"name": "Xeon", "arch": "x86_64", "physical_cores": 8, "logical_cores": 16,
                    "ram_bytes": 64 * 2**30, "ram_available_bytes": 1, "isa": ["avx2", "amx_bf16"]}}
    line = results.machine_line(info)
    assert line == ("cuda · NVIDIA H100 (80 GiB, compute capability 9.0, 1 GPU(s)) · Xeon (x86_64, 8 cores / "
                    "16 threads, 64 GiB RAM, ISA avx2 amx_bf16) · torch 2.13.0 · Python 3.11.7 · Linux 6.1")
    info["cpu"]["ram_available_bytes"] = 10**9  # free memory changes between runs; the line must not
    assert results.machine_line(info) == line


def test_source_tracks_only_what_the_chapters_run(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    for name in ("labkit/a.py", "notebooks/n.ipynb", "README.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    monkeypatch.setattr(results, "REPO", tmp_path)
    clean = results.source.__wrapped__()
    assert len(clean["commit"]) == 40 and clean["dirty"] is False and clean["diff_sha"] is None
    (tmp_path / "README.md").write_text("edited\n")  # not code the chapters run
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "index.html").write_text("<html>")
    (tmp_path / "labkit" / "report").mkdir()
    (tmp_path / "labkit" / "report" / "new.py").write_text("y\n")
    assert results.source.__wrapped__() == clean
    (tmp_path / "labkit" / "a.py").write_text("changed\n")
    one = results.source.__wrapped__()
    assert one["dirty"] is True and one["commit"] == clean["commit"] and one["diff_sha"]
    (tmp_path / "notebooks" / "new.ipynb").write_text("{}")  # an untracked notebook counts too
    two = results.source.__wrapped__()
    assert two["dirty"] and two["diff_sha"] != one["diff_sha"]
    assert results.source.__wrapped__() == two, "the digest is deterministic"


def test_seal_adds_what_the_run_used_after_its_last_record(folder, monkeypatch):
    monkeypatch.setattr(results, "used_sources", lambda: ["labkit/stats.py"])
    results.record("setup", "a", 1.0)
    before = strict(folder / "setup.json")
    # the closing cell imports one more module after the last record(): sealing counts it in the digest
    monkeypatch.setattr(results, "used_sources", lambda: ["labkit/stats.py", "labkit/table.py"])
    results.seal("setup")
    after = strict(folder / "setup.json")
    assert after["sources"] == ["labkit/stats.py", "labkit/table.py"] and after["digest"] != before["digest"]
    assert after["values"] == before["values"]
    results.seal("concepts")  # nothing recorded for it in this run: no file appears
    assert not (folder / "concepts.json").exists()
