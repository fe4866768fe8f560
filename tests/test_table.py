"""labkit.table.format_rows: the plain-text tables every chapter prints (chapters 02, 05, 06, 08)."""

from labkit.table import format_rows


def test_header_alignment_and_one_decimal():
    rows = [{"engine": "vLLM", "tok_s": 123.456, "requests": 8},
            {"engine": "transformers", "tok_s": 7.0, "requests": 16}]
    head, first, second = format_rows(rows).splitlines()
    assert head.split() == ["engine", "tok_s", "requests"]
    assert first.startswith("vLLM ") and first.endswith("  8") and "123.5" in first  # numbers right-aligned
    assert second.split() == ["transformers", "7.0", "16"]
    assert len({len(head), len(first), len(second)}) == 1  # columns line up
    assert head.index("tok_s") + len("tok_s") == first.index("123.5") + len("123.5")


def test_no_rows():
    assert format_rows([]) == "(no rows)"
