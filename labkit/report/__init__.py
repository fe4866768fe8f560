"""The lab report, every chapter: each quantitative claim of the tutorial checked on this machine.

``make report`` (``python -m labkit.report``) runs the chapters or reuses a fresh run of them
(:mod:`.build`), judges every row of ``data/claims.toml`` (:mod:`.ledger`, :mod:`.verdicts`, with
the checks the report computes itself in :mod:`.computed`) against what each chapter recorded
(:mod:`labkit.results`), and writes ``reports/``: the claims table (:mod:`.page`) and the executed
chapters as pages that open offline (:mod:`.site`).
"""
