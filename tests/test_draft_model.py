"""The draft-model experiment of chapter 06b (labkit.experiments.draft_model), on stand-in servers."""

import pytest

from labkit.engines import llamacpp, process
from labkit.engines.process import Server
from labkit.experiments import draft_model as dm


@pytest.fixture
def stand_ins(monkeypatch, tmp_path):
    """Three stand-in servers: the target writes 10 tokens in 100 ms, the draft in 25 ms, the target
    with its draft in 80 ms, having drafted 8 tokens and kept 6; started and stopped calls logged."""
    log: list[tuple] = []
    monkeypatch.setattr(llamacpp, "llamacpp_available", lambda: True)
    monkeypatch.setattr(dm, "target_file", lambda: tmp_path / "f32.gguf")
    monkeypatch.setattr(dm, "gguf_path", lambda: tmp_path / "q4.gguf")

    def start(gguf, extra=None, **_):
        name = "target + draft" if extra else "target" if gguf.name == "f32.gguf" else "draft"
        log.append(("start", name, tuple(extra or ())))
        return Server(url=name, pid=0, log=tmp_path / "log", model="m", proc=None,  # type: ignore[arg-type]
                      engine="llamacpp")

    def ask(url, prompt, max_tokens):
        log.append(("ask", url, prompt))
        ms = {"target": 100.0, "draft": 25.0, "target + draft": 80.0}[url]
        drafted, kept = (8, 6) if url == "target + draft" else (0, 0)
        return {"text": f"answer to {prompt}", "tokens": 10, "ms": ms, "drafted": drafted, "accepted": kept}

    monkeypatch.setattr(llamacpp, "start_llamacpp", start)
    monkeypatch.setattr(process, "stop", lambda srv: log.append(("stop", srv.url)))
    monkeypatch.setattr(dm, "_ask", ask)
    return log


def test_three_servers_up_at_once_asked_in_rotating_order(stand_ins):
    run = dm.measure(["a", "b"], k=3, rounds=3)
    starts = [e for e in stand_ins if e[0] == "start"]
    assert [s[1] for s in starts] == list(dm.SERVERS)
    assert "--spec-draft-n-max" in starts[1][2] and "3" in starts[1][2] and "-md" in starts[1][2]
    asked = [e[1] for e in stand_ins if e[0] == "ask"][::2]  # two prompts per server and round
    assert asked == [*dm.SERVERS, *dm.SERVERS[1:], dm.SERVERS[0], dm.SERVERS[2], *dm.SERVERS[:2]]
    assert [e[0] for e in stand_ins[-3:]] == ["stop"] * 3  # all stopped at the end
    assert run.tps["target"] == [100.0] * 3 and run.tps["draft"] == [400.0] * 3
    assert run.speedup["median"] == pytest.approx(1.25) and run.same == run.compared == 6


def test_counts_give_acceptance_tokens_per_pass_and_the_pass_cost(stand_ins):
    run = dm.measure(["a"], rounds=2)
    assert (run.drafted, run.accepted, run.emitted) == (16, 12, 20)
    assert run.acceptance["p"] == pytest.approx(0.75) and run.acceptance["lo"] < 0.75 < run.acceptance["hi"]
    assert run.tokens_per_pass == pytest.approx(20 / 8)  # 8 passes: each writes its kept drafts + 1
    # a pass: 2.5 tokens at 125 tok/s = 20 ms, of which 2 draft steps at 400 tok/s = 5 ms -> 15 ms = 1.5 steps
    assert run.pass_cost() == pytest.approx(1.5)
    assert run.if_pass_cost(1.5) == pytest.approx(run.speedup["median"])  # priced as measured
    assert run.if_pass_cost(1.0) == pytest.approx(2.5 / (2 * 0.25 + 1.0))


def test_a_server_that_never_drafts_is_an_error(stand_ins, monkeypatch):
    monkeypatch.setattr(dm, "_ask", lambda url, p, m: {"text": "x", "tokens": 4, "ms": 40.0, "drafted": 0,
                                                       "accepted": 0})
    with pytest.raises(RuntimeError, match="no draft tokens"):
        dm.measure(["a"], rounds=1)


def test_without_llamacpp_it_says_why(monkeypatch):
    monkeypatch.setattr(llamacpp, "llamacpp_available", lambda: False)
    with pytest.raises(RuntimeError):
        dm.measure(["a"])


def test_a_pair_of_its_own_starts_the_given_files(stand_ins, tmp_path):
    # the stand-in names a server by its file: the family pair's target must serve as "target" and as
    # "target + draft", its draft alone as "draft", and -md must name the draft file
    run = dm.measure(["a"], rounds=1, target=tmp_path / "f32.gguf", draft=tmp_path / "small.gguf")
    starts = [e for e in stand_ins if e[0] == "start"]
    assert [s[1] for s in starts] == list(dm.SERVERS)
    assert str(tmp_path / "small.gguf") in starts[1][2]
    assert run.compared == 1
