"""``make venv``'s installer: ``uv pip install`` with pip's own settings, else pip.

    python ci/install.py VENV_PYTHON PIP_INSTALL_ARGS...

uv installs the same resolution as pip (the same indexes, find-links and constraints, read
from ``pip config list``: files and ``PIP_*`` variables alike) in a fraction of the time
(about 30 s against 4 minutes for this project's CPU stack on a 2-core machine). uv itself
comes from the package index into the venv; when it cannot be installed or fails, pip
installs instead, so a machine without uv is only slower. Standard library only: it runs
before anything is installed.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

_LINE = re.compile(r"^(?P<scope>[^.]*)\.(?P<key>[a-z-]+)=(?P<value>.*)$")
_LISTS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links"}
_LISTS |= {"constraint": "--constraint"}
_SCOPES = {":env:": 0, "site": 1, "user": 2, "global": 3}
"""pip's precedence of its settings' sources, first wins."""


def pip_settings(python: str) -> dict[str, list[str]]:
    """``pip config list``'s values by key (environment variables first: they win in pip)."""
    out = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    return parse_pip_config(out)


def parse_pip_config(out: str) -> dict[str, list[str]]:
    """``pip config list``'s output (``scope.key='value'`` lines) as values by key, the one
    pip uses first: environment variables, then the site's, the user's, the global file."""
    found: dict[str, list[tuple[int, str]]] = {}
    for line in out.splitlines():
        match = _LINE.match(line.strip())
        if match is None:
            continue
        raw = match["value"]
        value = ast.literal_eval(raw) if raw[:1] in "'\"" else raw
        rank = _SCOPES.get(match["scope"], len(_SCOPES))
        found.setdefault(match["key"], []).append((rank, str(value)))
    return {
        key: [v for _, v in sorted(values, key=lambda item: item[0])]
        for key, values in found.items()
    }


def uv_arguments(settings: dict[str, list[str]]) -> tuple[list[str], dict[str, str]]:
    """uv's flags and environment for the same resolution as pip's."""
    # pip weighs every index; pip compiles bytecode at install (else the first process to
    # import torch or transformers pays for it, seconds of CPU).
    args = ["--index-strategy", "unsafe-best-match", "--compile-bytecode"]
    if "index-url" in settings:
        args += ["--index-url", settings["index-url"][0]]
    if settings.get("no-index", ["false"])[0].lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    for key, flag in _LISTS.items():
        items = [item for value in settings.get(key, []) for item in value.split()]
        for item in dict.fromkeys(items):  # once each, in pip's order
            args += [flag, item]
    env: dict[str, str] = {}
    if "cert" in settings:
        env["SSL_CERT_FILE"] = settings["cert"][0]
    timeout = settings.get("default-timeout") or settings.get("timeout")
    if timeout:
        env["UV_HTTP_TIMEOUT"] = timeout[0]
    return args, env


def main(argv: list[str]) -> int:
    python, install_args = argv[0], argv[1:]
    uv = Path(python).parent / "uv"
    got_uv = subprocess.run([python, "-m", "pip", "install", "-q", "uv"], check=False)
    if got_uv.returncode == 0 and uv.is_file():
        args, env = uv_arguments(pip_settings(python))
        cmd = [str(uv), "pip", "install", "--python", python, *args, *install_args]
        if subprocess.run(cmd, env={**os.environ, **env}, check=False).returncode == 0:
            return 0
        print("install: uv failed; installing with pip instead", file=sys.stderr)
    else:
        print("install: uv is not available; installing with pip", file=sys.stderr)
    return subprocess.run([python, "-m", "pip", "install", *install_args], check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
