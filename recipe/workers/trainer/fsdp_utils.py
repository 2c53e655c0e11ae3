"""FSDP2 building blocks of the trainer: the log-prob head, sharding, LR schedule, full weights.

``PolicyModule`` wraps an HF causal LM so that one FSDP2 root forward returns per-token
log-probs and entropies of the response tokens (see ``recipe.workers.trainer.batch`` for the
alignment) without ever materialising the (B, T, V) logits: only the hidden states of
positions that predict a response token go through the vocab projection, ``chunk_size`` rows
at a time (``recipe.workers.trainer.logprob_head``), so at most one (chunk, V) float block is alive.

Wrapping the LM (instead of calling its backbone and head separately) matters for FSDP2: the
root's pre-forward hook is what all-gathers the embedding / final norm / head parameters.
"""

from __future__ import annotations

import datetime
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from recipe.utils.rendezvous import StoreAddress
from recipe.workers.config import ActorConfig
from recipe.workers.trainer.logprob_head import chunked_logprob_entropy

logger = logging.getLogger(__name__)

JOIN_TIMEOUT = datetime.timedelta(minutes=10)
"""How long the trainer ranks wait for each other in the rendezvous and in collectives."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class PolicyModule(nn.Module):
    """An HF causal LM whose forward returns response-token log-probs and entropies, (B, T)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(
        self,
        input_ids_bt: torch.Tensor,
        attention_mask_bt: torch.Tensor,
        position_ids_bt: torch.Tensor,
        response_mask_bt: torch.Tensor,
        chunk_size: int,
        temperature: float = 1.0,
        with_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        backbone = getattr(self.lm, self.lm.base_model_prefix)
        hidden_bth = backbone(
            input_ids=input_ids_bt,
            attention_mask=attention_mask_bt,
            position_ids=position_ids_bt,
            use_cache=False,
        ).last_hidden_state
        # Token t is scored by the hidden state at t - 1; column 0 is never scored.
        target_mask_bt = response_mask_bt.bool().clone()
        target_mask_bt[:, 0] = False
        hidden_nh = hidden_bth[:, :-1][target_mask_bt[:, 1:]]
        targets_n = input_ids_bt[target_mask_bt]
        logprob_n, entropy_n = chunked_logprob_entropy(
            hidden_nh,
            self.lm.get_output_embeddings(),
            targets_n,
            chunk_size,
            temperature,
            with_entropy=with_entropy,
        )
        logprob_bt = hidden_bth.new_zeros(target_mask_bt.shape, dtype=torch.float32)
        logprob_bt = logprob_bt.index_put((target_mask_bt,), logprob_n)
        if entropy_n is None:
            return logprob_bt, None
        entropy_bt = torch.zeros_like(logprob_bt).index_put((target_mask_bt,), entropy_n)
        return logprob_bt, entropy_bt


def decoder_layers(lm: nn.Module) -> list[nn.Module]:
    """The HF model's decoder layers (the classes it declares ``_no_split_modules``), in
    module order; also once sharded (FSDP2 gives each a subclass of its own)."""
    layer_classes = set(getattr(lm, "_no_split_modules", None) or ())
    return [m for m in lm.modules() if any(c.__name__ in layer_classes for c in type(m).__mro__)]


def shard_policy(
    policy: PolicyModule, mesh: DeviceMesh, compute_dtype: torch.dtype = torch.float32
) -> None:
    """FSDP2: one shard group per decoder layer, the rest (embeddings, norm, head) in the root.

    Gradients are reduced with a plain SUM (divide factor 1): the losses are normalised by
    GLOBAL token / sequence counts, so summing the ranks' gradients gives the full-batch one.
    At world size 1 a layer keeps its gathered (compute-dtype) parameters from forward to
    backward: re-gathering saves no memory there, only costs copies.
    """
    mp_policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    reshard = mesh.size() > 1
    layers = decoder_layers(policy.lm)
    if not layers:
        raise ValueError(
            f"{type(policy.lm).__name__} declares no _no_split_modules decoder layers to shard"
        )
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    fully_shard(policy, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    for module in (*layers, policy):  # both setters act on one module's own shard group only
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)


def reshard_all(module: nn.Module) -> None:
    """Free every gathered parameter under ``module`` and register the shards again; a plain
    module is left as it is.

    FSDP2's ``reshard()`` acts on one module's own shard group only, and at world size 1 the
    decoder layers keep their gathered (compute-dtype) weights after a forward
    (``shard_policy``). Until they are resharded, ``module.parameters()`` yields those
    temporary copies: a weight copied into them is lost at the next backward, and the
    optimizer steps the shards it never reached. Call this before reading or writing
    parameters outside a training step.
    """
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.reshard()


def lr_factor(step: int, cfg: ActorConfig, total_steps: int | None) -> float:
    """LR multiplier for optimizer step ``step`` (0-based): linear warm-up reaching 1 at step
    ``lr_warmup_steps - 1``, then constant or cosine decay to ``min_lr_ratio`` at the end."""
    if step < cfg.lr_warmup_steps:
        return (step + 1) / cfg.lr_warmup_steps
    if cfg.lr_schedule == "constant":
        return 1.0
    assert total_steps is not None
    progress = min(1.0, (step - cfg.lr_warmup_steps) / max(1, total_steps - cfg.lr_warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


def build_optimizer(
    params: list[nn.Parameter], cfg: ActorConfig, total_steps: int | None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW + LR schedule; the schedule is sized in optimizer steps, so it needs the run's
    total step count before it is built."""
    if cfg.lr_schedule == "cosine" and not total_steps:
        raise ValueError(
            "actor.lr_schedule='cosine' needs the total number of optimizer steps "
            f"(got total_optimizer_steps={total_steps!r})"
        )
    # Fused: one kernel per step over all parameters on CUDA (FSDP2's DTensor shards too).
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, fused=fused
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg, total_steps)
    )
    return optimizer, scheduler


def iter_full_tensors(
    lm: nn.Module, keep: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Unsharded tensors under the LM's own HF state-dict names, one at a time.

    Collective: every rank must iterate to the end in step (each DTensor is all-gathered).
    A tied weight is yielded once, under its first name (``lm_head.weight`` is skipped when
    it shares the embedding), matching what ``save_pretrained`` writes. ``keep``: only the
    names it accepts (the others are never gathered; every rank passes the same).
    """
    seen: set[int] = set()
    for name, tensor in lm.state_dict(keep_vars=True).items():
        if id(tensor) in seen or (keep is not None and not keep(name)):
            continue
        seen.add(id(tensor))
        value = tensor.detach()
        yield name, _full(value) if isinstance(value, DTensor) else value


def _full(value: DTensor) -> torch.Tensor:
    """The unsharded tensor: on a one-rank mesh the local shard already is (no gather, no
    copy: a push at world size 1 skips one collective launch per tensor)."""
    local = value.to_local()
    if value.device_mesh.size() == 1 and local.shape == value.shape:
        return local
    return value.full_tensor()


def full_tensor_metadata(lm: nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, full shape, dtype) of what ``iter_full_tensors`` yields, in order; no collective."""
    seen: set[int] = set()
    meta = []
    for name, tensor in lm.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            meta.append((name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")))
    return meta


def load_full_state_dict(
    lm: nn.Module,
    state_dict: dict[str, torch.Tensor],
    only: Callable[[str], bool] | None = None,
) -> None:
    """Copy full (unsharded) HF tensors into the sharded LM; every rank passes the same dict.
    ``only``: the parameters whose names it accepts (a LoRA adapter); the rest are kept."""
    expected = {name for name, _ in lm.named_parameters() if only is None or only(name)}
    missing = expected - set(state_dict)
    if missing:
        raise ValueError(f"checkpoint lacks parameters: {sorted(missing)[:5]}")
    params_only = {k: v for k, v in state_dict.items() if k in expected}
    set_model_state_dict(
        lm, params_only, options=StateDictOptions(full_state_dict=True, strict=False)
    )


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum float64 scalars over the default process group in one collective (no device
    round trip at world size 1)."""
    return _all_reduce(values, device, dist.ReduceOp.SUM)


def all_reduce_max(values: list[float], device: torch.device) -> list[float]:
    """Element-wise max of float64 scalars over the default process group."""
    return _all_reduce(values, device, dist.ReduceOp.MAX)


def _all_reduce(values: list[float], device: torch.device, op: dist.ReduceOp) -> list[float]:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [float(v) for v in values]
    buf = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(buf, op=op)
    return buf.tolist()


def join_process_group(
    rank: int, world_size: int, rendezvous: StoreAddress | None, device: str
) -> dist.Store | None:
    """Join the default process group at ``rendezvous`` (None: a world of one, which meets
    no one: an in-memory store, no listener). Returns the group's store when this call
    created the group (which the caller must destroy), else None.

    The caller keeps that store referenced for the group's life: a store written in Python
    (the rendezvous's ``SealedStore``) lives on in the group as a C++ object whose methods
    call back into the Python one, and once that is collected NCCL's lazy communicator set-up
    (the first collective, late at world size 1) and its watchdog fail with "Not implemented"."""
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise ValueError(
                f"a process group (rank {dist.get_rank()} of {dist.get_world_size()}) already "
                f"exists in this process; cannot join as rank {rank} of {world_size}"
            )
        return None
    if rendezvous is None:
        if world_size != 1:
            raise ValueError(f"rank {rank} of {world_size} needs the group's rendezvous address")
        store: dist.Store = dist.HashStore()
    else:
        store = rendezvous.connect(world_size, JOIN_TIMEOUT)
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=JOIN_TIMEOUT,
    )
    return store


def copy_tokenizer(source: str | Path, target: str | Path) -> None:
    """Copy the tokenizer of ``source`` into ``target`` when ``source`` has one."""
    from transformers import AutoTokenizer

    if not any((Path(source) / name).is_file() for name in _TOKENIZER_FILES):
        return
    try:
        AutoTokenizer.from_pretrained(source).save_pretrained(target)
    except (OSError, ValueError, TypeError) as exc:
        logger.info("no tokenizer copied from %s: %s", source, exc)
