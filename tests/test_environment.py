"""pyproject.toml and environment.yml must pin the same versions."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pins(lines):
    pins = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)==([^;\s]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = _pins(project["dependencies"] + extras["test"] + extras["lab"])
    yml = (ROOT / "environment.yml").read_text().splitlines()
    conda = _pins(line.strip().lstrip("- ") for line in yml)
    python = re.search(r"python=3\.(\d+)", " ".join(yml))
    pins = re.match(r">=3\.(\d+),<3\.(\d+)", project["requires-python"])
    assert pins, project["requires-python"]
    low, high = pins.groups()
    assert python and int(low) <= int(python.group(1)) < int(high), (python, project["requires-python"])
    assert conda == wanted, {k: (wanted.get(k), conda.get(k)) for k in wanted.keys() | conda.keys()
                             if wanted.get(k) != conda.get(k)}


def test_every_runtime_dependency_is_pinned():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    unpinned = [d for d in project["dependencies"] if "==" not in d]
    assert not unpinned, f"pin these: {unpinned}"
