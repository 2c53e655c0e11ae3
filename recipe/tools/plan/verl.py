"""``python -m recipe.tools.plan --verl``: the planner against verl's published speedups.

verl publishes (docs/advance/fully_async.md and one_step_off.md; Qwen2.5-Math-7B, DAPO, H20,
n = 16, 512 prompts per sync step) the phase times of each colocated sync run and of each
async run, and the async runs' total time over sync's:

    fully_async, N/2:N/2 GPUs, T=4, require_batches=4 (R=128), staleness 0.5, partial rollout:
        32 GPUs 1.72-2.66x, 64 GPUs 1.83-2.09x, 128 GPUs 2.35-2.67x over colocated sync
        (after 100..400 steps: response lengths change during training)
    one_step_off, 16 GPUs, 4 rollout : 12 trainer: +23% (FSDP2), +40% (Megatron)

The planner gets what it gets from our own runs, the costs of the pieces, and predicts the
pipeline: the trainer's seconds per sample (verl's update_actor, + old_log_prob where the
mode computes it, measured on the trainer's own GPUs), the generation engines, a push of
5 s and the rest of verl's sync step (~11 s per 512 prompts) as per-step overhead. verl does
not publish response lengths or engine speeds, so these are assumptions:

  * response lengths lognormal with sigma 0.9, clipped at each run's max response length
    (28K; one-step-off 20K, Megatron 8K). The median is 2,000 tokens (mean ~3,000, the DAPO
    runs' typical range) in the one-step-off FSDP2 run; in every other run it is set so that
    the simulated colocated sync batch takes that run's published gen time (its responses
    got longer or shorter as its training went);
  * every engine is one GPU with max_num_seqs 1024 (verl's default). Its tokens/s when full
    and a lone sequence's tokens/s are fitted to the one run that publishes generation
    times on two GPU counts (one-step-off FSDP2: a batch takes 321 s colocated on 16 GPUs,
    458 s on its 4 rollout GPUs); the other runs use that engine unchanged.

Nothing is fitted to an async run's step time or speedup: those are the predictions.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from recipe.tools.plan.modes import simulate
from recipe.tools.plan.spec import Layout, Workload

BATCH_PROMPTS = 512
N_RESPONSES = 16
SAMPLES = BATCH_PROMPTS * N_RESPONSES
PUSH_S = 5.0
SEED = 0
MAX_NUM_SEQS = 1024
"""verl's rollout default (actor_rollout_ref.rollout.max_num_seqs)."""


@dataclass(frozen=True)
class SyncPhases:
    """A colocated sync step as verl publishes it (seconds per 512-prompt step)."""

    gpus: int
    step_s: float
    gen_s: float
    old_log_prob_s: float
    update_s: float

    @property
    def overhead_s(self) -> float:
        return self.step_s - self.gen_s - self.old_log_prob_s - self.update_s


@dataclass(frozen=True)
class AsyncCase:
    """One published async run: its sync baseline and its trainer's costs."""

    name: str
    sync: SyncPhases
    trainer_gpus: int
    rollout_gpus: int
    train_s: float
    """Trainer seconds per 512 prompts on its own GPUs (update, + old log-prob if any)."""
    max_tokens: int
    published: tuple[float, float]
    """Speedup over sync (low, high) as published."""
    published_step_s: float
    """The async run's published seconds per 512 prompts."""
    published_gen_s: float | None = None
    """Generation time of a batch on the rollout GPUs, where published."""
    median_tokens: float = 2000.0
    """Median response length (fitted per run, see ``fit_lengths``)."""


def _case(name, sync, split, train_s, max_tokens, published, step_s, gen=None) -> AsyncCase:
    trainer_gpus, rollout_gpus = split
    return AsyncCase(
        name, sync, trainer_gpus, rollout_gpus, train_s, max_tokens, published, step_s, gen
    )


# name, colocated sync, (trainer, rollout) GPUs, trainer s per 512 prompts, max response,
# published speedup, published async s per 512 prompts, published gen s on the rollout GPUs
FULLY_ASYNC = (
    _case(
        "fully_async 16:16",
        SyncPhases(32, 790.10, 357.41, 107.71, 313.81),
        (16, 16),
        269.80,
        28_000,
        (1.72, 2.66),
        294.77,
    ),
    _case(
        "fully_async 32:32",
        SyncPhases(64, 365.28, 150.72, 70.26, 133.41),
        (32, 32),
        156.98,
        28_000,
        (1.83, 2.09),
        189.26,
    ),
    _case(
        "fully_async 64:64",
        SyncPhases(128, 356.30, 177.85, 53.92, 113.81),
        (64, 64),
        113.16,
        28_000,
        (2.35, 2.67),
        150.63,
    ),
)
ONE_STEP_OFF = (
    _case(
        "one_step_off FSDP2 12:4",
        SyncPhases(16, 749, 321, 88, 286),
        (12, 4),
        108 + 337,
        20_480,
        (1.23, 1.23),
        520,
        458,
    ),
    _case(
        "one_step_off Megatron 12:4",
        SyncPhases(16, 699, 207, 119, 344),
        (12, 4),
        120 + 347,
        8_192,
        (1.40, 1.40),
        566,
        501,
    ),
)


@functools.cache
def lengths(max_tokens: int, median: float, count: int = 20_000) -> tuple[int, ...]:
    rng = random.Random(SEED)
    draws = (rng.lognormvariate(math.log(median), 0.9) for _ in range(count))
    return tuple(min(max_tokens, round(x)) for x in draws)


@dataclass(frozen=True)
class Engine:
    """One engine (one H20 GPU, 7B): tokens/s when full, tokens/s of a lone sequence."""

    engine_tps: float
    seq_tps: float


def _workload(case: AsyncCase, engine: Engine, train_s: float, prompts: int) -> Workload:
    return Workload(
        n=N_RESPONSES,
        prompts_per_step=prompts,
        lengths=lengths(case.max_tokens, case.median_tokens),
        engine_tps=engine.engine_tps,
        seq_tps=engine.seq_tps,
        train_s_per_sample=train_s / SAMPLES,
        sync_s=PUSH_S,
        step_overhead_s=case.sync.overhead_s * prompts / BATCH_PROMPTS,
        max_num_seqs=MAX_NUM_SEQS,
    )


@functools.cache
def gen_s(case: AsyncCase, engines: int, engine: Engine) -> float:
    """Simulated time to generate one 512-prompt batch on ``engines`` engines."""
    workload = replace(_workload(case, engine, 0.0, BATCH_PROMPTS), sync_s=0.0, step_overhead_s=0.0)
    return simulate(workload, Layout("sync", engines=engines), 1).wall_s


def _bisect(too_slow: Callable[[float], bool], lo: float, hi: float, rel: float = 0.003) -> float:
    """The smallest x in [lo, hi] (geometric bisection) for which ``too_slow(x)`` is False."""
    while hi / lo > 1 + rel:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if too_slow(mid) else (lo, mid)
    return hi


def fit_engine(case: AsyncCase) -> Engine:
    """The engine for which the simulation reproduces both published generation times of
    ``case``: the colocated sync batch on all its GPUs and the batch on the rollout GPUs.
    A faster lone sequence shortens the tail, which only the colocated time feels."""
    assert case.published_gen_s is not None
    published_gen_s = case.published_gen_s

    def on_rollout_gpus(seq_tps: float) -> Engine:
        return Engine(
            _bisect(
                lambda tps: gen_s(case, case.rollout_gpus, Engine(tps, seq_tps)) > published_gen_s,
                100.0,
                1e6,
            ),
            seq_tps,
        )

    seq_tps = _bisect(
        lambda tps: gen_s(case, case.sync.gpus, on_rollout_gpus(tps)) > case.sync.gen_s, 20.0, 5e3
    )
    return on_rollout_gpus(seq_tps)


def fit_lengths(case: AsyncCase, engine: Engine) -> AsyncCase:
    """``case`` with the median response length at which its colocated sync batch takes the
    published gen time on ``engine`` (runs differ in how long their responses got)."""
    median = _bisect(
        lambda m: gen_s(replace(case, median_tokens=m), case.sync.gpus, engine) <= case.sync.gen_s,
        50.0,
        case.max_tokens,
    )
    return replace(case, median_tokens=median)


def predict(case: AsyncCase, engine: Engine) -> dict[str, float]:
    """Simulated async seconds per 512 prompts (and what it is made of)."""
    if case.name.startswith("fully_async"):
        per_step = BATCH_PROMPTS // 4  # ppo_mini_batch 32 x require_batches 4
        layout = Layout("fully_async", engines=case.rollout_gpus, steps_per_sync=4)
        steps, warmup = 48, 8
    else:
        per_step = BATCH_PROMPTS
        layout = Layout("one_step_off", engines=case.rollout_gpus)
        steps, warmup = 8, 2
    run = simulate(_workload(case, engine, case.train_s, per_step), layout, steps)
    return {
        "async_s": SAMPLES / run.steady_samples_per_s(warmup),
        "trainer_idle": run.trainer_idle_ratio,
        "sync_gen_s": gen_s(case, case.sync.gpus, engine),
        "rollout_gen_s": gen_s(case, case.rollout_gpus, engine),
    }


def compare_with_verl() -> None:
    print(__doc__.split("\n\n", 1)[1].strip() + "\n")
    engine = fit_engine(ONE_STEP_OFF[0])
    print(
        f"fitted on {ONE_STEP_OFF[0].name}: an engine generates {engine.engine_tps:,.0f} "
        f"tokens/s when full, a lone sequence {engine.seq_tps:.0f} tokens/s\n"
    )
    head = ("median tok", "async s/512", "verl", "speedup", "verl steps", "error", "verl total")
    print(f"{'run (trainer:rollout GPUs)':<28}" + "".join(f"{h:>12}" for h in head))
    for case in FULLY_ASYNC + ONE_STEP_OFF:
        case = case if case is ONE_STEP_OFF[0] else fit_lengths(case, engine)
        out = predict(case, engine)
        low, high = case.published
        total = f"{low:.2f}x" if low == high else f"{low:.2f}-{high:.2f}x"
        speedup = case.sync.step_s / out["async_s"]
        published = case.sync.step_s / case.published_step_s
        # A median at the length cap means even all-max responses are faster than verl's.
        capped = "*" if case.median_tokens >= 0.99 * case.max_tokens else " "
        print(
            f"{case.name:<28}{case.median_tokens:>11,.0f}{capped}{out['async_s']:>12.0f}"
            f"{case.published_step_s:>12.0f}{speedup:>11.2f}x{published:>11.2f}x"
            f"{speedup / published - 1:>+12.0%}{total:>12}"
        )
    print(
        "\nspeedup: verl's published sync step over the predicted async seconds per 512 "
        "prompts; verl steps: the same ratio of verl's published step times (what the "
        "prediction is compared with: error); verl total: the published total-time speedups, "
        "which also count validation and response lengths that change over the run. median tok: "
        "the response-length median at which the simulated colocated "
        "sync batch takes that run's published gen time (one-step-off FSDP2: assumed; *: "
        "the fit ended at the length cap, so the simulated batch is still faster than verl's)."
    )
