"""The policy-loss and advantage-estimator registries (recipe/algo/registry.py): a user's
``FILE.py:fn`` and a new registry line go through the real seam (the config check, the
trainer's ``micro_loss`` / ``compute_advantages``), and a bad name or file is one ``error:``
line with exit code 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from recipe.algo import registry
from recipe.algo.advantages import compute_advantages, rloo_advantages
from recipe.algo.config import AlgorithmConfig
from recipe.utils.config_check import ConfigError
from recipe.workers.config import ActorConfig
from recipe.workers.trainer.actor_loss import LossSums, micro_loss
from recipe.workers.trainer.batch import TrainBatch
from recipe.workers.trainer.spec import TrainerSpec

REPO = Path(__file__).resolve().parents[2]

USER_CODE = """
import torch
from recipe.algo.losses import PolicyLossStats, masked_mean

def reinforce(inputs):
    mask = inputs.mask_bt.to(inputs.logprobs_bt.dtype)
    loss = -(inputs.advantages_bt * inputs.logprobs_bt * mask).sum() / inputs.num_tokens
    zero = torch.zeros(())
    return loss, PolicyLossStats(zero, zero, mask.sum())

def minus_mean(inputs):
    return inputs.rewards_b - inputs.rewards_b.mean()
"""


@pytest.fixture
def user_file(tmp_path) -> Path:
    path = tmp_path / "my_algo.py"
    path.write_text(textwrap.dedent(USER_CODE))
    return path


def _micro_batch() -> TrainBatch:
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    return TrainBatch(
        input_ids_bt=torch.zeros(2, 3, dtype=torch.long),
        attention_mask_bt=torch.ones(2, 3, dtype=torch.long),
        position_ids_bt=torch.arange(3).expand(2, 3),
        response_mask_bt=torch.tensor([[1, 1, 1], [1, 1, 0]]),
        rollout_logprobs_bt=logp,
        group_index_b=torch.tensor([0, 0]),
        rewards_b=torch.tensor([1.0, 0.0]),
        advantages_bt=torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]]),
    )


def test_a_user_policy_loss_from_a_file_is_checked_and_called_by_the_trainer(user_file):
    spec = f"{user_file}:reinforce"
    assert AlgorithmConfig(policy_loss=spec).policy_loss == spec  # the config check loads it
    trainer = TrainerSpec(model_path="unused", policy_loss=spec, response_length=3)
    micro = _micro_batch()
    logp = micro.rollout_logprobs_bt.clone().requires_grad_(True)
    sums = LossSums(torch.device("cpu"))
    actor = ActorConfig(loss_agg_mode="token-mean")
    loss = micro_loss(
        actor, trainer, micro, logp, torch.zeros(2, 3), {"num_tokens": 5.0, "num_seqs": 2.0}, sums
    )
    # -(1*(-1-2-3) + -2*(-0.5-0.5)) / 5 = -(-6 + 2) / 5
    assert loss.item() == pytest.approx(0.8)
    assert sums.totals()["tokens"] == 5.0


def test_a_new_registry_line_is_a_config_choice(user_file, monkeypatch):
    monkeypatch.setitem(registry.ADV_ESTIMATOR.entries, "centered", f"{user_file}:minus_mean")
    with pytest.raises(ConfigError, match=r"algorithm\.policy_loss='centered'"):
        AlgorithmConfig(policy_loss="centered")
    config = AlgorithmConfig(adv_estimator="centered")
    rewards, groups = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0, 0, 1])
    assert compute_advantages(rewards, groups, config).tolist() == pytest.approx([0.0, -1.0, 1.0])
    rloo = compute_advantages(rewards, groups, AlgorithmConfig(adv_estimator="rloo"))
    torch.testing.assert_close(rloo, rloo_advantages(rewards, groups))


def test_the_config_choices_are_the_registry_lines(user_file):
    with pytest.raises(ConfigError) as err:
        AlgorithmConfig(policy_loss="nope")
    allowed = ", ".join(repr(n) for n in registry.POLICY_LOSS.entries)
    assert f"allowed one of {allowed} or 'path/to/file.py:function'" in str(err.value)
    with pytest.raises(ConfigError, match=r"has no attribute 'missing' \(its functions: .*reinf"):
        AlgorithmConfig(policy_loss=f"{user_file}:missing")
    with pytest.raises(ConfigError, match=r"algorithm\.adv_estimator='gae'"):
        AlgorithmConfig(adv_estimator="gae")


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("nope", "error: algorithm.policy_loss='nope' is invalid: allowed one of 'ppo', 'gspo', "
         "'cispo' or 'path/to/file.py:function' or 'package.module:function'"),
        ("{dir}/absent.py:fn", "error: algorithm.policy_loss='{dir}/absent.py:fn': file not found: "
         "{dir}/absent.py"),
    ],
)  # fmt: skip
def test_cli_bad_policy_loss_exits_2_with_one_line(tmp_path, value, line):
    value, line = value.format(dir=tmp_path), line.format(dir=tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipe",
            f"algorithm.policy_loss={value}",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")] == [line], proc.stderr
    assert "Traceback" not in proc.stderr
