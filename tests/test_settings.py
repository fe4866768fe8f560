import pytest

from labkit import settings as prof


def test_default_profile_is_small(monkeypatch):
    monkeypatch.delenv("LABKIT_PROFILE", raising=False)
    p = prof.profile()
    assert p.name == "small" and p.llm == "smollm2-135m" and p.device == "cpu"


def test_full_profile_names_the_tutorials_models(monkeypatch):
    monkeypatch.setenv("LABKIT_PROFILE", "FULL")
    p = prof.profile()
    assert (p.llm, p.whisper, p.diffusion) == (
        "Qwen/Qwen3-4B", "large-v3", "stabilityai/stable-diffusion-xl-base-1.0")


def test_unknown_profile_says_what_to_use(monkeypatch):
    monkeypatch.setenv("LABKIT_PROFILE", "huge")
    with pytest.raises(ValueError, match="small"):
        prof.profile()


def test_study_reads_labkit_study(monkeypatch):
    monkeypatch.delenv("LABKIT_STUDY", raising=False)
    assert prof.study() is False
    monkeypatch.setenv("LABKIT_STUDY", "1")
    assert prof.study() is True
    monkeypatch.setenv("LABKIT_STUDY", "0")
    assert prof.study() is False
    monkeypatch.setenv("LABKIT_STUDY", "yes")
    with pytest.raises(ValueError, match="LABKIT_STUDY='yes'.*set it to 1"):
        prof.study()


def test_threads(monkeypatch):
    monkeypatch.setenv("LABKIT_THREADS", "1")
    assert prof.default_threads() == 1
    monkeypatch.delenv("LABKIT_THREADS")
    monkeypatch.setattr(prof.os, "cpu_count", lambda: 2)
    assert prof.default_threads() == 1
    import torch

    before = torch.get_num_threads()
    try:
        assert prof.set_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "c"))
    assert prof.cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()


def test_torch_threads_sets_and_restores_even_on_error():
    import torch

    from labkit.settings import torch_threads

    before = torch.get_num_threads()
    with torch_threads(before + 1) as n:
        assert n == torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(before + 1):
        raise RuntimeError("the work failed")
    assert torch.get_num_threads() == before


def test_watched_means_a_terminal_or_a_jupyter_server_kernel(monkeypatch):
    class Pipe:
        def isatty(self):
            return False

    monkeypatch.setattr("sys.stderr", Pipe())
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    assert prof.watched() is False  # nbclient, papermill, nbmake: output saved into a page
    monkeypatch.setenv("JPY_SESSION_NAME", "notebooks/02_metrics.ipynb")
    assert prof.watched() is True  # a kernel JupyterLab started: a person watches
