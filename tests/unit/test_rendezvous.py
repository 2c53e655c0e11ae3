"""Rendezvous stores (``recipe.utils.rendezvous``): the trainer ranks' and the weight group's."""

from __future__ import annotations

import datetime
import socket
import threading

import pytest
import torch
import torch.distributed as dist

from recipe.utils.rendezvous import StoreAddress, StoreServer
from recipe.workers.trainer.fsdp_utils import join_process_group

TIMEOUT = datetime.timedelta(seconds=2)


def _gloo_group(address: StoreAddress, rank: int, world_size: int, store=None):
    return dist.ProcessGroupGloo(
        address.connect(world_size, TIMEOUT, store=store), rank, world_size, TIMEOUT
    )


def _in_threads(*calls):
    results: list[object] = [None] * len(calls)

    def run(index, call):
        try:
            results[index] = call()
        except Exception as exc:  # the test reads it
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def test_the_store_holds_its_port_and_answers_on_its_own_address_only():
    server = StoreServer.open(2, TIMEOUT, host="127.0.0.2")
    port = server.address.port
    # No bind-and-close: the port is taken from the start.
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.2", port))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    socket.create_connection(("127.0.0.2", port), timeout=2).close()
    assert StoreServer.open(2, TIMEOUT, host="127.0.0.2").address.secret != server.address.secret


def test_members_meet_under_the_secret_and_a_forged_one_never_joins():
    server = StoreServer.open(2, TIMEOUT, host="127.0.0.1", namespace="trainer")
    address = server.address

    def sum_of_ranks(rank: int, joined_at: StoreAddress):
        group = _gloo_group(joined_at, rank, 2, store=server.store if rank == 0 else None)
        value = torch.tensor([float(rank + 1)])
        group.allreduce([value]).wait()
        return value.item()

    assert _in_threads(lambda: sum_of_ranks(0, address), lambda: sum_of_ranks(1, address)) == [
        3.0,
        3.0,
    ]
    server = StoreServer.open(2, TIMEOUT, host="127.0.0.1", namespace="trainer")
    address = server.address
    forged = StoreAddress(address.host, address.port, "0" * 32, address.namespace)
    results = _in_threads(lambda: sum_of_ranks(0, address), lambda: sum_of_ranks(1, forged))
    assert all(isinstance(r, Exception) for r in results), results


def test_a_rank_of_a_larger_world_without_the_rendezvous_is_refused():
    with pytest.raises(ValueError, match="rank 1 of 2 needs the group's rendezvous address"):
        join_process_group(1, 2, None, "cpu")
