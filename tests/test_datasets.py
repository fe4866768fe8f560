"""labkit.serving.datasets (chapter 02): the prompt files vLLM's bench serve and GuideLLM read, and
labkit bench --dataset sending each of their prompts."""

import json

import pytest

from labkit.cli import main as labkit_main
from labkit.serving.datasets import load_dataset

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "Why is the sky blue?"},
                                  {"from": "gpt", "value": "Rayleigh scattering."}]},
    {"id": "b", "conversations": [{"from": "human", "value": "only one turn"}]},  # skipped, as vLLM does
    {"id": "c", "conversations": [{"from": "human", "value": "Name a prime."}, {"from": "gpt", "value": "7"}],
     "output_tokens": 5},
]


def test_sharegpt_takes_the_first_turn_and_skips_single_turns(tmp_path):
    f = tmp_path / "share.json"
    f.write_text(json.dumps(SHAREGPT))
    assert load_dataset(f) == [{"prompt": "Why is the sky blue?", "id": "a"},
                               {"prompt": "Name a prime.", "id": "c", "max_tokens": 5}]


def test_jsonl_reads_prompts_and_guidellms_output_length(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "one"}\n\n{"text": "two", "output_tokens_count": 7}\n')
    assert load_dataset(f) == [{"prompt": "one", "id": 1}, {"prompt": "two", "id": 3, "max_tokens": 7}]


@pytest.mark.parametrize(("content", "message"), [
    ('{"prompt": 3}\n', "no prompt"), ("not json\n", "not JSON"),
    ('{"prompt": "x", "max_tokens": 0}\n', ">= 1"),
    ('[{"turns": []}]', "no 'conversations'"), ("[{", "not JSON"),
    (json.dumps([SHAREGPT[1]]), "no usable prompt"),
])
def test_bad_files_say_what_they_lack(tmp_path, content, message):
    f = tmp_path / ("d.json" if content.startswith("[") else "d.jsonl")
    f.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_dataset(f)
    with pytest.raises(ValueError, match="no such file"):
        load_dataset(tmp_path / "missing.jsonl")


def test_bench_sends_each_prompt_of_the_file_once(srv, tmp_path):
    f = tmp_path / "p.jsonl"
    prompts = [f"prompt number {i}" for i in range(5)]
    f.write_text("".join(json.dumps({"prompt": p, "output_tokens": 3}) + "\n" for p in prompts))
    out = tmp_path / "out"
    code = labkit_main(["bench", "--base-url", srv.url, "--dataset", str(f), "--warmup", "0", "--no-progress",
                        "--out", str(out), "-c", "2"])
    assert code == 0
    sent = [json.loads(line) for line in (out / "c2.jsonl").read_text().splitlines()]
    assert sorted(r["prompt_id"] for r in sent) == [1, 2, 3, 4, 5]
    assert all(r["output_tokens"] == 3 and r["max_tokens"] == 3 for r in sent)


def test_dataset_and_synthetic_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        labkit_main(["bench", "--base-url", "http://127.0.0.1:9", "--dataset", "x.jsonl",
                     "--synthetic", "8", "8"])
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err
