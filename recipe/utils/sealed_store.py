"""``SealedStore``: a ``torch.distributed`` store whose keys and values are sealed under a
group's secret, so a process that reaches the store's port but lacks the secret reads
nothing usable from it and cannot forge what the members read.

    member: set("0/1", addr)                                what a client of the port sees
      SealedStore -> TCPStore.set("trainer/" + HMAC(k_names, "0/1"),      a hashed name
                                  nonce | AES-GCM(k_values, addr))        opaque bytes
    member: get("0/1") <- verified, decrypted (else StoreSealError) <- TCPStore.get(same name)

``TCPStore`` has no authentication: any client that connects can ``list_keys``, ``get``,
``set``, ``add`` and ``delete_key`` anything (torch 2.13). So the secret is never sent to the
store; two keys are derived from it (HKDF-SHA256): one names keys (HMAC-SHA256, so the
listing shows only the namespace and digests), one seals values (AES-GCM with the stored
key name as associated data, so a value cannot be forged, altered or moved to another key).
Process groups take this store like any other (``ProcessGroupGloo``, ``ProcessGroupNCCL``,
``init_process_group(store=...)``): ``dist.Store`` is built to be subclassed in Python, and
its other operations (``multi_get``, ``multi_set``, ``barrier``) run through these methods.

What it does not protect: ``add`` counters are stored as plain integers (the store adds to
them on the server), so a stranger can read or bump an arrival count under its hashed name,
and anyone who reaches the port can delete or overwrite keys. Both can only make the group
fail (a value that does not verify raises ``StoreSealError``), never make it accept
something a stranger wrote. ``compare_set``, ``append``, queues and ``list_keys`` are not
offered (they raise): no process group here uses them.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
from collections.abc import Sequence

import torch.distributed as dist
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_NONCE_BYTES = 12  # AES-GCM's standard nonce, fresh from os.urandom for every value


class StoreSealError(RuntimeError):
    """A value in the store did not verify under the group's secret (written by a process
    outside the group, or by another group)."""


def _derive(secret: str, purpose: bytes) -> bytes:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose)
    return hkdf.derive(secret.encode())


class SealedStore(dist.Store):
    """The group's view of ``inner``: key names and values sealed under ``secret`` (see the
    module docstring). ``namespace`` stays readable in front of the hashed names."""

    def __init__(self, inner: dist.Store, secret: str, namespace: str) -> None:
        super().__init__()
        if not secret:
            raise ValueError("a sealed store needs a non-empty secret")
        self._inner, self._secret, self._namespace = inner, secret, namespace
        self._name_key = _derive(secret, b"rendezvous key names")
        self._aead = AESGCM(_derive(secret, b"rendezvous values"))
        self.set_timeout(inner.timeout)

    def name(self, key: str) -> str:
        """The name ``key`` is stored under in the inner store."""
        digest = hmac.new(self._name_key, key.encode(), hashlib.sha256).hexdigest()
        return f"{self._namespace}/{digest}"

    def seal(self, key: str, value: bytes | str) -> bytes:
        """``value`` as stored under ``key``: nonce, then ciphertext and tag."""
        data = value.encode() if isinstance(value, str) else bytes(value)
        nonce = os.urandom(_NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data, self.name(key).encode())

    def unseal(self, key: str, stored: bytes) -> bytes:
        """The value ``seal`` sealed for ``key``; ``StoreSealError`` if it does not verify."""
        nonce, sealed = stored[:_NONCE_BYTES], stored[_NONCE_BYTES:]
        try:
            return self._aead.decrypt(nonce, sealed, self.name(key).encode())
        except (InvalidTag, ValueError):
            raise StoreSealError(
                f"rendezvous key {key!r} of {self._namespace!r} holds a value that does not "
                "verify under the group's secret: written from outside the group, refused"
            ) from None

    # ---- dist.Store -------------------------------------------------------------------

    def set(self, key: str, value: bytes | str) -> None:
        self._inner.set(self.name(key), self.seal(key, value))

    def get(self, key: str) -> bytes:
        return self.unseal(key, bytes(self._inner.get(self.name(key))))

    def add(self, key: str, amount: int) -> int:
        return int(self._inner.add(self.name(key), amount))

    def check(self, keys: Sequence[str]) -> bool:
        return bool(self._inner.check([self.name(k) for k in keys]))

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta | None = None) -> None:
        names = [self.name(k) for k in keys]
        if timeout is None:
            self._inner.wait(names)
        else:
            self._inner.wait(names, timeout)

    def delete_key(self, key: str) -> bool:
        return bool(self._inner.delete_key(self.name(key)))

    def num_keys(self) -> int:
        """Keys in the whole inner store (as ``PrefixStore`` counts them)."""
        return int(self._inner.num_keys())

    def clone(self) -> SealedStore:
        return SealedStore(self._inner.clone(), self._secret, self._namespace)
