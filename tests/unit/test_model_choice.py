"""Which model nodes a user's anonymous client may send a prompt to (overlay/anon/client.py, decision
0013 item 6): trusted nodes of audited models; unaudited models only with ``--allow-unaudited``;
untrusted nodes never, except as a verifier's explicit ``failover=False`` target."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from overlay.anon.client import AnonClient, AnonError, ModelUnaudited, ReplyUnverified, usable_nodes
from overlay.net.peers import PeerEntry, usable
from overlay.wire.constants import TRUST_LINE

MODEL = "m"


def node(i: int, reputation: int | None = 900_000, audited: bool | None = True, model: str = MODEL) -> PeerEntry:
    return PeerEntry(bytes([i]) * 20, f"10.0.0.{i}:9000", bytes([i]) * 32, b"x" * 32, role="model", models=(model,),
                     reputation=reputation, audited=audited)


def client(entries: list[PeerEntry], **kw: object) -> AnonClient:
    paths = SimpleNamespace(target=4)
    return AnonClient(paths, lambda m: [e for e in entries if m in e.models], lambda peer, msg: True,  # type: ignore[arg-type]
                      rng=random.Random(3), **kw)  # type: ignore[arg-type]


def test_usable_is_trusted_and_audited_or_opted_in() -> None:
    assert usable(node(1)) and usable(node(1, TRUST_LINE))
    assert not usable(node(1, TRUST_LINE - 1)) and not usable(node(1, TRUST_LINE - 1), allow_unaudited=True)
    assert not usable(node(1, audited=False)) and usable(node(1, audited=False), allow_unaudited=True)
    # No committee vouches (a peer or registry file): trust and audit unknown, the node is used.
    assert usable(node(1, None, None)) and node(1, None, None).trusted


def test_the_chooser_skips_untrusted_and_unaudited_nodes() -> None:
    good, low, plain = node(1), node(2, reputation=TRUST_LINE - 1), node(3, audited=False)
    c = client([good, low, plain])
    assert {c.choose_model_node(MODEL).node_id for _ in range(50)} == {good.node_id}
    # Affinity to an untrusted or unaudited node is dropped; to a usable one kept.
    assert c.choose_model_node(MODEL, low.node_id) == good
    assert c.choose_model_node(MODEL, plain.node_id) == good
    assert c.usable(MODEL) == [good]
    # --allow-unaudited adds the unaudited node, never the untrusted one.
    c.allow_unaudited = True
    assert {c.choose_model_node(MODEL).node_id for _ in range(50)} == {good.node_id, plain.node_id}
    assert c.choose_model_node(MODEL, plain.node_id) == plain
    assert c.choose_model_node(MODEL, low.node_id) != low
    assert client([good, low, plain], allow_unaudited=True).usable(MODEL) == [good, plain]


def test_a_model_with_only_unaudited_nodes_fails_naming_the_flag_unless_allowed() -> None:
    nodes = [node(1, audited=False), node(2, audited=False), node(3, reputation=10, audited=False)]
    c = client(nodes)
    with pytest.raises(ModelUnaudited) as e:
        c.choose_model_node(MODEL)
    assert str(e.value) == ("model m is not audited by the committee's verifiers (no verifier with enough voting "
                            "power holds it); pass --allow-unaudited to use it anyway")
    assert e.value.model == MODEL
    c.allow_unaudited = True
    assert c.choose_model_node(MODEL) in nodes[:2]


def test_no_trusted_node_and_no_node_at_all_are_plain_errors() -> None:
    with pytest.raises(AnonError, match=r"^no model node serving 'm' is trusted") as e:
        client([node(1, reputation=0), node(2, reputation=TRUST_LINE - 1, audited=False)],
               allow_unaudited=True).choose_model_node(MODEL)
    assert not isinstance(e.value, ModelUnaudited)
    with pytest.raises(AnonError, match=r"^no model node in the registry serves 'x'"):
        client([node(1)]).choose_model_node("x")
    assert usable_nodes([node(1, None, None)], MODEL) == [node(1, None, None)]


def test_a_verifiers_explicit_target_is_reached_whatever_its_standing() -> None:
    """Audits send to one given node with failover=False: untrusted and unaudited nodes too."""
    low, plain = node(2, reputation=0, audited=False), node(3, audited=False)
    c = client([low, plain])
    assert c.choose_model_node(MODEL, low.node_id, exact=True) == low
    assert c.choose_model_node(MODEL, plain.node_id, exact=True) == plain
    with pytest.raises(AnonError, match="not listed as serving"):
        c.choose_model_node(MODEL, b"\x09" * 20, exact=True)
    with pytest.raises(ModelUnaudited):
        c.choose_model_node(MODEL, plain.node_id)  # a user's affinity is no explicit target


def test_a_users_reply_signed_by_an_untrusted_node_is_not_read() -> None:
    """A trusted node cannot hand a user's prompt on to an untrusted one: the reply's signer must be
    trusted, else the request fails over (for a verifier's challenge any listed node counts)."""
    from overlay.anon.client import _NodeFailed

    good, low = node(1), node(2, reputation=TRUST_LINE - 1)
    c = client([good, low])
    digest = b"d" * 32
    assert c._checker(good.node_id, digest, MODEL).node_id == good.node_id
    with pytest.raises(_NodeFailed, match="does not trust") as e:
        c._checker(low.node_id, digest, MODEL)
    assert e.value.nodes == (low.node_id,)
    assert c._checker(low.node_id, digest, MODEL, any_standing=True).node_id == low.node_id
    with pytest.raises(ReplyUnverified, match="does not list"):
        c._checker(b"\x09" * 20, digest, MODEL, any_standing=True)
