"""The buckets' transfer and verify of a push (``moves=BUCKETS``, transports.py).

    transfer   every trainer rank gathers its shards, rank 0 sends the layout's buckets
               (its ``CheckpointEngine``, base.py) || every replica's engine workers stage
               and checksum every bucket
    verify     the driver compares every receiver's checksums with the sender's

Every replica then holds the new weights in staging, its engine's own weights untouched:
``PushTransport`` (transport.py) numbers the transfer and has the (paused) replicas load it.
"""

from __future__ import annotations

import time

from recipe.checkpoint_engine.base import ChecksumMismatchError, TransferReport
from recipe.checkpoint_engine.peer_calls import PeerCalls
from recipe.checkpoint_engine.phases import SENDER, replica_peer
from recipe.observability.trace import SENDER_TID


def transfer_buckets(peers: PeerCalls, transfer_id: int, target: int) -> dict[str, float]:
    """Transfer + verify of transfer ``transfer_id`` (version ``target``): every replica
    holds the new weights in staging. Returns its ``sync/*`` seconds (gather, transfer,
    verify)."""
    calls = peers.on_ranks(lambda s: s.send(transfer_id, target))
    calls |= peers.on_replicas(lambda _, r: r.receive(transfer_id))
    start = time.perf_counter()
    start_us = time.time() * 1e6
    wire = peers.phase("transfer", calls)
    transfer_s = time.perf_counter() - start
    sent = TransferReport.from_wire(wire[SENDER])
    received = [
        [TransferReport.from_wire(w) for w in wire[replica_peer(i)]]
        for i in range(len(peers.workers))
    ]
    # The sender (trainer rank 0) gathers shards before sending; it reports how long.
    gather_us = start_us + sent.gather_s * 1e6
    peers.tracer.complete("gather", start_us, gather_us, tid=SENDER_TID, cat="sync")
    verify_s = verify_checksums(sent, received, verify=peers.cfg.verify)
    return {
        "sync/gather_s": sent.gather_s,
        "sync/transfer_s": transfer_s,
        "sync/verify_s": verify_s,
    }


def verify_checksums(
    sent: TransferReport, received: list[list[TransferReport]], *, verify: bool
) -> float:
    """Driver-side comparison of every receiver's checksums with the sender's (replica
    i's engine workers in ``received[i]``; none without ``verify``, i.e.
    ``checkpoint_engine.verify``); returns the verification cost (sender's checksum time +
    the slowest receiver's)."""
    receiver_s = 0.0
    for i, workers in enumerate(received):
        for worker in workers:
            receiver_s = max(receiver_s, worker.verify_s)
            if not verify or worker.checksums == sent.checksums:
                continue
            pairs = zip(worker.checksums, sent.checksums, strict=False)
            bad = next((k for k, (a, b) in enumerate(pairs) if a != b), "count")
            detail = f"bucket {bad} differs from the sender's checksum"
            raise ChecksumMismatchError("verify", replica_peer(i), detail)
    return sent.verify_s + receiver_s
