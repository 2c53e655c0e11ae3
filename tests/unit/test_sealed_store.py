"""``SealedStore`` (recipe/utils/sealed_store.py) over a live ``TCPStore``: what a member
reads back, and what the store itself holds (the view of a client without the secret)."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from recipe.utils.sealed_store import SealedStore, StoreSealError

TIMEOUT = datetime.timedelta(seconds=2)
SECRET = "5f0c" * 8


@pytest.fixture
def server() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, 1, True, timeout=TIMEOUT, wait_for_workers=False)


def _stored(server: dist.TCPStore) -> dict[str, bytes]:
    """Every key and value as a client without the secret reads them."""
    return {key: bytes(server.get(key)) for key in server.list_keys()}


def test_members_read_back_what_they_wrote_and_the_store_holds_neither_names_nor_values(
    server,
):
    sealed = SealedStore(server, SECRET, "weights")
    sealed.set("rank/0", "10.1.2.3:29500")
    sealed.set("rank/1", b"\x00\x01binary")
    sealed.multi_set(["a", "b"], [b"first", b"second"])
    assert sealed.get("rank/0") == b"10.1.2.3:29500"
    assert sealed.get("rank/1") == b"\x00\x01binary"
    assert sealed.multi_get(["a", "b"]) == [b"first", b"second"]
    assert sealed.check(["rank/0", "a"]) and not sealed.check(["never/set"])
    stored = _stored(server)
    assert len(stored) == 4
    for key, value in stored.items():
        assert key.startswith("weights/") and len(key) == len("weights/") + 64
        for plain in ("rank", SECRET, "first", "second", "10.1.2.3"):
            assert plain not in key and plain.encode() not in value
    # The same value sealed twice is stored differently (a fresh nonce each time).
    assert sealed.seal("x", b"same") != sealed.seal("x", b"same")


def test_a_value_forged_moved_or_sealed_under_another_secret_is_refused(server):
    sealed = SealedStore(server, SECRET, "weights")
    sealed.set("rank/0", "10.1.2.3:29500")
    sealed.set("rank/1", "10.1.2.4:29500")
    name_0, name_1 = sealed.name("rank/0"), sealed.name("rank/1")
    server.set(name_1, server.get(name_0))  # a genuine value, moved to another key
    with pytest.raises(StoreSealError, match=r"'rank/1' of 'weights' .* does not verify"):
        sealed.get("rank/1")
    server.set(name_0, b"10.6.6.6:29500")
    with pytest.raises(StoreSealError):
        sealed.get("rank/0")
    server.set(name_0, b"")
    with pytest.raises(StoreSealError):
        sealed.get("rank/0")
    stranger = SealedStore(server, "0" * 32, "weights")
    server.set(stranger.name("rank/0"), stranger.seal("rank/0", b"10.6.6.6:29500"))
    assert stranger.name("rank/0") != name_0
    with pytest.raises(StoreSealError):
        sealed.get("rank/0")


def test_counters_barriers_waits_and_clones_work_through_the_seal(server):
    sealed = SealedStore(server, SECRET, "trainer")
    assert sealed.add("arrived", 1) == 1 and sealed.add("arrived", 2) == 3
    sealed.barrier("start", 1, TIMEOUT)  # the store's own add + set + wait
    sealed.wait(["arrived"], TIMEOUT)
    with pytest.raises(dist.DistStoreError):
        sealed.wait(["never/set"], datetime.timedelta(milliseconds=200))
    clone = sealed.clone()
    clone.set("from/clone", b"v")
    assert sealed.get("from/clone") == b"v"
    assert sealed.delete_key("from/clone") and not sealed.check(["from/clone"])
    assert sealed.timeout == TIMEOUT
    assert not any("arrived" in key or "start" in key for key in server.list_keys())


def test_a_sealed_store_needs_a_secret(server):
    with pytest.raises(ValueError, match="non-empty secret"):
        SealedStore(server, "", "trainer")
