"""Where the tests find the third-party data they read but the repository does not hold
(GSM8K, MATH): ``$RECIPE_SHARED_DATA`` when set, else ``../shared/data`` beside the checkout.
A clone elsewhere (a CI runner's work folder) names the folder in that variable; without
it, the tests that need the data skip and say where they looked."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def shared_data(name: str) -> Path:
    """The folder of data set ``name`` (``gsm8k``, ``math``)."""
    base = os.environ.get("RECIPE_SHARED_DATA") or REPO.parent / "shared" / "data"
    return Path(base) / name
