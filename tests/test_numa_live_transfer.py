"""The Transferer: a profile crosses a real TCP socket, authenticated by a token."""

from __future__ import annotations

import pytest

from virtlab.numa.profile import synthetic_profile
from virtlab.numa.transfer import ProfileReceiver, TransferError, new_token, send_profile


def test_profile_round_trips():
    token = new_token()
    profile = synthetic_profile("vm1", misses_per_10k=700, memory_mib=512, memory_mib_by_node={0: 512})
    seen = []
    with ProfileReceiver(token, callback=lambda vm, p: seen.append(vm)) as receiver:
        send_profile(receiver.address, token, "vm1", profile)
        assert receiver.received(timeout=5) == ("vm1", profile)
    assert seen == ["vm1"]


def test_wrong_token_is_refused_and_nothing_delivered():
    with ProfileReceiver(new_token()) as receiver:
        with pytest.raises(TransferError, match="bad token"):
            send_profile(receiver.address, new_token(), "vm1", synthetic_profile("vm1", 1, 64))
        assert receiver.received(timeout=0.2) is None
        assert receiver.refused == ["bad token"]


def test_binds_to_loopback_by_default():
    with ProfileReceiver(new_token()) as receiver:
        host, port = receiver.address
        assert host == "127.0.0.1" and port > 0


def test_short_token_refused():
    with pytest.raises(ValueError, match="too short"):
        ProfileReceiver("abc")
