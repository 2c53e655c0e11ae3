"""``python -m recipe.tools.report``: plots and a summary of runs (recipe/tools/report/cli.py)."""

import sys

from recipe.tools.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
