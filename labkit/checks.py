"""``check(condition, claim)``: how every chapter asserts that what it taught held here.

Prints ``CHECK ok   claim`` (``make lab-<chapter>`` collects these lines) or raises
``AssertionError`` with the claim and the measured detail, so CI fails when a chapter
stops demonstrating its point.
"""

from __future__ import annotations


def check(condition: bool, claim: str, detail: str = "") -> None:
    """Assert ``condition``; print the claim with its measured ``detail``."""
    suffix = f"  ({detail})" if detail else ""
    if not condition:
        print(f"CHECK FAIL {claim}{suffix}", flush=True)
        raise AssertionError(f"{claim}{suffix}")
    print(f"CHECK ok   {claim}{suffix}", flush=True)
