"""The one helper the broken-implementation tests share (tests/test_lab_checks_*.py): a labkit
function recompiled from its own source with a line or two changed."""

import inspect
import textwrap


def mutated(fn, *edits: tuple[str, str]):
    """``fn`` recompiled from its own source with each ``(old, new)`` text edit; each ``old`` must occur
    exactly once, so an edit that no longer applies fails loudly."""
    src = textwrap.dedent(inspect.getsource(fn))
    for old, new in edits:
        assert src.count(old) == 1, f"{fn.__name__}'s source has {old!r} {src.count(old)} times, not once"
        src = src.replace(old, new)
    namespace = dict(fn.__globals__)
    exec(compile(src, inspect.getsourcefile(fn) or "<mutated>", "exec"), namespace)
    return namespace[fn.__name__]
