"""Rendezvous stores for process groups: this node's own address, a port held from its bind,
the group's keys and values sealed under a secret.

    server = StoreServer.open(world_size, timeout)     in the process that outlives the group
    server.address  -> StoreAddress(host, port, secret)  --(Ray)-->  every member
    member:  address.connect(world_size, timeout)      -> a store for ProcessGroup* /
                                                          init_process_group

The server answers on the address peers reach (Ray's node IP), not on every interface, and
takes over a socket that has listened since the port was chosen, so no other process can take
the port in between (no bind-and-close). An address that is not this host's is an error naming
it, never a fallback to every interface. ``TCPStore`` itself authenticates no one: a process
that reaches the port can list, read and write keys. So members see the store through a
``SealedStore`` (recipe/utils/sealed_store.py): key names are keyed hashes and values are
encrypted and authenticated under the secret, which never reaches the store. A process without
the secret reads neither the secret nor the members' addresses, and cannot forge a value that
a member would accept; it can still delete or overwrite keys, which fails the group.
"""

from __future__ import annotations

import datetime
import errno
import secrets
import socket
from dataclasses import dataclass

import torch.distributed as dist

from recipe.utils.sealed_store import SealedStore


def node_ip() -> str:
    """This node's address as Ray knows it (what peers on other hosts can reach)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:  # Ray is optional for in-process use
        pass
    return "127.0.0.1"


def listening_socket(host: str) -> int:
    """A TCP socket bound to ``host`` on a free port and listening; its file descriptor, for
    a server to take over (``TCPStore(master_listen_fd=...)``). The port is held from the
    bind on, and the server answers on this address only, not on every interface; a
    ``host`` that is not this host's raises ``ValueError`` naming it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:
                raise
            # The address peers use is not this host's own (NAT, a node IP set by hand):
            # listening on every interface instead would open the store to every network.
            raise ValueError(
                f"cannot serve a rendezvous store on {host}: it is not an address of this host; "
                "start Ray on this node with `ray start --node-ip-address=IP`, IP an address "
                "of this host that the other nodes reach"
            ) from None
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock.detach()


@dataclass(frozen=True, slots=True)
class StoreAddress:
    """Where a group's store answers and the secret its keys are sealed under (travels over
    Ray, never to the store)."""

    host: str
    port: int
    secret: str
    namespace: str = "group"
    """Readable prefix of the group's hashed key names (names the group in a shared store)."""

    def connect(
        self, world_size: int, timeout: datetime.timedelta, *, store: dist.Store | None = None
    ) -> dist.Store:
        """The group's view of the store: ``store`` (the server's own, in the serving
        process) or a new client connection, every key and value sealed under the secret."""
        if store is None:
            store = dist.TCPStore(self.host, self.port, world_size, False, timeout=timeout)
        return SealedStore(store, self.secret, self.namespace)


class StoreServer:
    """A ``TCPStore`` served from this process on this node's address (module docstring)."""

    def __init__(self, store: dist.TCPStore, address: StoreAddress):
        self.store, self.address = store, address

    @classmethod
    def open(
        cls,
        world_size: int,
        timeout: datetime.timedelta,
        *,
        host: str | None = None,
        namespace: str = "group",
    ) -> StoreServer:
        """Serve a store for ``world_size`` members on ``host`` (default: ``node_ip()``) with
        a fresh secret; returns at once (members connect when they join)."""
        host = host or node_ip()
        store = dist.TCPStore(
            host,
            0,
            world_size,
            True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=listening_socket(host),
        )
        return cls(store, StoreAddress(host, store.port, secrets.token_hex(16), namespace))

    def connect(self, world_size: int, timeout: datetime.timedelta) -> dist.Store:
        """The group's view of this server's store, for a member in the serving process."""
        return self.address.connect(world_size, timeout, store=self.store)
