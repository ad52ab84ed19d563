"""`python -m gateway.cli ...`: the same entry point as the `fairserve` console script."""

import sys

from gateway.cli import main

sys.exit(main())
