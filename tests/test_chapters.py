import json

import pytest

from labkit import chapters, cli, jupyter, paths


def test_every_notebook_has_a_short_name_and_no_outputs():
    named = set(chapters.CHAPTERS.values())
    for nb in paths.NOTEBOOKS.glob("*.ipynb"):
        assert nb.name in named, f"{nb.name} has no short name in labkit/chapters.py"
        cells = json.loads(nb.read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        assert not any(c.get("outputs") or c.get("execution_count") for c in code)


def test_unknown_chapter():
    with pytest.raises(ValueError, match="available: setup"):
        chapters.notebook_path("nope")


@pytest.mark.parametrize("name", ["concepts", "01", "1", "01_key_concepts", "key_concepts",
                                  "01_key_concepts.ipynb", "key-concepts", "Concepts"])
def test_every_name_form_finds_the_chapter(name):
    assert chapters.resolve(name) == "concepts"
    assert chapters.notebook_path(name) == paths.NOTEBOOKS / "01_key_concepts.ipynb"


def test_name_forms_of_every_chapter_are_unambiguous():
    for short in chapters.available():
        for form in chapters.names(short):
            assert chapters.resolve(form) == short, (short, form)
    assert chapters.names("hardware") == ("hardware", "04", "04_gpu_hardware", "gpu_hardware")


def test_unknown_chapter_lists_all_three_forms():
    with pytest.raises(ValueError) as e:
        chapters.notebook_path("key_concept")
    msg = str(e.value)
    assert "'key_concept'" in msg and "concepts (01 or 01_key_concepts)" in msg
    assert "setup (00 or 00_setup)" in msg


def test_planned_chapter_without_notebook_is_unknown(monkeypatch):
    monkeypatch.setattr(chapters, "available", lambda: {"setup": "00_setup.ipynb"})
    with pytest.raises(ValueError, match="available: setup"):
        chapters.resolve("06")


def test_lab_command_allows_root_only_for_uid_0(tmp_path):
    root = jupyter.lab_command(0, notebooks=tmp_path, python="py")
    user = jupyter.lab_command(1000, notebooks=tmp_path, python="py")
    assert root == ["py", "-m", "jupyterlab", str(tmp_path), "--allow-root"]
    assert user == ["py", "-m", "jupyterlab", str(tmp_path)]


def test_lab_command_host_and_port():
    cmd = jupyter.lab_command(1000, host="0.0.0.0", port="8888")
    assert cmd[4:] == ["--ip=0.0.0.0", "--port=8888", "--ServerApp.port_retries=0"]
    assert not any(a.startswith(("--ip", "--port")) for a in jupyter.lab_command(1000, "", ""))
    for bad in ("x", "0", "70000"):
        with pytest.raises(ValueError, match="not a TCP port"):
            jupyter.lab_command(1000, port=bad)


@pytest.mark.parametrize("uid", [0, 1000])
def test_lab_main_uses_this_process_uid(monkeypatch, capsys, uid):
    monkeypatch.setattr(jupyter.os, "getuid", lambda: uid)
    assert jupyter.main(["--dry-run", "--port", "8890"]) == 0
    out = capsys.readouterr().out
    assert ("--allow-root" in out) == (uid == 0) and "--port=8890" in out
    assert jupyter.main(["--dry-run", "--port", "nope"]) == 2


def test_doctor_json(capsys):
    assert cli.main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] in ("cpu", "cuda", "mps")


def test_cli_reports_bad_settings_without_a_traceback(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_PROFILE", "bogus")
    assert cli.main(["doctor"]) == 2
    assert "unknown LABKIT_PROFILE" in capsys.readouterr().err
