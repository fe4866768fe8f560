"""``python -m labkit.report``: the lab report for every chapter (see :mod:`labkit.report.build`).

Every claim gets its verdict, so the chapters' "Going further" studies run too: ``LABKIT_STUDY=1``
unless the caller set it (``LABKIT_STUDY=0`` leaves them out, their claims "not measured"); the
chapters' kernels inherit the variable."""

import os
import sys

from .build import main

os.environ.setdefault("LABKIT_STUDY", "1")
sys.exit(main())
