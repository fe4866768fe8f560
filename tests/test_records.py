"""The request record (chapter 02): the JSONL line the load generator wrote before records were typed
reads back and writes out byte for byte, a run's file agrees with its in-memory records, and bad
lines say what is wrong."""

import json
from typing import cast

import pytest

from labkit.serving import loadgen, loadspec, records
from labkit.serving.records import RequestRecord, fail, finish_record, new_record

# Lines in the format `labkit bench` wrote before RequestRecord existed (one OpenAI-compatible
# request, one Ollama request with its server timings, one refused request).
OPENAI_LINE = (
    '{"backend": "openai-chat", "status": "ok", "error": null, "http_status": 200, "t_sent": 0.5, '
    '"t_end": 1.5078125, "chunks": [[0.25, 1], [0.5, 1], [0.75, 1], [1.0, 1]], "output_tokens": 4, '
    '"prompt_tokens": 18, "token_source": "usage-continuous", "text": "The KV cache keeps", "note": null, '
    '"id": 3, "prompt_id": "short-02", "phase": "run", "max_tokens": 4, "queue_s": 0.0, "ttft_s": 0.25, '
    '"tpot_s": 0.25, "e2e_s": 1.0, "itl_s": [0.25, 0.25, 0.25]}')
OLLAMA_LINE = (
    '{"backend": "ollama-generate", "status": "ok", "error": null, "http_status": null, "t_sent": 0.25, '
    '"t_end": 0.875, "chunks": [[0.125, 1], [0.5, 1]], "output_tokens": 2, "prompt_tokens": 1, '
    '"token_source": "usage", "text": "Hi!", "note": null, "server": {"eval_count": 2, '
    '"prompt_eval_count": 1, "eval_s": 0.25, "prompt_eval_s": 0.0625, "load_s": 0.0, "total_s": 0.5, '
    '"eval_tokens_per_s": 8.0}, "id": 0, "prompt_id": null, "phase": "run", "max_tokens": 8, '
    '"queue_s": 0.0, "ttft_s": 0.125, "tpot_s": 0.375, "e2e_s": 0.5, "itl_s": [0.375]}')
REFUSED_LINE = (
    '{"backend": "openai-chat", "status": "http_error", "error": "HTTP 500 from '
    'http://127.0.0.1:8000/v1/chat/completions: injected failure", "http_status": 500, "t_sent": 1.0, '
    '"t_end": 1.0625, "chunks": [], "output_tokens": null, "prompt_tokens": null, "token_source": null, '
    '"text": "", "note": null, "id": 4, "prompt_id": "long-01", "phase": "run", "max_tokens": 4, '
    '"queue_s": 0.125, "ttft_s": null, "tpot_s": null, "e2e_s": null, "itl_s": null}')


@pytest.mark.parametrize("line", [OPENAI_LINE, OLLAMA_LINE, REFUSED_LINE])
def test_todays_jsonl_lines_round_trip_unchanged(line):
    rec = RequestRecord.from_json(line)
    assert rec.to_json() == line


def test_a_line_becomes_typed_fields():
    rec = RequestRecord.from_json(OPENAI_LINE)
    assert rec.status == "ok" and rec.http_status == 200 and rec.id == 3 and rec.phase == "run"
    assert rec.chunks == [(0.25, 1), (0.5, 1), (0.75, 1), (1.0, 1)] and rec.output_tokens == 4
    assert records.request_metrics(rec)["tpot_s"] == pytest.approx(0.25)
    ollama = RequestRecord.from_json(OLLAMA_LINE)
    assert ollama.server is not None and ollama.server["eval_tokens_per_s"] == 8.0
    refused = RequestRecord.from_json(REFUSED_LINE)
    assert refused.status == "http_error" and "injected" in (refused.error or "") and refused.queue_s == 0.125


def test_to_json_shifts_times_cuts_text_and_keeps_memory_only_fields_out():
    rec = RequestRecord(backend="b", status="ok", t_sent=1000.5, t_end=1001.0, chunks=[(0.25, 2)],
                        output_tokens=2, text="x" * 500, t_run_start=1000.0)
    line = json.loads(rec.to_json(t0=1000.0))
    assert line["t_sent"] == 0.5 and line["t_end"] == 1.0 and len(line["text"]) == 300
    assert "t_run_start" not in line and "server" not in line
    assert line["ttft_s"] == 0.25 and line["itl_s"] == []  # both tokens came in the first chunk
    assert len(json.loads(rec.to_json(text_chars=None))["text"]) == 500
    assert rec.t_sent == 1000.5  # the record itself is untouched


def test_bad_lines_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"\['colour'\] are not request-record fields"):
        RequestRecord.from_json('{"status": "ok", "colour": "red"}')
    with pytest.raises(ValueError, match="must be a JSON object"):
        RequestRecord.from_json("[1, 2]")


def test_a_new_record_is_not_ok_until_a_client_says_so():
    rec = new_record("t")
    assert rec.status == "error" and rec.t_end is None and rec.t_sent > 0
    finish_record(rec, [(rec.t_sent + 0.1, "a", 1), (rec.t_sent + 0.2, "b", 2)])
    assert rec.status == "error" and rec.chunks == [(pytest.approx(0.1), 1), (pytest.approx(0.2), 1)]
    fail(rec, "timeout", "no data")
    assert rec.status == "timeout" and rec.error == "no data" and rec.t_end is not None


def test_a_runs_jsonl_agrees_with_its_records(srv, tmp_path):
    s = loadgen.run(srv.url, loadspec.LoadSpec(5, 2, max_tokens=3, warmup=1), out=tmp_path, progress=False)
    lines = (tmp_path / "c2.jsonl").read_text().splitlines()
    read = [RequestRecord.from_json(x) for x in lines]
    assert [r.phase for r in read] == ["warmup"] + ["run"] * 5
    run = sorted((r for r in read if r.phase == "run"), key=lambda r: cast(int, r.id))
    for mem, disk in zip(s.requests, run, strict=True):
        assert (disk.id, disk.status, disk.output_tokens, disk.chunks) == (mem.id, mem.status,
                                                                           mem.output_tokens, mem.chunks)
        assert disk.t_sent == pytest.approx(mem.t_sent - (mem.t_run_start or 0.0))
    assert [x.to_json() for x in read] == lines  # what was written reads back and writes out the same
