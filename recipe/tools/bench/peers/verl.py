"""verl's side of the peer benchmark under the shared ``Terms``, two systems:

    verl        ``python -m verl.trainer.main_ppo``: GRPO, FSDP, vLLM rollout colocated on one
                GPU, its synchronous hybrid engine
    verl_async  ``python -m verl.experimental.fully_async_policy.fully_async_main``: verl's
                fully async trainer with no rollout GPUs of its own (``rollout.nnodes=0``) and
                dynamic resource scheduling, so its rollout replica lives on the trainer's GPU
                ("only hybrid"): the replica generates until a sync window's samples are
                queued, sleeps while the trainer trains, and wakes with the new weights. verl's
                one-step-off trainer cannot run on one GPU: it asserts ``not hybrid_engine``
                and its rollout replicas take GPUs of their own beside the trainer's.
                Asynchronous settings: ours (``bench.e2e.ASYNC``)

and the figures read back from verl's ``file`` logger (``{"step": N, "data": {...}}`` per
line: one per step for ``verl``; one per weight sync for ``verl_async``).

verl runs from its own folder of wheels (``ci/pack_verl.sh``: verl 0.9.1, transformers 5.9,
tensordict, ...) first on its ``PYTHONPATH``, beside our GPU kit's vLLM and Ray. Settings that
differ from verl's defaults, and why:

    attn_implementation=sdpa        flash-attn has no wheel for CUDA 13 + torch 2.11
    use_fused_kernels=True          without flash-attn, verl's log-probs otherwise loop over
                                    tokens in Python (``logprobs_from_logits_v2``); its fused
                                    path (torch backend, no extra kernels) computes them from
                                    the hidden states: on the H200 its log-prob pass took
                                    1.5 s instead of 6.3 s, its update 2.0 s instead of 17.3 s
    use_remove_padding=False        without flash-attn, packed rows go through sdpa with a
                                    dense (tokens x tokens) mask: padded rows are cheaper
    use_dynamic_bsz=True            token-budget micro-batches (ours are on by default too)
    gradient checkpointing off      as ours: a small model on a 141 GB GPU
    optimizer, clipping             ours (AdamW betas 0.9/0.99, no weight decay, clip
                                    0.2/0.28), so both take the same update
    tensor_model_parallel_size=1    one GPU
    logger console+file             the file is what this module reads; no wandb
    fewer helper actors             agent-loop, reward and storage workers sized for one GPU
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from recipe.tools.bench.e2e import ASYNC
from recipe.tools.bench.peers import verl_reward
from recipe.tools.bench.peers.result import StepRow, read_metric_records
from recipe.tools.bench.peers.terms import Terms

REPO = Path(__file__).resolve().parents[4]
METRICS_FILE = "metrics.jsonl"
SYSTEMS = ("verl", "verl_async")
ENTRY = {
    "verl": "verl.trainer.main_ppo",
    "verl_async": "verl.experimental.fully_async_policy.fully_async_main",
}
_PHASE_KEYS = {  # each phase: the first of its keys a line has
    "gen": ("timing_s/gen",),
    "wait": ("timing_s/wait_for_enough_samples",),
    "old_log_prob": ("timing_s/old_log_prob",),
    "ref": ("timing_s/ref",),
    "update": ("timing_s/update_actor",),
    "sync": ("timing_s/update_weights", "timing_s/param_sync", "timing_s/timing_s/param_sync"),
}
_STEP_KEY = "training/global_step"
_ACCURACY_SUFFIX = "/acc/mean@1"


def verl_overrides(terms: Terms) -> dict[str, Any]:
    """verl's Hydra overrides for ``terms`` (module docstring: what differs from its
    defaults)."""
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"
    return {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.train_files": terms.train_file,
        "data.val_files": terms.val_file,
        "data.prompt_key": "prompt",
        "data.max_prompt_length": terms.max_prompt_length,
        "data.max_response_length": terms.response_length,
        "data.train_batch_size": terms.prompts,
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "data.dataloader_num_workers": 2,
        "data.seed": terms.seed,
        "actor_rollout_ref.model.path": terms.model,
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.model.use_remove_padding": False,
        "actor_rollout_ref.model.use_fused_kernels": True,
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
        f"{actor}.optim.lr": terms.lr,
        f"{actor}.optim.betas": "[0.9,0.99]",
        f"{actor}.optim.weight_decay": 0.0,
        f"{actor}.clip_ratio_low": 0.2,
        f"{actor}.clip_ratio_high": 0.28,
        f"{actor}.grad_clip": 1.0,
        f"{actor}.ppo_mini_batch_size": terms.prompts,
        f"{actor}.use_dynamic_bsz": True,
        f"{actor}.ppo_max_token_len_per_gpu": 16384,
        f"{actor}.use_kl_loss": False,
        f"{actor}.entropy_coeff": 0.0,
        f"{rollout}.name": "vllm",
        f"{rollout}.tensor_model_parallel_size": 1,
        f"{rollout}.n": terms.n,
        f"{rollout}.gpu_memory_utilization": terms.gpu_memory_utilization,
        f"{rollout}.enforce_eager": False,
        f"{rollout}.log_prob_max_token_len_per_gpu": 32768,
        f"{rollout}.agent.num_workers": 4,
        f"{rollout}.seed": terms.seed,
        "reward.num_workers": 2,
        "reward.custom_reward_function.path": verl_reward.__file__,
        "reward.custom_reward_function.name": "compute_score",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 2,
        "trainer.n_gpus_per_node": 1,
        "trainer.nnodes": 1,
        "trainer.critic_warmup": 0,
        "trainer.logger": '["console","file"]',
        "trainer.project_name": "peers",
        "trainer.experiment_name": "verl",
        "trainer.total_epochs": 1000,
        "trainer.total_training_steps": terms.steps,
        "trainer.val_before_train": False,
        "trainer.test_freq": terms.steps,  # one validation, after the last step
        "trainer.save_freq": -1,
        "trainer.resume_mode": "disable",
    }


def verl_async_overrides(terms: Terms) -> dict[str, Any]:
    """verl_async's Hydra overrides (module docstring): verl's on top of ``verl_overrides``.
    Every prompt is generated once (``total_rollout_steps`` counts prompts); validation once,
    at the last weight sync (``test_freq`` counts syncs)."""
    every = int(ASYNC["trigger_parameter_sync_step"])
    if terms.steps % every:
        raise ValueError(f"steps={terms.steps}: verl_async syncs every {every} steps: a multiple")
    return {
        "data.train_batch_size": 0,  # its rollouter streams prompts one by one
        "data.gen_batch_size": 1,
        "actor_rollout_ref.hybrid_engine": False,
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "rollout.nnodes": 0,  # no rollout GPUs of its own: the replica shares the trainer's
        "rollout.n_gpus_per_node": 1,
        "rollout.total_rollout_steps": terms.steps * terms.prompts,
        "async_training.use_dynamic_resource_scheduling": True,
        **{f"async_training.{k}": v for k, v in ASYNC.items()},
        "async_training.concurrent_samples_per_replica": terms.prompts,  # a step's prompts at once
        "trainer.test_freq": terms.steps // every,
    }


def verl_command(
    terms: Terms, run_dir: Path, verl_site: Path, system: str = "verl"
) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of ``system`` (``SYSTEMS``) under ``terms``, writing
    ``run_dir``."""
    argv = [sys.executable, "-u", "-m", ENTRY[system]]
    overrides: dict[str, Any] = verl_overrides(terms)
    if system == "verl_async":
        overrides |= verl_async_overrides(terms)
    for extra in terms.verl_extra:  # a variant: replaces the benchmark's value of its key
        key, _, value = extra.partition("=")
        overrides.pop(key, None)
        overrides[key] = value
    argv += [f"{k}={v}" for k, v in overrides.items()]
    path = [str(verl_site), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "VERL_FILE_LOGGER_PATH": str(run_dir.resolve() / METRICS_FILE),
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HYDRA_FULL_ERROR": "1",
    }
    return argv, env


def read_verl(run_dir: Path, terms: Terms) -> tuple[list[StepRow], list[int], float | None]:
    """(steps, the metrics line of each, final greedy accuracy) of a finished run. A line that
    ends several steps (verl_async logs once per weight sync, its timings summed over the
    sync's steps) gives each of them an equal share; how many it ends comes from the step
    counter it carries."""
    path = run_dir / METRICS_FILE
    lines = read_metric_records(path)
    rows, line_of_step, accuracy, done = [], [], None, 0
    samples = terms.prompts * terms.n
    for index, line in enumerate(lines):
        data = line.get("data", {})
        for key, value in data.items():
            if key.startswith("val-core/") and key.endswith(_ACCURACY_SUFFIX):
                accuracy = float(value)
        if int(line.get("step", 0)) < 1 or "timing_s/step" not in data:
            continue
        count = max(1, int(data.get(_STEP_KEY, done + 1)) - done)
        done += count
        phases = {}
        for phase, keys in _PHASE_KEYS.items():
            found = next((k for k in keys if k in data), None)
            if found is not None:
                phases[phase] = float(data[found])
        share = StepRow(
            step_s=float(data["timing_s/step"]) / count,
            samples=samples,
            gen_tokens=float(data.get("response_length/mean", 0.0)) * samples,
            phases_s={p: s / count for p, s in phases.items()},
        )
        rows += [share] * count
        line_of_step += [index] * count
    return rows, line_of_step, accuracy
