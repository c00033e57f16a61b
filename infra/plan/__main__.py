"""`python -m infra.plan`: the communication planner's command line (infra/plan/cli.py)."""

import sys

from infra.plan.cli import main

sys.exit(main())
