"""The lab report, every chapter: each quantitative claim of the tutorial checked on this machine.

``make report`` (``python -m labkit.report``) runs the chapters or reuses a fresh run of them
(:mod:`.build`), judges every row of the ledger ``data/claims/NN_<chapter>.toml`` (:mod:`.ledger`,
:mod:`.verdicts`, with the checks the report computes itself in :mod:`.computed`) against what each
chapter recorded (:mod:`labkit.results`), and writes ``reports/``: the claims table with its verdicts
counted per kind of evidence (:mod:`.page`), the executed chapters as pages that open offline
(:mod:`.site`), and this machine's figures beside those other machines left there (:mod:`.machines`).
"""
