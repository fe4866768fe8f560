import json
from collections.abc import Sequence

import pytest

from labkit.llm import domain_eval as de
from labkit.llm import shared_decode
from labkit.paths import DATA


def test_splits_are_disjoint_by_invoice_and_cover_every_field():
    train, dev, held = (de.load_items("invoices", s) for s in ("train", "dev", "heldout"))
    assert len(train) > 400 and len(dev) == 60 and len(held) == 180
    texts = [{de.text_of(i) for i in items} for items in (train, dev, held)]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    assert {i["kind"] for i in held} == {i["kind"] for i in dev} == {"number", "date", "total"}
    assert len({i["id"] for i in train + dev + held}) == len(train) + len(dev) + len(held)
    # the held-out invoices are the last 60, as before the dev split was carved from training
    assert [i["id"] for i in held][:2] == ["inv180-number", "inv180-date"]


def test_answers_are_normalized_strings_the_text_implies():
    for item in de.load_items("invoices", "heldout", limit=60):
        a = item["answer"]
        if item["kind"] == "date":
            y, m, d = a.split("-")
            assert len(y) == 4 and 1 <= int(m) <= 12 and 1 <= int(d) <= 28
        elif item["kind"] == "total":
            units, cents = a.split(".")
            assert units.isdigit() and len(cents) == 2 and units in de.text_of(item).replace(",", "")
        else:
            assert a in de.text_of(item)


def test_the_files_are_what_the_seeded_generator_writes(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_evals", DATA / "evals" / "make_evals.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write(tmp_path)
    for name in ("invoices.jsonl", "generic.jsonl"):
        assert (tmp_path / name).read_text() == (DATA / "evals" / name).read_text(), name


def test_generic_set_is_short_answer_two_shot():
    items = de.load_items("generic")
    assert {i["kind"] for i in items} == {"capital", "opposite", "plural", "sum"}
    for i in items:
        assert i["prompt"].count("\nA:") == 3 and "\n" not in i["answer"]
    sums = [i for i in items if i["kind"] == "sum"]
    a, b = sums[0]["prompt"].rsplit("What is ", 1)[1].split("?")[0].split(" + ")
    assert int(sums[0]["answer"]) == int(a) + int(b)


@pytest.mark.parametrize(("answer", "expected", "hit"), [
    ("2021-05-22", "2021-05-22", 1), (" 2021-05-22 ", "2021-05-22", 1), ("22.05.2021", "2021-05-22", 0),
    ("INV-17238.", "INV-17238", 0), ("paris", "Paris", 0), ("", "7", 0)])
def test_exact_match_is_exact(answer, expected, hit):
    assert de.exact_match(answer, expected) == hit


@pytest.mark.parametrize(("answer", "expected", "kind", "hit"), [
    ("22.05.2021", "2021-05-22", "date", 1), ("May 22, 2021", "2021-05-22", "date", 1),
    ("22 May 2021", "2021-05-22", "date", 1), ("2021/05/22", "2021-05-22", "date", 1),
    ("2021-05-23", "2021-05-22", "date", 0), ("the 22nd", "2021-05-22", "date", 0),
    ("$14,100.80", "14100.80", "total", 1), ("14.100.80", "14100.80", "total", 1),
    ("14100.8", "14100.80", "total", 0), ("", "14100.80", "total", 0),
    ("#inv-17238.", "INV-17238", "number", 1), ("INV-1723", "INV-17238", "number", 0)])
def test_normalized_match_forgives_the_format_not_the_content(answer, expected, kind, hit):
    assert de.normalized_match(answer, expected, kind) == hit
    if de.exact_match(answer, expected):
        assert hit


def test_few_shot_takes_each_field_in_turn_from_distinct_invoices():
    train = de.load_items("invoices", "train")
    shots = de.few_shot(train, 6, seed=0)
    assert [s["kind"] for s in shots] == ["date", "number", "total"] * 2
    assert len({de.text_of(s) for s in shots}) == 6 and all(s["split"] == "train" for s in shots)
    assert de.few_shot(train, 6, seed=0) == shots and de.few_shot(train, 6, seed=1) != shots


def test_compare_pairs_items_and_resamples_invoices():
    held = de.load_items("invoices", "heldout")[:30]
    a = [0] * 30
    b = [1 if i % 3 == 0 else 0 for i in range(30)]  # one field right on every invoice
    c = de.compare(a, b, held)
    assert c["diff"] == pytest.approx(1 / 3) and c["groups"] == 10 and c["b_only"] == 10 and c["a_only"] == 0
    assert c["lo"] == c["hi"] == pytest.approx(1 / 3)  # every invoice gains the same: no spread
    assert c["p"] == pytest.approx(2 / 2**10)


def test_separated_needs_a_significant_difference():
    many: dict[str, Sequence[int]] = {"a": [1] * 20 + [0] * 20, "b": [0] * 40, "c": [1] * 19 + [0] * 21}
    sep = de.separated(many)
    assert sep["a", "b"] == 1 and sep["b", "c"] == -1 and sep["a", "c"] == 0


def test_first_line_cuts_at_the_newline():
    assert shared_decode.first_line(" INV-1\nQ: date?") == "INV-1"
    assert shared_decode.first_line("The total is 12.00") == "The total is 12.00"


def test_ranking_and_bad_names():
    assert de.ranking({"a": 0.2, "b": 0.9, "c": 0.5}) == [["b"], ["c"], ["a"]]
    assert de.ranking_text({"a": 0.5, "b": 0.9, "c": 0.5}) == "b > a = c"
    with pytest.raises(ValueError, match="eval set"):
        de.load_items("mmlu")
    with pytest.raises(ValueError, match="split"):
        de.load_items("invoices", "test")
    with pytest.raises(ValueError, match="no items"):
        de.score(None, None, [])
    assert json.loads((DATA / "evals" / "generic.jsonl").read_text().splitlines()[0])["split"] == "heldout"
