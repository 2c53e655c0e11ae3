"""Rendezvous stores for process groups: this node's own address, a port held from its bind,
the group's keys under a secret.

    server = StoreServer.open(world_size, timeout)     in the process that outlives the group
    server.address  -> StoreAddress(host, port, secret)  --(Ray)-->  every member
    member:  address.connect(world_size, timeout)      -> a store for ProcessGroup* /
                                                          init_process_group

The server answers on the address peers reach (Ray's node IP), not on every interface, and
takes over a socket that has listened since the port was chosen, so no other process can take
the port in between (no bind-and-close). A process that reaches the port but lacks the secret
sees none of the group's keys and cannot join it or forge its rendezvous.
"""

from __future__ import annotations

import datetime
import errno
import logging
import secrets
import socket
from dataclasses import dataclass

import torch.distributed as dist

logger = logging.getLogger(__name__)


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
    bind on, and the server answers on this address only, not on every interface."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:
                raise
            # The address peers use is not this host's own (NAT, a node IP set by hand).
            logger.warning("%s is not an address of this host: listening on all of them", host)
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock.detach()


@dataclass(frozen=True, slots=True)
class StoreAddress:
    """Where a group's store answers and the secret its keys live under (travels over Ray)."""

    host: str
    port: int
    secret: str
    namespace: str = "group"
    """Prefix of the group's keys before the secret (names the group in a shared store)."""

    def connect(
        self, world_size: int, timeout: datetime.timedelta, *, store: dist.Store | None = None
    ) -> dist.Store:
        """The group's view of the store: ``store`` (the server's own, in the serving
        process) or a new client connection, with every key under the namespace and secret."""
        if store is None:
            store = dist.TCPStore(self.host, self.port, world_size, False, timeout=timeout)
        return dist.PrefixStore(f"{self.namespace}/{self.secret}", store)


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
