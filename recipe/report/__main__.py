"""``python -m recipe.report``: plots and a summary of runs (recipe/report/cli.py)."""

import sys

from recipe.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
