"""The trainer-side process of each mode in recipe/tools/plan/sim.py (one generator each), and
``simulate``, which runs a layout's mode.

Each yields commands to the simulation: ``("work", s)`` computes for ``s`` seconds at full
speed (slower under contention); ``("sleep", s)`` takes ``s`` seconds (a push: the engines
are paused, nothing else computes); ``("until", predicate)`` waits, idle, for groups;
``("drain", predicate)`` waits for in-flight groups before a push (not idle time, as in the
recipe's ``trainer/idle_ratio``). Each loop follows its recipe: recipe/sync_trainer.py,
one_step_off/trainer.py, fully_async_policy/driver/trainer.py and
fully_async_policy/rollouter/.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator

from recipe.tools.plan.sim import Command, SimGroup, Simulation
from recipe.tools.plan.spec import Layout, SimResult, Workload

Process = Generator[Command, None, None]


def _batch(sim: Simulation) -> list[SimGroup]:
    return [sim.start_group() for _ in range(sim.w.prompts_per_step)]


def _all_done(groups: list[SimGroup]) -> Callable[[], bool]:
    return lambda: all(g.done for g in groups)


def sync_process(sim: Simulation) -> Process:
    """Generate the batch, train it, push; nothing overlaps."""
    for _ in range(sim.num_steps):
        groups = _batch(sim)
        yield ("until", _all_done(groups))
        yield sim.train(sim.w.prompts_per_step * sim.w.n, sim.version, groups)
        sim.pause_engines()
        yield ("sleep", sim.w.sync_s)
        sim.version += 1
        sim.resume_engines(reprefill=False)
        sim.end_step()


def one_step_off_process(sim: Simulation) -> Process:
    """Batch k+1 generates on version k while batch k trains; the push waits for k+1."""
    pending = _batch(sim)
    for step in range(sim.num_steps):
        current = pending
        yield ("until", _all_done(current))
        last = step == sim.num_steps - 1
        pending = [] if last else _batch(sim)
        yield sim.train(sim.w.prompts_per_step * sim.w.n, sim.version, current)
        if pending:
            yield ("until", _all_done(pending))
        sim.pause_engines()
        yield ("sleep", sim.w.sync_s)
        sim.version += 1
        sim.resume_engines(reprefill=False)
        sim.end_step()


def fully_async_process(sim: Simulation) -> Process:
    """Streaming admission (the recipe's AdmissionController), R groups per step, a push
    every T steps; partial rollout pauses in-flight sequences across the push."""
    admission = sim.admission()
    queue: deque[SimGroup] = deque()
    state = {"admitting": True}

    def admit() -> None:
        while state["admitting"] and admission.can_admit():
            ticket = admission.admit(f"p{admission.num_admitted}")
            group = sim.start_group()
            group.ticket = ticket.ticket

    def on_done(group: SimGroup) -> None:
        queue.extend(admission.complete(group.ticket, group))

    sim.set_on_done(on_done)
    admit()
    per_step, steps_per_sync = sim.w.prompts_per_step, sim.layout.steps_per_sync
    trained = 0
    for step in range(1, sim.num_steps + 1):
        yield ("until", lambda: len(queue) >= per_step)
        groups = [queue.popleft() for _ in range(per_step)]
        trained += per_step
        yield sim.train(per_step * sim.w.n, sim.version, groups)
        if step % steps_per_sync == 0 or step == sim.num_steps:
            state["admitting"] = False
            if not sim.layout.partial_rollout:
                yield ("drain", lambda: not sim.in_flight())
            sim.pause_engines()
            yield ("sleep", sim.w.sync_s)
            sim.version += 1
            admission.open_window(sim.version, trained)
            sim.resume_engines(reprefill=sim.layout.partial_rollout)
            state["admitting"] = True
            admit()
        sim.end_step()


PROCESSES = {
    "sync": sync_process,
    "one_step_off": one_step_off_process,
    "fully_async": fully_async_process,
}


def simulate(workload: Workload, layout: Layout, num_steps: int, seed: int = 0) -> SimResult:
    """Simulate ``num_steps`` trainer steps of ``layout`` on ``workload``."""
    sim = Simulation(workload, layout, num_steps, seed)
    return sim.run(PROCESSES[layout.mode](sim))
