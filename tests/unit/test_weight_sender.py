"""``WeightSender`` (recipe/checkpoint_engine/endpoints.py): what its remote protocol offers.

Anything that holds a trainer rank's handle can call ``weight_sender_call(method, ...)``, so
the protocol carries only the push itself; a test that needs a corrupted push arms the
engine's fault inside the actor (tests/integration/test_weight_sync.py)."""

from __future__ import annotations

import pytest
import torch

from recipe.checkpoint_engine.endpoints import WeightSender


def test_the_sender_protocol_is_the_push_alone_with_no_fault_injection():
    sender = WeightSender(0, list, torch.device("cpu"))
    assert sender.methods == {"info", "prepare", "init", "send", "commit", "get_version", "close"}
    with pytest.raises(ValueError, match="WeightSender has no method 'corrupt_next'"):
        sender.call("corrupt_next", 3)
