"""``python -m fully_async_policy [key=value ...]``: ``python -m recipe mode=fully_async``.

The same Hydra entry, config tree and run directory as ``python -m recipe``; only the mode
preset is fixed (a ``mode=`` given on the command line is refused, not silently overridden).
"""

import sys

from recipe.main import cli

if __name__ == "__main__":
    if any(arg.startswith("mode=") for arg in sys.argv[1:]):
        print(
            "error: python -m fully_async_policy runs mode=fully_async; drop the mode= key",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.argv.insert(1, "mode=fully_async")
    cli()
