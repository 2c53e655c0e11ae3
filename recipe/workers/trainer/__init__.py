"""The trainer side: ``TrainerRanks`` (ranks.py) runs one ``TrainerWorker`` (worker.py) per
rank as a Ray actor, each an FSDP2 shard of the policy; the rest are its pieces (batches, loss,
micro-batches, log-prob head, weight slots, the non-finite probe, train state)."""
