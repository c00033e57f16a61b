"""`python -m infra.plan`: the communication planner's command line (infra/plan/planner.py)."""

import sys

from infra.plan.planner import main

sys.exit(main())
