"""The model node's store of served replies (model_node/served.py, decision 0037 step 5): what it
keeps of a completed reply to a request addressed to this node, how a released commitment finds
it, and its bounds (bytes, age: the oldest go first, counted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_node.served import Kept, ServedStore
from overlay.anon import signing
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.wire import crypto
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, ReplyChunk, Request, SamplingParams

MODEL = "smollm2-135m-instruct"
PARAMS = SamplingParams(0.7, 1.0, 0, 64, None)
NOW_MS = 1_700_000_000_000


def request(text: str, params: SamplingParams = PARAMS, **kw: object) -> Request:
    fields: dict[str, object] = dict(request_id=crypto.random_bytes(16), model=MODEL,
                                     messages=(ChatMessage("user", text),), params=params, k=3, return_paths=(),
                                     continuation="")
    fields.update(kw)
    return Request(**fields)  # type: ignore[arg-type]


def reply(req: Request, target: bytes, signer: Identity, texts: list[str], at_ms: int = NOW_MS) -> list[ReplyChunk]:
    """``signer``'s signed chunks answering ``req`` addressed to ``target``."""
    s = signing.ReplySigner(signing.request_digest(req, target), req.model, signer.node_id)
    out = []
    for i, t in enumerate(texts):
        done = i == len(texts) - 1
        chain, sig = s.add(t, (i, i + 1), done, at_ms, signer.signing.sign)
        out.append(ReplyChunk(request_id=req.request_id, seq=i, text=t, token_ids=(i, i + 1), done=done, error="",
                              node=signer.node_id, chain=chain, signature=sig, signed_at_ms=at_ms))
    return out


def serve(store: ServedStore, req: Request, me: Identity, texts: list[str], now_ms: int = NOW_MS,
          signer: Identity | None = None) -> Kept | None:
    """Record the reply as the server does, chunk by chunk; what it kept."""
    rec = store.begin(req, me.node_id)
    assert rec is not None
    for chunk in reply(req, me.node_id, signer or me, texts, now_ms):
        kept = rec.add(chunk)
        if kept is not None:
            store.keep(kept, now_ms)
            return kept
    return None


def test_a_completed_reply_is_kept_and_found_by_its_commitment() -> None:
    store, me = ServedStore(), Identity.generate()
    req = request("what is a quine?")
    kept = serve(store, req, me, ["a program ", "that prints ", "itself"])
    assert kept is not None and len(store) == 1 and store.kept == 1
    digest = signing.request_digest(req, me.node_id)
    assert kept.digest == digest == wire.committed_digest(MODEL, req.messages, PARAMS, req.request_id, me.node_id)
    assert kept.chunks == (("a program ", (0, 1)), ("that prints ", (1, 2)), ("itself", (2, 3)))
    assert kept.served_by == me.node_id and kept.node_id == me.node_id and kept.signed_at_ms == NOW_MS
    secret = wire.escrowed_secret(digest)
    value = wire.commitment(escrow.nonce_of(secret), me.node_id, digest)
    found = store.find(secret, value)
    assert found is not None and found.request_id == req.request_id
    # the transcript it makes checks as the donor's would: the signature over the chain of its chunks
    body = found.revealed(secret)
    chain = signing.chain_start(digest)
    for text, ids in body.chunks:
        chain = signing.chain_next(chain, text, ids)
    signing.verify_reply(me.ed25519_public, body.signature, digest, chain, True, MODEL, me.node_id,
                         body.signed_at_ms)
    assert body.secret == escrow.scalar_bytes(secret) and body.nonce == escrow.nonce_of(secret)
    # another secret, or a commitment of the same request to another node: nothing
    assert store.find(wire.escrowed_secret(digest), value) is None
    elsewhere = wire.commitment(escrow.nonce_of(secret), Identity.generate().node_id, digest)
    assert store.find(secret, elsewhere) is None
    # a secret without the request's locator (decision 0038) is not looked for among other locators
    bare = escrow.new_secret()
    assert wire.secret_locator(bare) != wire.locator(digest)
    assert store.find(bare, wire.commitment(escrow.nonce_of(bare), me.node_id, digest)) is None


def test_a_reply_a_member_signed_is_kept_for_the_node_addressed() -> None:
    store, me, member = ServedStore(), Identity.generate(), Identity.generate()
    req = request("forwarded")
    kept = serve(store, req, me, ["by ", "the member"], signer=member)
    assert kept is not None and kept.served_by == member.node_id and kept.node_id == me.node_id
    secret = wire.escrowed_secret(signing.request_digest(req, me.node_id))
    value = wire.commitment(escrow.nonce_of(secret), me.node_id, signing.request_digest(req, me.node_id))
    found = store.find(secret, value)
    assert found is not None and found.served_by == member.node_id and found.request_id == req.request_id
    # a commitment naming the member (not the node addressed) does not open it
    as_member_digest = signing.request_digest(req, member.node_id)
    as_member = wire.escrowed_secret(as_member_digest)
    assert store.find(as_member, wire.commitment(escrow.nonce_of(as_member), member.node_id, as_member_digest)) is None


def test_what_can_never_be_a_transcript_is_not_kept() -> None:
    store, me, other = ServedStore(), Identity.generate(), Identity.generate()
    assert store.begin(request("x", SamplingParams(0.7, 1.0, 0, 64, 7)), me.node_id) is None
    assert store.begin(request("x", continuation="earlier part"), me.node_id) is None
    assert store.begin(request("x", SamplingParams(0.7, 1.0, 0, wire.TRANSCRIPT_MAX_TOKENS + 1, None)),
                       me.node_id) is None
    req = request("an error midway")
    rec = store.begin(req, me.node_id)
    assert rec is not None
    first, last = reply(req, me.node_id, me, ["ok ", "gone"])
    assert rec.add(first) is None and rec.add(ReplyChunk(
        request_id=req.request_id, seq=1, text="", token_ids=(), done=True, error="boom", node=me.node_id, chain=b"",
        signature=b"", signed_at_ms=0)) is None
    assert rec.add(last) is None and not rec.open
    req = request("two signers")
    rec = store.begin(req, me.node_id)
    assert rec is not None
    assert rec.add(reply(req, me.node_id, me, ["a", "b"])[0]) is None
    assert rec.add(reply(req, me.node_id, other, ["a", "b"])[1]) is None
    assert len(store) == 0
    assert store.skipped == {"seeded": 1, "continuation": 1, "limits": 1, "error": 1, "signers": 1}


def test_the_oldest_go_first_when_the_bytes_run_out_and_are_counted() -> None:
    me = Identity.generate()
    one = serve(ServedStore(), request("q0"), me, ["x" * 1000])
    assert one is not None
    store = ServedStore(max_bytes=3 * one.size + one.size // 2)
    reqs = [request(f"q{i}") for i in range(5)]
    for i, req in enumerate(reqs):
        serve(store, req, me, ["x" * 1000], NOW_MS + i)
    assert [k.request_id for k in store.entries()] == [r.request_id for r in reqs[2:]]
    assert store.dropped == {"full": 2} and store.bytes == sum(k.size for k in store.entries()) <= store.max_bytes
    assert store.kept == 5
    huge = ServedStore(max_bytes=one.size - 1)
    serve(huge, request("q9"), me, ["x" * 1000])
    assert len(huge) == 0 and huge.dropped == {"too large": 1}


def test_a_dropped_entry_is_not_found_and_the_newest_of_one_locator_is() -> None:
    """The locator index (decision 0038) follows the entries: the same request served twice (a
    retry under its id) is found as served last, and neither once both are gone."""
    me = Identity.generate()
    req, other = request("retried"), request("other")
    digest = signing.request_digest(req, me.node_id)
    secret = wire.escrowed_secret(digest)
    value = wire.commitment(escrow.nonce_of(secret), me.node_id, digest)
    store = ServedStore(retention_ms=10 * 60 * 1000)
    serve(store, req, me, ["first"], NOW_MS)
    serve(store, other, me, ["z"], NOW_MS + 1)
    serve(store, req, me, ["second"], NOW_MS + 5 * 60 * 1000)
    found = store.find(secret, value)
    assert found is not None and found.chunks[0][0] == "second"
    store.prune(NOW_MS + 10 * 60 * 1000 + 1)  # the first two go
    found = store.find(secret, value)
    assert len(store) == 1 and found is not None and found.chunks[0][0] == "second"
    store.prune(NOW_MS + 15 * 60 * 1000)
    assert len(store) == 0 and store.find(secret, value) is None
    serve(store, other, me, ["z"], NOW_MS + 16 * 60 * 1000)  # the store goes on after being emptied
    other_digest = signing.request_digest(other, me.node_id)
    again = wire.escrowed_secret(other_digest)
    assert store.find(again, wire.commitment(escrow.nonce_of(again), me.node_id, other_digest)) is not None


def test_entries_past_the_retention_go_and_are_counted() -> None:
    me = Identity.generate()
    store = ServedStore(retention_ms=45 * 60 * 1000)
    old, new = request("old"), request("new")
    serve(store, old, me, ["a"], NOW_MS)
    serve(store, new, me, ["b"], NOW_MS + 30 * 60 * 1000)
    store.prune(NOW_MS + 45 * 60 * 1000 - 1)
    assert len(store) == 2
    store.prune(NOW_MS + 45 * 60 * 1000)
    assert [k.request_id for k in store.entries()] == [new.request_id] and store.dropped == {"expired": 1}
    # keeping prunes too
    serve(store, request("later"), me, ["c"], NOW_MS + 80 * 60 * 1000)
    assert [k.chunks[0][0] for k in store.entries()] == ["c"] and store.dropped == {"expired": 2}
    assert store.bytes == store.entries()[0].size


def test_a_model_node_with_a_committee_keeps_and_reveals_unless_told_not_to(tmp_path: Path) -> None:
    from gentorrent.cli import build_parser
    from model_node.run import withheld
    from overlay.directory.lists import ValidatorKey
    from overlay.directory.membership import CommitteeSettings

    key = crypto.SigningKey.generate().public_bytes
    committee = CommitteeSettings(("v0:26657", "v1:26657"), "chain", (ValidatorKey(key, 10),))
    me = Identity.generate()
    on = build_parser().parse_args(["model-node"])
    off = build_parser().parse_args(["model-node", "--no-reveal-withheld"])
    store, reveals = withheld(committee, me, on, tmp_path)
    assert store is not None and reveals is not None and reveals.store is store
    assert reveals.addresses == committee.addresses and set(reveals.validators()) == {key}
    assert store.log is not None and store.log.directory == tmp_path / "served"  # kept on disk
    assert reveals.plans_file == tmp_path / "reveal-plans.msgpack"  # and the sets read under
    assert (store.max_disk_bytes, store.max_bytes) == (4 << 30, 512 << 20)  # the index: at least 512 MiB
    assert withheld(committee, me, off, tmp_path) == (None, None)
    assert withheld(None, me, on, tmp_path) == (None, None)
    big = build_parser().parse_args(["model-node", "--served-store-gib", "16"])
    store, _ = withheld(committee, me, big, tmp_path)
    assert store is not None and (store.max_disk_bytes, store.max_bytes) == (16 << 30, 2 << 30)  # an eighth
    for bad in ("0", "-1", "lots", "2000"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["model-node", "--served-store-gib", bad])
