"""Rendezvous stores (``recipe.utils.rendezvous``): the trainer ranks' and the weight group's."""

from __future__ import annotations

import datetime
import socket
import subprocess
import sys
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


def test_a_client_without_the_secret_reads_nothing_usable_and_cannot_forge_a_value():
    server = StoreServer.open(2, TIMEOUT, host="127.0.0.1", namespace="trainer")
    address = server.address

    def meet(rank: int) -> None:
        _gloo_group(address, rank, 2, store=server.store if rank == 0 else None)

    assert _in_threads(lambda: meet(0), lambda: meet(1)) == [None, None]
    member = address.connect(2, TIMEOUT, store=server.store)
    member.set("peer", b"10.1.2.3:29500")
    stranger = dist.TCPStore(address.host, address.port, 2, False, timeout=TIMEOUT)
    stored = {key: bytes(stranger.get(key)) for key in stranger.list_keys()}
    assert len(stored) >= 3  # gloo's two rank addresses and ours
    for key, value in stored.items():
        assert address.secret not in key and address.secret.encode() not in value
        assert "peer" not in key and b"10.1.2.3" not in value
    for key in stored:
        stranger.set(key, b"10.6.6.6:29500")  # what a stranger would have the members join
    with pytest.raises(RuntimeError, match="does not verify under the group's secret"):
        member.get("peer")


def test_a_node_address_that_is_not_this_hosts_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"192\.0\.2\.1: it is not an address of this host") as e:
        StoreServer.open(2, TIMEOUT, host="192.0.2.1")  # TEST-NET-1: never a local address
    assert "--node-ip-address" in str(e.value) and "\n" not in str(e.value)


_RANK_1 = """
import datetime, sys, torch, torch.distributed as dist
from recipe.utils.rendezvous import StoreAddress
address = StoreAddress(sys.argv[1], int(sys.argv[2]), sys.argv[3], "trainer")
timeout = datetime.timedelta(seconds=30)
store = address.connect(2, timeout)
dist.init_process_group("gloo", store=store, rank=1, world_size=2, timeout=timeout)
value = torch.tensor([2.0])
dist.all_reduce(value)
dist.destroy_process_group()
print(value.item())
"""


def test_init_process_group_meets_through_the_sealed_store():
    server = StoreServer.open(2, TIMEOUT, host="127.0.0.1", namespace="trainer")
    address = server.address
    rank_1 = subprocess.Popen(
        [sys.executable, "-c", _RANK_1, address.host, str(address.port), address.secret],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert join_process_group(0, 2, address, "cpu") is not None
        try:
            value = torch.tensor([1.0])
            dist.all_reduce(value)
        finally:
            dist.destroy_process_group()
        out, _ = rank_1.communicate(timeout=60)
    finally:
        if rank_1.poll() is None:
            rank_1.kill()
            rank_1.wait()
    assert rank_1.returncode == 0 and out.split() == ["3.0"] and value.item() == 3.0


# After the join returns, a collective that reaches the store for the first time: a new gloo
# group on CPU, NCCL's lazily created communicator (a scatter) on a GPU.
_LATE_STORE_USE = """
import datetime, gc, sys, torch, torch.distributed as dist
from recipe.utils.rendezvous import StoreServer
from recipe.workers.trainer.fsdp_utils import join_process_group
keep, device = sys.argv[1] == "keep", sys.argv[2]
server = StoreServer.open(1, datetime.timedelta(seconds=30), host="127.0.0.1", namespace="t")
store = join_process_group(0, 1, server.address, device)
if not keep:
    del store
gc.collect()
if device == "cuda":
    torch.cuda.set_device(0)
    out = torch.zeros(2, device="cuda")
    dist.scatter(out, [torch.ones(2, device="cuda")], src=0)
else:
    out = torch.ones(2)
    dist.all_reduce(out, group=dist.new_group(ranks=[0], backend="gloo"))
dist.destroy_process_group()
print(out.sum().item())
"""


def _late_store_use(keep: bool, device: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-c", _LATE_STORE_USE, "keep" if keep else "drop", device]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def _store_outlives_the_join(device: str) -> None:
    kept = _late_store_use(True, device)
    assert kept.returncode == 0 and kept.stdout.split() == ["2.0"], kept.stderr[-2000:]
    # Why the caller must keep it: the group's store is the Python one, and once that is
    # collected the store's methods are gone ("Not implemented" from torch's trampoline).
    dropped = _late_store_use(False, device)
    assert dropped.returncode != 0 and "Not implemented" in dropped.stderr


def test_the_group_store_returned_by_the_join_keeps_later_collectives_working():
    _store_outlives_the_join("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nccls_lazy_communicator_reaches_the_kept_store():
    _store_outlives_the_join("cuda")
