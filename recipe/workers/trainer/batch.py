"""``TrainBatch``: trajectories packed into right-padded (B, T) tensors for the trainer.

Alignment (every per-token tensor, ``*_bt``): column ``t`` describes the token
``input_ids_bt[b, t]`` itself, i.e. values are indexed by the TARGET token, not by the
position that predicts it::

    input_ids_bt       p0  p1  p2  r0  r1  r2  pad pad      (prompt P=3, response R=3)
    response_mask_bt    0   0   0   1   1   1   0   0
    *_logprobs_bt       0   0   0  lp(r0|p0..p2) lp(r1|..r0) lp(r2|..r1)  0  0

so ``logprobs_bt[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``, computed from the
logits at position ``t - 1``. Column 0 is never a response token (a prompt has >= 1 token),
and values outside ``response_mask_bt`` are 0 and must be ignored.

Sharding keeps whole GRPO groups together (group statistics and sequence counts stay on one
rank) and keeps the column count T, so the driver reassembles per-rank results by row index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from recipe.protocol import Trajectory


@dataclass(slots=True)
class TrainBatch:
    """B responses (all groups of one trainer step, or a shard / micro-batch of them)."""

    input_ids_bt: torch.Tensor
    """(B, T) int64 prompt + response token ids, right padded with the pad id."""
    attention_mask_bt: torch.Tensor
    """(B, T) int64, 1 on prompt and response tokens, 0 on padding."""
    position_ids_bt: torch.Tensor
    """(B, T) int64 positions 0..T-1 (right padding keeps real tokens at 0..L-1)."""
    response_mask_bt: torch.Tensor
    """(B, T) bool, True on response tokens the model sampled (the tokens trained on; a
    multi-turn episode's observation tokens are False, though inside the sequence)."""
    rollout_logprobs_bt: torch.Tensor
    """(B, T) float32 log-probs the rollout engine reported for each response token."""
    group_index_b: torch.Tensor
    """(B,) int64 GRPO group of each row (one group per prompt)."""
    rewards_b: torch.Tensor
    """(B,) float32 scalar reward of each response."""
    counted_b: torch.Tensor | None = None
    """(B,) bool, False on rows that are no sample of the policy's behaviour: episodes that
    ended in ``env_error`` (an infrastructure fault, not a learning signal). Such rows have
    no response tokens in ``response_mask_bt`` and stay out of their group's baseline.
    None: every row counts."""
    advantages_bt: torch.Tensor | None = None
    """(B, T) float32 per-token advantages (0 off the response), once computed."""
    old_logprobs_bt: torch.Tensor | None = None
    """(B, T) float32 log-probs of PPO's old policy from the trainer (decoupled mode); None:
    the rollout log-probs are the old policy (bypass mode)."""
    ref_logprobs_bt: torch.Tensor | None = None
    """(B, T) float32 log-probs of the frozen reference model (KL loss), once computed."""
    is_weights_bt: torch.Tensor | None = None
    """(B, T) float32 rollout-correction importance weights multiplied into each token's
    policy loss (``algorithm.rollout_correction.rollout_is``); None: no weights."""

    @classmethod
    def from_trajectories(cls, trajs: Sequence[Trajectory], pad_token_id: int) -> TrainBatch:
        """Pack trajectories in the given order; group ids number prompts by first appearance."""
        if not trajs:
            raise ValueError("TrainBatch.from_trajectories: no trajectories")
        seq_len = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
        num_rows = len(trajs)
        input_ids_bt = torch.full((num_rows, seq_len), pad_token_id, dtype=torch.int64)
        attention_mask_bt = torch.zeros((num_rows, seq_len), dtype=torch.int64)
        response_mask_bt = torch.zeros((num_rows, seq_len), dtype=torch.bool)
        rollout_logprobs_bt = torch.zeros((num_rows, seq_len), dtype=torch.float32)
        group_of_uid: dict[str, int] = {}
        for row, traj in enumerate(trajs):
            num_prompt, num_resp = len(traj.prompt_ids), len(traj.response_ids)
            if num_prompt == 0:
                raise ValueError(f"trajectory of prompt {traj.prompt_uid!r} has no prompt tokens")
            end = num_prompt + num_resp
            input_ids_bt[row, :end] = torch.tensor(traj.prompt_ids + traj.response_ids)
            attention_mask_bt[row, :end] = 1
            if traj.finish_reason == "env_error":
                pass  # not trained on: its tokens stay out of the mask
            elif traj.loss_mask is None:
                response_mask_bt[row, num_prompt:end] = True
            else:  # multi-turn: observation tokens are context, not targets
                response_mask_bt[row, num_prompt:end] = torch.tensor(traj.loss_mask) > 0
            rollout_logprobs_bt[row, num_prompt:end] = torch.tensor(
                traj.rollout_logprobs, dtype=torch.float32
            )
            group_of_uid.setdefault(traj.prompt_uid, len(group_of_uid))
        return cls(
            input_ids_bt=input_ids_bt,
            attention_mask_bt=attention_mask_bt,
            position_ids_bt=torch.arange(seq_len).expand(num_rows, seq_len).clone(),
            response_mask_bt=response_mask_bt,
            rollout_logprobs_bt=rollout_logprobs_bt,
            group_index_b=torch.tensor([group_of_uid[t.prompt_uid] for t in trajs]),
            rewards_b=torch.tensor([t.reward for t in trajs], dtype=torch.float32),
            counted_b=_counted(trajs),
        )

    @property
    def batch_size(self) -> int:
        return self.input_ids_bt.shape[0]

    @property
    def seq_len(self) -> int:
        return self.input_ids_bt.shape[1]

    def group_ids(self) -> list[int]:
        """Group ids in order of first appearance."""
        return list(dict.fromkeys(self.group_index_b.tolist()))

    def _map(self, fn) -> TrainBatch:
        changes = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            changes[f.name] = None if value is None else fn(value)
        return TrainBatch(**changes)

    def select(self, rows: Sequence[int] | torch.Tensor) -> TrainBatch:
        """The given rows, in the given order (columns unchanged)."""
        index = torch.as_tensor(rows, dtype=torch.int64)
        return self._map(lambda t: t.index_select(0, index.to(t.device)))

    def to(self, device: torch.device | str) -> TrainBatch:
        return self._map(lambda t: t.to(device))

    def with_advantages(self, advantages_b: torch.Tensor) -> TrainBatch:
        """A copy whose ``advantages_bt`` broadcasts one advantage per row over its response."""
        if advantages_b.shape != (self.batch_size,):
            raise ValueError(f"advantages_b {tuple(advantages_b.shape)} != ({self.batch_size},)")
        adv_bt = advantages_b.to(torch.float32)[:, None] * self.response_mask_bt.float()
        return dataclasses.replace(self, advantages_bt=adv_bt)

    def split(self, rows_per_chunk: int) -> list[TrainBatch]:
        """Consecutive chunks of ``rows_per_chunk`` rows (the last may be smaller)."""
        if rows_per_chunk <= 0:
            raise ValueError(f"rows_per_chunk={rows_per_chunk} must be > 0")
        return [
            self.select(range(start, min(start + rows_per_chunk, self.batch_size)))
            for start in range(0, self.batch_size, rows_per_chunk)
        ]

    def rows_of_groups(self, group_ids: Sequence[int]) -> list[int]:
        """Row indices of the given groups: group by group, rows in batch order within each."""
        index_b = self.group_index_b.tolist()
        rows_of: dict[int, list[int]] = {g: [] for g in group_ids}
        for row, g in enumerate(index_b):
            if g in rows_of:
                rows_of[g].append(row)
        return [row for g in group_ids for row in rows_of[g]]

    def split_groups(self, groups_per_chunk: int) -> list[TrainBatch]:
        """Consecutive chunks of ``groups_per_chunk`` whole groups (the last may be smaller)."""
        if groups_per_chunk <= 0:
            raise ValueError(f"groups_per_chunk={groups_per_chunk} must be > 0")
        groups = self.group_ids()
        return [
            self.select(self.rows_of_groups(groups[start : start + groups_per_chunk]))
            for start in range(0, len(groups), groups_per_chunk)
        ]

    def shard_rows(
        self, rank: int, world_size: int, *, groups_per_mini_batch: int | None = None
    ) -> list[int]:
        """Rows of data-parallel rank ``rank``.

        Groups are cut into mini-batches of ``groups_per_mini_batch`` (None: one mini-batch)
        and every mini-batch is split evenly across ranks, so rank r's k-th local mini-batch
        of ``groups_per_mini_batch / world_size`` groups is its slice of global mini-batch k.
        That keeps every optimizer step's data identical for any world size.
        """
        groups = self.group_ids()
        per_mini = groups_per_mini_batch or len(groups)
        mine: list[int] = []
        for start in range(0, len(groups), per_mini):
            mini = groups[start : start + per_mini]
            if len(mini) % world_size:
                raise ValueError(
                    f"a mini-batch of {len(mini)} prompt groups cannot be split evenly across "
                    f"{world_size} trainer ranks: make the prompts per step and "
                    "actor.ppo_mini_batch_size multiples of the trainer world size"
                )
            per_rank = len(mini) // world_size
            mine += mini[rank * per_rank : (rank + 1) * per_rank]
        return self.rows_of_groups(mine)

    def narrow_rows(self, start: int, end: int, num_cols: int) -> TrainBatch:
        """Rows ``start:end`` and columns ``:num_cols``, as views (no copy)."""
        return self._map(lambda t: t[start:end, :num_cols] if t.dim() == 2 else t[start:end])

    def without_targets(self) -> TrainBatch:
        """A copy with no response tokens: it runs through a forward and backward like any
        batch but adds nothing to a loss or its counts."""
        zeros_bt = torch.zeros_like(self.response_mask_bt)
        advantages_bt = None if self.advantages_bt is None else torch.zeros_like(self.advantages_bt)
        return dataclasses.replace(self, response_mask_bt=zeros_bt, advantages_bt=advantages_bt)

    def trim_padding(self) -> TrainBatch:
        """Drop trailing columns that are padding in every row (saves compute per micro-batch)."""
        num_cols = int(self.attention_mask_bt.sum(dim=1).max().item()) if self.batch_size else 0
        return self._map(lambda t: t[:, :num_cols] if t.dim() == 2 else t)


def _counted(trajs: Sequence[Trajectory]) -> torch.Tensor | None:
    """``TrainBatch.counted_b`` of ``trajs`` (None when every row counts)."""
    counted = [t.finish_reason != "env_error" for t in trajs]
    return None if all(counted) else torch.tensor(counted)
