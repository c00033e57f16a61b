"""`python -m infra.planner`: the communication planner's command line (infra/planner/cli.py)."""

import sys

from infra.planner.cli import main

sys.exit(main())
