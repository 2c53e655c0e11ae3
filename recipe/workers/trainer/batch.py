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

An episode of several linear segments (``Trajectory.segments``) is several rows: the
trajectory's own row, then its earlier segments oldest first. They share its group, reward
and ``episode_b``; only the trajectory's own row counts in the group's baseline, so B may
exceed groups x ``rollout.n``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from recipe.protocol import Trajectory, TrajectorySegment

RowTokens = Trajectory | TrajectorySegment
"""What one row packs: a trajectory's own (last-segment) tokens or an earlier segment's."""


@dataclass(slots=True)
class TrainBatch:
    """B rows: the responses (and earlier episode segments) of all groups of one trainer step,
    or a shard / micro-batch of them."""

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
    """(B,) float32 scalar reward of each row's episode."""
    counted_b: torch.Tensor | None = None
    """(B,) bool, False on rows that stay out of their group's baseline: episodes that ended
    in ``env_error`` (an infrastructure fault, not a learning signal; all their rows have no
    response tokens in ``response_mask_bt``), and an episode's earlier segments (its reward
    counts once, on the trajectory's own row). None: every row counts."""
    episode_b: torch.Tensor | None = None
    """(B,) int64 episode of each row (its trajectory's index in the packed order), shared by
    the rows of an episode's segments; they take its advantage
    (``recipe.algo.advantages.share_episode_advantages``). None: every episode is one row."""
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
        """Pack trajectories in the given order, each followed by its earlier segments (oldest
        first); group ids number prompts by first appearance."""
        if not trajs:
            raise ValueError("TrainBatch.from_trajectories: no trajectories")
        rows = [(traj, seq) for traj in trajs for seq in _episode_rows(traj)]
        seq_len = max(len(seq.prompt_ids) + len(seq.response_ids) for _, seq in rows)
        num_rows = len(rows)
        group_of_uid: dict[str, int] = {}
        for traj in trajs:
            group_of_uid.setdefault(traj.prompt_uid, len(group_of_uid))
        episodes = [e for e, traj in enumerate(trajs) for _ in range(1 + len(traj.segments))]
        batch = cls(
            input_ids_bt=torch.full((num_rows, seq_len), pad_token_id, dtype=torch.int64),
            attention_mask_bt=torch.zeros((num_rows, seq_len), dtype=torch.int64),
            position_ids_bt=torch.arange(seq_len).expand(num_rows, seq_len).clone(),
            response_mask_bt=torch.zeros((num_rows, seq_len), dtype=torch.bool),
            rollout_logprobs_bt=torch.zeros((num_rows, seq_len), dtype=torch.float32),
            group_index_b=torch.tensor([group_of_uid[traj.prompt_uid] for traj, _ in rows]),
            rewards_b=torch.tensor([traj.reward for traj, _ in rows], dtype=torch.float32),
            counted_b=_counted(rows),
            episode_b=torch.tensor(episodes) if num_rows > len(trajs) else None,
        )
        for row, (traj, seq) in enumerate(rows):
            batch._fill_row(row, traj, seq)
        return batch

    def _fill_row(self, row: int, traj: Trajectory, seq: RowTokens) -> None:
        """Row ``row``: ``seq`` (the trajectory itself or one of its segments) of ``traj``."""
        num_prompt, num_resp = len(seq.prompt_ids), len(seq.response_ids)
        if num_prompt == 0:
            raise ValueError(f"trajectory of prompt {traj.prompt_uid!r} has no prompt tokens")
        end = num_prompt + num_resp
        self.input_ids_bt[row, :end] = torch.tensor(seq.prompt_ids + seq.response_ids)
        self.attention_mask_bt[row, :end] = 1
        if traj.finish_reason == "env_error":
            pass  # not trained on: no segment of it has tokens in the mask
        elif seq.loss_mask is None:
            self.response_mask_bt[row, num_prompt:end] = True
        else:  # multi-turn: observation tokens are context, not targets
            self.response_mask_bt[row, num_prompt:end] = torch.tensor(seq.loss_mask) > 0
        self.rollout_logprobs_bt[row, num_prompt:end] = torch.tensor(
            seq.rollout_logprobs, dtype=torch.float32
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


def _episode_rows(traj: Trajectory) -> list[RowTokens]:
    """The rows of one episode: the trajectory's own first (the row that counts in its
    group), then its earlier segments oldest first."""
    return [traj, *traj.segments]


def _counted(rows: Sequence[tuple[Trajectory, RowTokens]]) -> torch.Tensor | None:
    """``TrainBatch.counted_b`` of packed (trajectory, sequence) rows (None when every row
    counts): a trajectory's own row unless it ended in ``env_error``, never a segment."""
    counted = [seq is traj and traj.finish_reason != "env_error" for traj, seq in rows]
    return None if all(counted) else torch.tensor(counted)
