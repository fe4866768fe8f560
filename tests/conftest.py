"""Fixtures shared by the tests of several chapters: the loopback fake server (chapter 02's
``labkit.engines.fakeserver``), tiny random Llama models (chapters 01, 03 and 06) and ``tools``, the
llama.cpp tools (chapters 02, 04, 05, 06 and 08)."""

import pytest

# The tiny Llama's config: every test that needs a real transformers model but not real weights.
TINY_LLAMA = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


@pytest.fixture(autouse=True, scope="session")
def _results_elsewhere(tmp_path_factory):
    """Figures that the code under test records (labkit functions record where they measure) go to a
    temporary folder, never over a chapter's own run in build/results."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LABKIT_RESULTS", str(tmp_path_factory.mktemp("results")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def _fake_server_session():
    from labkit.engines.fakeserver import fake_server

    with fake_server() as s:
        yield s


@pytest.fixture
def srv(request, _fake_server_session):
    """The fake OpenAI/Ollama server on 127.0.0.1 (one per test session), reset before every test:
    no stream in flight, ``requests`` and ``peak_active`` 0, options those of the test module's
    ``FAKE_SERVER_OPTS`` dict (default: the server's own defaults). A test may change ``srv.opts``."""
    from labkit.engines.fakeserver import reset

    return reset(_fake_server_session, **getattr(request.module, "FAKE_SERVER_OPTS", {}))


@pytest.fixture(scope="session")
def tiny_llama():
    """``tiny_llama(seed=0, **config)``: a random ``LlamaForCausalLM`` in eval mode, configured as
    :data:`TINY_LLAMA` updated with ``config``; ``torch.manual_seed(seed)`` first (``seed=None``:
    no seeding), so the same call gives the same weights."""

    def make(seed: int | None = 0, **config):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        if seed is not None:
            torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(**(TINY_LLAMA | config))).eval()

    return make


@pytest.fixture(scope="session")
def tools() -> None:
    """The llama.cpp tools ``make llamacpp`` builds: the test is skipped where they are not built,
    except under CI (:func:`labkit.engines.llamacpp.llamacpp_required`), where that is a failure."""
    from labkit.engines import llamacpp

    if not llamacpp.llamacpp_available():
        if llamacpp.llamacpp_required():
            pytest.fail(f"CI must build llama.cpp: {llamacpp.unavailable_reason()}")
        pytest.skip(llamacpp.unavailable_reason())
