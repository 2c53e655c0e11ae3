"""``python -m recipe.plan``: the capacity planner (recipe/plan/cli.py)."""

import sys

from recipe.plan.cli import main

if __name__ == "__main__":
    sys.exit(main())
