"""The one local Ray of an integration module.

A module that needs Ray asks for ``ray_for_module`` (a test argument, or
``pytest.mark.usefixtures`` for every test of the module). Ray starts at the first test that
asks and shuts down after the module's last test, so no module inherits another's actors.
It starts the way a run starts it (``recipe.run.placement.init_ray``): workers get the
run's environment (tiny-model cache, quiet vLLM, offline hubs), and a recipe built inside the
module joins this Ray instead of starting its own.

Size: the module's ``RAY_NUM_CPUS`` if it sets one, else ``DEFAULT_RAY_NUM_CPUS``. Logical CPUs
only bound how many actors run at once; the machine's cores are shared either way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType

import pytest

DEFAULT_RAY_NUM_CPUS = 2
"""One trainer rank and one engine replica: the tiny runs' shape (the recipe's actors that
hold no CPU, rollouter and message queue, fit beside them)."""
KV_CACHE_GIB = "1"
"""vLLM-CPU's KV cache per engine (``VLLM_CPU_KVCACHE_SPACE``, GiB) unless the caller set one:
the tiny models need a few MiB, and several engines share this machine's memory."""


@pytest.fixture(scope="module")
def ray_for_module(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """A local Ray of ``RAY_NUM_CPUS`` logical CPUs for this module; yields the ``ray`` module."""
    import ray

    from recipe.config import RayConfig
    from recipe.run.placement import init_ray

    if ray.is_initialized():
        raise RuntimeError(
            f"{request.module.__name__}: a Ray from an earlier test is still up; the module "
            "that started it must shut it down (use ray_for_module)"
        )
    num_cpus = getattr(request.module, "RAY_NUM_CPUS", DEFAULT_RAY_NUM_CPUS)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB))
        init_ray(RayConfig(num_cpus=num_cpus))
        try:
            yield ray
        finally:
            ray.shutdown()
