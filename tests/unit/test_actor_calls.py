"""Calls on other processes' actors go through typed clients, read from the source with ``ast``.

A Ray handle dispatches any attribute name and its results are untyped, so ``h.method.remote(...)``
written where the handle is used is a call that no type checker follows: a renamed method or a
wrong argument fails in another process at run time. Each actor is called through its client
module instead, which names each call with its arguments and what its ObjectRef resolves to:

    CLIENT_MODULES   the only product files where an actor method is called with ``.remote``

Starting an actor (``ray.remote(Cls).options(...).remote(...)``) is no method call and is
allowed anywhere: its receiver is a call, not an attribute of a handle.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("recipe", "fully_async_policy", "one_step_off")
CLIENT_MODULES = {
    "recipe/workers/rollout/client.py": "the rollout workers (ReplicaClient)",
    "recipe/checkpoint_engine/clients.py": "the two ends of a weight push",
    "recipe/workers/trainer/ranks.py": "the trainer rank actors (TrainerRanks)",
    "fully_async_policy/driver/clients.py": "the rollouter and the queue, the trainer's end",
    "fully_async_policy/rollouter/clients.py": "the queue, the rollouter's end",
    "recipe/workers/judge_server.py": "the judge server's start, readiness and stop",
    "recipe/reward/judge/remote.py": "the judge server's calls from a reward function",
}


def actor_method_calls(source: str) -> list[tuple[int, str]]:
    """(line, ``handle.method``) of every ``<expr>.<method>.remote(...)`` in ``source``
    whose ``<expr>`` is not itself a call (``ray.remote(C).options(...).remote()`` starts an
    actor; ``handle.method.remote()`` calls one)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "remote" or not isinstance(node.func.value, ast.Attribute):
            continue
        method = node.func.value
        if isinstance(method.value, ast.Call):
            continue
        found.append((node.lineno, ast.unparse(method)))
    return found


def product_files() -> list[Path]:
    return sorted(p for pkg in PRODUCT_PACKAGES for p in (REPO / pkg).rglob("*.py"))


def test_the_detector_tells_a_method_call_from_an_actor_start():
    source = (
        "ray.get(h.ready.remote())\n"
        "x = await self.queue.put.remote(g)\n"
        "a = ray.remote(C).options(name='n').remote(1)\n"
        "b = ray.remote(num_cpus=0)(C).remote()\n"
        "f.remote(1)\n"
    )
    assert actor_method_calls(source) == [(1, "h.ready"), (2, "self.queue.put")]


def test_actor_methods_are_called_only_in_client_modules():
    outside = [
        f"{path.relative_to(REPO)}:{line}: {call}.remote(...)"
        for path in product_files()
        if str(path.relative_to(REPO)) not in CLIENT_MODULES
        for line, call in actor_method_calls(path.read_text())
    ]
    assert not outside, "an actor method called outside its client module:\n" + "\n".join(outside)


def test_every_client_module_exists_and_calls_an_actor():
    for name in CLIENT_MODULES:
        path = REPO / name
        assert path.is_file(), f"{name} is listed as a client module but does not exist"
        assert actor_method_calls(path.read_text()), f"{name} calls no actor: drop it"
