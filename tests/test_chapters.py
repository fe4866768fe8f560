import json

import pytest

from labkit import chapters, cli


def test_every_notebook_has_a_short_name_and_no_outputs():
    named = set(chapters.CHAPTERS.values())
    for nb in chapters.NOTEBOOKS.glob("*.ipynb"):
        assert nb.name in named, f"{nb.name} has no short name in labkit/chapters.py"
        cells = json.loads(nb.read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        assert not any(c.get("outputs") or c.get("execution_count") for c in code)


def test_unknown_chapter():
    with pytest.raises(ValueError, match="available: setup"):
        chapters.notebook_path("nope")


def test_doctor_json(capsys):
    assert cli.main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] in ("cpu", "cuda", "mps")


def test_cli_reports_bad_settings_without_a_traceback(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_PROFILE", "bogus")
    assert cli.main(["doctor"]) == 2
    assert "unknown LABKIT_PROFILE" in capsys.readouterr().err
