"""The yardstick of ``recipe.tools.bench.trainer``: a PPO step as a plain PyTorch script writes it.

One process, one device, no FSDP, no Ray: an HF causal LM with float32 master weights, bf16
autocast on CUDA (float32 on CPU), SDPA attention, log-probs of the response tokens through
the head in chunks of rows, a token-mean PPO-clip loss, fused AdamW on CUDA. Micro-batches
are the same row plans ours gets (fixed row counts or a token budget over length-sorted
rows), so a ratio between the two measures the trainer's machinery, not the batching.
Deliberately missing: entropy, KL, data parallelism, checkpointing, metrics.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from recipe.workers.trainer.batch import TrainBatch
from recipe.workers.trainer.micro_batches import MicroPlan


class PlainTrainer:
    """An HF model and AdamW on one device; ``log_probs`` and ``update`` over row plans."""

    def __init__(self, model_path: str, device: str, *, chunk_size: int = 1024, lr: float = 1e-6):
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.lm = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32, attn_implementation="sdpa"
        ).to(self.device)
        self.chunk_size = chunk_size
        cuda = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(self.lm.parameters(), lr=lr, fused=cuda)

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def _log_probs(self, micro: TrainBatch) -> torch.Tensor:
        """(N,) log-probs of the micro-batch's response tokens, row-major."""
        hidden_bth = self.lm.model(
            input_ids=micro.input_ids_bt,
            attention_mask=micro.attention_mask_bt,
            position_ids=micro.position_ids_bt,
        ).last_hidden_state
        mask_bt = micro.response_mask_bt.clone()
        mask_bt[:, 0] = False
        hidden_nh = hidden_bth[:, :-1][mask_bt[:, 1:]]
        targets_n = micro.input_ids_bt[mask_bt]
        out = []
        for start in range(0, hidden_nh.shape[0], self.chunk_size):
            logits_nv = self.lm.lm_head(hidden_nh[start : start + self.chunk_size]).float()
            chunk_targets = targets_n[start : start + self.chunk_size, None]
            out.append(logits_nv.gather(-1, chunk_targets).squeeze(-1) - logits_nv.logsumexp(-1))
        return torch.cat(out)

    def _micros(self, batch: TrainBatch, plan: MicroPlan) -> list[TrainBatch]:
        return [batch.select(rows).trim_padding().to(self.device) for rows in plan if rows]

    @torch.no_grad()
    def log_probs(self, batch: TrainBatch, plan: MicroPlan) -> list[torch.Tensor]:
        with self._autocast():
            return [self._log_probs(micro) for micro in self._micros(batch, plan)]

    def update(self, batch: TrainBatch, plan: MicroPlan, *, clip: float = 0.2) -> float:
        """One optimizer step over every micro-batch of ``plan``; the loss, summed."""
        num_tokens = float(batch.response_mask_bt.sum())
        total = torch.zeros((), device=self.device)
        for micro in self._micros(batch, plan):
            mask_bt = micro.response_mask_bt
            with self._autocast():
                logprob_n = self._log_probs(micro)
            old_n = micro.rollout_logprobs_bt[mask_bt]
            assert micro.advantages_bt is not None, "update() needs a batch with advantages"
            adv_n = micro.advantages_bt[mask_bt]
            ratio_n = torch.exp(logprob_n - old_n)
            loss_n = torch.maximum(-adv_n * ratio_n, -adv_n * ratio_n.clamp(1 - clip, 1 + clip))
            loss = loss_n.sum() / num_tokens
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(self.lm.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(total)
