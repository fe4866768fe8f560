"""``python -m labkit.report``: the lab report for every chapter (see :mod:`labkit.report.build`)."""

import sys

from .build import main

sys.exit(main())
