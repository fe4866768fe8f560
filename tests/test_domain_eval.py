import json

import pytest

from labkit.llm import domain_eval as de
from labkit.paths import DATA


def test_splits_are_disjoint_by_invoice_and_cover_every_field():
    train, held = de.load_items("invoices", "train"), de.load_items("invoices", "heldout")
    assert len(train) > 400 and len(held) >= 100
    assert not {de.text_of(i) for i in train} & {de.text_of(i) for i in held}
    assert {i["kind"] for i in held} == {"number", "date", "total"}
    assert len({i["id"] for i in train + held}) == len(train) + len(held)


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


def test_first_line_cuts_at_the_newline():
    assert de.first_line(" INV-1\nQ: date?") == "INV-1"
    assert de.first_line("The total is 12.00") == "The total is 12.00"


def test_ranking_and_bad_names():
    assert de.ranking({"a": 0.2, "b": 0.9, "c": 0.5}) == [["b"], ["c"], ["a"]]
    assert de.ranking_text({"a": 0.5, "b": 0.9, "c": 0.5}) == "b > a = c"
    with pytest.raises(ValueError, match="eval set"):
        de.load_items("mmlu")
    with pytest.raises(ValueError, match="split"):
        de.load_items("invoices", "test")
    assert json.loads((DATA / "evals" / "generic.jsonl").read_text().splitlines()[0])["split"] == "heldout"


def test_ties_are_not_disagreements():
    domain = {"base": 0.27, "tuned": 0.47, "int8": 0.53, "student": 0.13}
    assert de.discordant_pairs(domain, {"base": 0.33, "tuned": 0.33, "int8": 0.33, "student": 0.0}) == []
    flipped = {"base": 0.40, "tuned": 0.33, "int8": 0.33, "student": 0.0}
    assert de.discordant_pairs(domain, flipped) == [("base", "tuned"), ("base", "int8")]
