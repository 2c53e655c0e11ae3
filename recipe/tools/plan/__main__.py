"""``python -m recipe.tools.plan``: the capacity planner (recipe/tools/plan/cli.py)."""

import sys

from recipe.tools.plan.cli import main

if __name__ == "__main__":
    sys.exit(main())
