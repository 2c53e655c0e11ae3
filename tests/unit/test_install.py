"""``ci/install.py``: pip's settings become uv's flags, so uv resolves as pip would."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "install", Path(__file__).resolve().parents[2] / "ci" / "install.py"
)
assert _SPEC is not None and _SPEC.loader is not None
install = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(install)

PIP_CONFIG_LIST = """\
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca.crt'
global.constraint='/etc/pip/constraints.txt'
global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'
global.find-links='/opt/wheels'
global.index-url='https://mirror.example/simple'
user.index-url='https://other.example/simple'
"""


def test_pip_settings_become_the_same_uv_flags_and_environment():
    settings = install.parse_pip_config(PIP_CONFIG_LIST)
    args, env = install.uv_arguments(settings)
    assert args == [
        "--index-strategy", "unsafe-best-match", "--compile-bytecode",
        "--index-url", "https://other.example/simple",  # the user's file over the global
        "--extra-index-url", "file:///opt/a/simple",
        "--extra-index-url", "file:///opt/b/simple",
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/pip/constraints.txt",
    ]  # fmt: skip
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca.crt", "UV_HTTP_TIMEOUT": "180"}


def test_an_environment_variable_wins_over_a_config_file():
    settings = install.parse_pip_config(
        "global.index-url='https://file.example/simple'\n:env:.index-url='https://env.example/simple'\n"
    )
    args, _ = install.uv_arguments(settings)
    assert args[args.index("--index-url") + 1] == "https://env.example/simple"


def test_no_settings_leave_uv_on_its_defaults():
    assert install.uv_arguments(install.parse_pip_config("")) == (
        ["--index-strategy", "unsafe-best-match", "--compile-bytecode"],
        {},
    )
