"""``TrainerWorker``: one data-parallel rank of the FSDP2 policy trainer.

A plain class: ``recipe.workers.trainer.ranks.TrainerRanks`` runs one per rank as a Ray actor,
and unit tests drive it in-process at world size 1. Each rank holds float32 master weights
sharded by FSDP2 (gloo on CPU, NCCL on CUDA) and an AdamW optimizer over its shards.

    TrainBatch shard --> compute_log_prob --> (logprobs_bt, entropy_bt)   no grad, micro-batched
                     --> update_actor     --> metrics                      mini-batch per optimizer
                                                                           step, micro-batch grad
                                                                           accumulation, epochs

Exactness across world sizes: every micro-batch loss is normalised by the GLOBAL token /
sequence count of its mini-batch and FSDP sums (not averages) gradients, so world size N
computes the same update as world size 1 up to float summation order.

Weights in and out of the rank (CPU slots, pushes, exports, checkpoints) are ``PolicyIO``
(policy_io.py), mixed in. Out of GPU memory in a forward or backward, the entry points raise
``TrainerOutOfMemoryError`` naming the knobs to lower (out_of_memory.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from recipe.algo.losses import count_tokens_and_seqs
from recipe.utils.config_check import require_choice
from recipe.utils.rendezvous import StoreAddress
from recipe.workers.config import ActorConfig
from recipe.workers.trainer.actor_loss import LossSums, micro_loss, update_metrics
from recipe.workers.trainer.adapter_io import AdapterIO
from recipe.workers.trainer.batch import TrainBatch
from recipe.workers.trainer.fsdp_utils import (
    PolicyModule,
    all_reduce_max,
    all_reduce_sum,
    build_optimizer,
    decoder_layers,
    join_process_group,
    reshard_all,
    shard_policy,
)
from recipe.workers.trainer.lora import (
    adapter_dropout,
    apply_lora,
)
from recipe.workers.trainer.micro_batches import (
    MicroPlan,
    device_micro_batches,
    fixed_plan,
    split_to_count,
    token_budget_plan,
)
from recipe.workers.trainer.optim_step import optimizer_step
from recipe.workers.trainer.out_of_memory import UPDATE_PHASE, reports_out_of_memory
from recipe.workers.trainer.policy_io import PolicyIO
from recipe.workers.trainer.spec import TrainerSpec
from recipe.workers.trainer.weight_slots import WeightSlots

logger = logging.getLogger(__name__)


class TrainerWorker(PolicyIO):
    """One FSDP2 rank: policy (+ optional frozen reference), AdamW, LR schedule, CPU slots;
    log-probs and updates here, weights in and out in ``PolicyIO`` (policy_io.py)."""

    def __init__(
        self,
        actor: ActorConfig,
        spec: TrainerSpec,
        *,
        rank: int = 0,
        world_size: int = 1,
        rendezvous: StoreAddress | None = None,
        device: str = "cpu",
    ):
        """Rank ``rank`` of ``world_size``, meeting the others at ``rendezvous`` (the
        ``TrainerRanks``'s store; None: a world of one)."""
        if actor.ppo_mini_batch_size % world_size:
            raise ValueError(
                f"actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} must be a multiple of "
                f"the trainer world size {world_size}"
            )
        self.actor, self.spec = actor, spec
        self.rank, self.world_size = rank, world_size
        require_choice("trainer device", device, ("cpu", "cuda"))
        # Ray exposes exactly one GPU to each rank's actor, so the current device is it.
        self.device = torch.device(
            f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu"
        )
        if self.device.type == "cuda" and not actor.cudnn_attention:
            # Process-wide in this rank's own process (the engines run elsewhere).
            torch.backends.cuda.enable_cudnn_sdp(False)
        # The group's store stays referenced while the group lives (join_process_group).
        self._group_store = join_process_group(rank, world_size, rendezvous, device)
        self._mesh = init_device_mesh(self.device.type, (world_size,))
        torch.manual_seed(spec.seed)
        self._policy = self._build_policy(trainable=True)
        self._ref = self._build_policy(trainable=False) if actor.use_kl_loss else None
        # Full fine-tuning: every parameter; LoRA: the adapter's alone.
        trainable = [p for p in self._policy.parameters() if p.requires_grad]
        self._optimizer, self._scheduler = build_optimizer(
            trainable, actor, spec.total_optimizer_steps
        )
        self._adapter = (
            AdapterIO(self._policy, actor.lora, spec.model_path, rank, world_size)
            if actor.lora.enabled
            else None
        )
        self._slots = WeightSlots(
            self._policy,
            pin_memory=self.device.type == "cuda",
            trainable_only=actor.lora.enabled,
        )

    def _build_policy(self, *, trainable: bool) -> PolicyModule:
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(self.spec.model_path, dtype=torch.float32)
        if trainable and self.actor.gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            for module in lm.modules():  # HF layers checkpoint only in training mode: set it
                if getattr(module, "gradient_checkpointing", False):  # on them alone, so that
                    module.training = True  # their own modules stay in eval (no dropout)
        policy = PolicyModule(lm)
        policy.requires_grad_(trainable)
        if trainable and self.actor.lora.enabled:  # before fully_shard: FSDP2 shards both
            apply_lora(lm, self.actor.lora, self.spec.model_path)
        shard_policy(policy, self._mesh, getattr(torch, self.spec.compute_dtype))
        return policy

    # ---- log-probs ------------------------------------------------------------------------

    @reports_out_of_memory("compute_log_prob")
    def compute_log_prob(
        self, batch: TrainBatch, *, slot: str | None = None, with_entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logprobs_bt, entropy_bt) on CPU, float32, 0 off the response mask. ``slot``: use
        the weights saved by ``save_model_to_cpu(slot)`` (swapped in, then swapped back).
        ``with_entropy=False``: entropy_bt is None (saves a pass over the logits)."""
        if slot is None:
            return self._forward_no_grad(self._policy, batch, with_entropy)
        with self._swapped_in(slot):
            return self._forward_no_grad(self._policy, batch, with_entropy)

    @reports_out_of_memory("compute_ref_log_prob")
    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        """Reference-model log-probs (B, T) on CPU (needs ``actor.use_kl_loss``)."""
        if self._ref is None:
            raise ValueError("reference log-probs need actor.use_kl_loss=true")
        return self._forward_no_grad(self._ref, batch, with_entropy=False)[0]

    @torch.no_grad()
    def _forward_no_grad(
        self, module: PolicyModule, batch: TrainBatch, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logprob_bt = torch.zeros(batch.input_ids_bt.shape, device=self.device)
        entropy_bt = torch.zeros_like(logprob_bt) if with_entropy else None
        for rows, micro in self._micro_batches(batch, grad=False):
            lp_bt, ent_bt = self._forward(module, micro, with_entropy)
            if rows:  # a dummy micro-batch (rows == []) only keeps the ranks in step
                index = torch.tensor(rows, device=self.device)
                logprob_bt[index, : micro.seq_len] = lp_bt
                if entropy_bt is not None:
                    entropy_bt[index, : micro.seq_len] = ent_bt
        # Gathered weights outlive a forward without backward (the root always, the layers at
        # world size 1): free them, so that nothing reads or writes a stale copy.
        reshard_all(module)
        return logprob_bt.cpu(), None if entropy_bt is None else entropy_bt.cpu()

    def _micro_plan(self, lengths: list[int], *, grad: bool) -> MicroPlan:
        """Rows of each micro-batch (``recipe.workers.trainer.micro_batches``) for rows of
        ``lengths`` tokens; with world size > 1 every rank gets as many micro-batches as the
        rank that needs the most."""
        if self.actor.use_dynamic_bsz:
            budget = self.actor.ppo_max_token_len_per_gpu
            plan = token_budget_plan(lengths, budget if grad else self.actor.log_prob_token_budget)
        else:
            plan = fixed_plan(len(lengths), self.actor.ppo_micro_batch_size_per_gpu)
        if self.world_size > 1:
            plan = split_to_count(plan, lengths, int(all_reduce_max([len(plan)], self.device)[0]))
        return plan

    def _micro_batches(
        self, batch: TrainBatch, *, grad: bool
    ) -> Iterator[tuple[list[int], TrainBatch]]:
        lengths = batch.attention_mask_bt.sum(dim=1).tolist()
        plan = self._micro_plan(lengths, grad=grad)
        return device_micro_batches(batch, plan, lengths, self.device)

    def _forward(
        self, module: PolicyModule, micro: TrainBatch, with_entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return module(
            micro.input_ids_bt,
            micro.attention_mask_bt,
            micro.position_ids_bt,
            micro.response_mask_bt,
            self.actor.logprob_chunk_size,
            self.spec.logits_temperature,
            with_entropy,
        )

    # ---- training -------------------------------------------------------------------------

    @reports_out_of_memory(UPDATE_PHASE)
    def update_actor(self, batch: TrainBatch) -> dict[str, float]:
        """PPO update on this rank's shard: ``ppo_epochs`` passes over mini-batches of
        ``ppo_mini_batch_size / world_size`` prompt groups, one optimizer step each."""
        if batch.advantages_bt is None or batch.batch_size == 0:
            raise ValueError("update_actor needs a non-empty batch with advantages_bt")
        if self._ref is not None and batch.ref_logprobs_bt is None:
            batch = dataclasses.replace(batch, ref_logprobs_bt=self.compute_ref_log_prob(batch))
        groups_per_step = self.actor.ppo_mini_batch_size // self.world_size
        mini_batches = batch.split_groups(groups_per_step)
        sums = LossSums(self.device)
        grad_norms: list[float] = []
        lr = self._optimizer.param_groups[0]["lr"]
        with adapter_dropout(self._policy.lm):
            for _ in range(self.actor.ppo_epochs):
                for mini in mini_batches:
                    lr = self._optimizer.param_groups[0]["lr"]
                    grad_norms.append(self._train_step(mini, sums))
        return update_metrics(
            sums.totals(),
            grad_norms,
            lr,
            with_ref=self._ref is not None,
        )

    def _train_step(self, mini: TrainBatch, sums: LossSums) -> float:
        """Forward/backward every micro-batch of one mini-batch, then one optimizer step."""
        local_tokens, local_seqs = count_tokens_and_seqs(mini.response_mask_bt)
        num_tokens, num_seqs = all_reduce_sum([local_tokens, local_seqs], self.device)
        counts = {"num_tokens": num_tokens, "num_seqs": num_seqs}
        for _, micro in self._micro_batches(mini, grad=True):
            logprob_bt, entropy_bt = self._forward(self._policy, micro)
            micro_loss(
                self.actor, self.spec, micro, logprob_bt, entropy_bt, counts, sums
            ).backward()
        norm = optimizer_step(self._policy, self._optimizer, self._scheduler, self.actor.grad_clip)
        if not math.isfinite(norm) and self.actor.probe_non_finite:
            self._probe_non_finite(mini, counts)
        return norm

    def _probe_non_finite(self, mini: TrainBatch, counts: dict[str, float]) -> None:
        """Find where a skipped step's non-finite gradient arose (``nonfinite_probe``); the
        weights are those the step started from, since the step was skipped."""
        if self.world_size > 1:
            logger.warning("actor.probe_non_finite: runs at trainer world size 1 only")
            return
        from recipe.workers.trainer.nonfinite_probe import probe_micro_batches

        def loss_of(micro: TrainBatch):
            def run() -> torch.Tensor:
                logprob_bt, entropy_bt = self._forward(self._policy, micro)
                scratch = LossSums(self.device)
                return micro_loss(
                    self.actor, self.spec, micro, logprob_bt, entropy_bt, counts, scratch
                )

            return run

        micro_batches = [
            (m.attention_mask_bt, loss_of(m)) for _, m in self._micro_batches(mini, grad=True)
        ]
        layers = decoder_layers(self._policy.lm)
        probe_micro_batches(self._policy, layers, micro_batches, self._scheduler.last_epoch)
        reshard_all(self._policy)

    def close(self) -> None:
        if self._group_store is not None and dist.is_initialized():
            dist.destroy_process_group()
        self._group_store = None
