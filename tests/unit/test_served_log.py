"""The served store on disk (model_node/served_log.py, decision 0037 step 5): a model node that
restarts still holds, and hands in, the replies it served before; a torn or damaged file loses
what follows the damage and nothing else; segments go once past the retention or once the store,
past its byte caps, holds nothing of them; only an index stays in memory (decision 0038), so a
flood of long prompts must fill the disk, not the memory, to push a withheld reply out."""

from __future__ import annotations

import random
import stat
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_node.served import _SLOT_BYTES, RETENTION_MS, ServedStore
from model_node.served_log import SEGMENT_MS, LogError, ServedLog, decode_entry, encode_entry, frame
from overlay.anon import signing
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.wire.identity import Identity
from tests.unit.test_served_store import NOW_MS, request, serve


def served(tmp: Path, n: int, *, every_ms: int = 1000, log: ServedLog | None = None,
           **caps: int) -> tuple[ServedStore, Identity]:
    """A store on ``tmp`` (``caps``: its byte caps) that served ``n`` requests ``every_ms`` apart from NOW_MS."""
    store, me = ServedStore.open(log or ServedLog(tmp), NOW_MS, **caps), Identity.generate()
    for i in range(n):
        assert serve(store, request(f"question {i}"), me, [f"answer {i}", "."], NOW_MS + i * every_ms) is not None
    return store, me


def segments(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("served-*.log"))


def test_a_restarted_node_still_finds_and_hands_in_what_it_served_before(tmp_path: Path) -> None:
    """The framer's withheld good reply was served before the node restarted: after the release the
    node rebuilds the secret and finds the request in the store it loaded from disk."""
    store, me = ServedStore.open(ServedLog(tmp_path), NOW_MS), Identity.generate()
    req = request("the framer's question")
    kept = serve(store, req, me, ["a good ", "answer"])
    assert kept is not None
    secret = wire.escrowed_secret(signing.request_digest(req, me.node_id))
    value = wire.commitment(escrow.nonce_of(secret), me.node_id, signing.request_digest(req, me.node_id))
    again = ServedStore.open(ServedLog(tmp_path), NOW_MS + 20 * 60 * 1000)  # the restart, before the release
    found = again.find(secret, value)
    assert found is not None and found == store.entries()[0]
    body = found.revealed(secret)
    assert body.chunks == (("a good ", (0, 1)), ("answer", (1, 2))) and body.secret == escrow.scalar_bytes(secret)
    # and without the disk, the control: nothing
    assert ServedStore().find(secret, value) is None


def test_the_files_are_private_to_the_node(tmp_path: Path) -> None:
    served(tmp_path / "served", 1)
    (seg,) = segments(tmp_path / "served")
    assert stat.S_IMODE(seg.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "served").stat().st_mode) == 0o700


def test_a_write_cut_short_loses_that_entry_only(tmp_path: Path) -> None:
    store, _ = served(tmp_path, 3)
    before = store.entries()
    (seg,) = segments(tmp_path)
    size = seg.stat().st_size
    with seg.open("r+b") as f:
        f.truncate(size - 5)  # the process died writing the third
    log = ServedLog(tmp_path)
    again = ServedStore.open(log, NOW_MS + 10_000)
    assert [k.request_id for k in again.entries()] == [k.request_id for k in before[:2]]
    assert log.counts["torn"] == 1
    third = len(frame(encode_entry(before[2])))
    assert seg.stat().st_size == size - third  # truncated at the bad frame: the next append follows good ones
    assert serve(again, request("after"), Identity.generate(), ["x"], NOW_MS + 11_000) is not None
    assert len(ServedStore.open(ServedLog(tmp_path), NOW_MS + 12_000)) == 3


@pytest.mark.parametrize("damage", ["checksum", "length", "garbage"])
def test_a_damaged_frame_drops_the_rest_of_its_segment_and_nothing_else(tmp_path: Path, damage: str) -> None:
    store, _ = served(tmp_path, 3, every_ms=SEGMENT_MS)  # three segments, one entry each
    before = store.entries()
    _, second, _ = segments(tmp_path)
    data = bytearray(second.read_bytes())
    if damage == "checksum":
        data[10] ^= 1
    elif damage == "length":
        data[0:4] = (2**31).to_bytes(4, "big")
    else:
        data[:] = random.Random(7).randbytes(len(data))
    second.write_bytes(bytes(data))
    log = ServedLog(tmp_path)
    again = ServedStore.open(log, NOW_MS + 2 * SEGMENT_MS + 1)
    assert [k.request_id for k in again.entries()] == [before[0].request_id, before[2].request_id]
    assert log.counts["torn"] == 1 and second.stat().st_size == 0


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_an_entry_that_is_not_one_is_refused_with_a_reason(raw: bytes) -> None:
    try:
        decode_entry(raw)
    except LogError as exc:
        assert str(exc)


def test_entries_round_trip_and_every_field_is_checked(tmp_path: Path) -> None:
    store, _ = served(tmp_path, 1)
    k = store.entries()[0]
    assert decode_entry(encode_entry(k)) == k
    import msgpack

    v = msgpack.unpackb(encode_entry(k))
    bomb = zlib.compress(bytes(wire.MAX_REVEAL_BYTES + 1))  # inflates past what a body may be
    for i, bad in ((0, 1), (0, 3), (0, True), (1, -1), (2, 0), (3, b"\x00" * 31), (4, b"\x00" * 19),
                   (4, Identity.generate().node_id), (5, b"\x90"), (5, zlib.compress(b"\x90")), (5, bomb),
                   (5, v[5] + b"\x00")):
        w = list(v)
        w[i] = bad
        with pytest.raises(LogError):
            decode_entry(msgpack.packb(w, use_bin_type=True))
    # version 1, the body plain and no node id in the head (files written before decision 0038), is still read
    old = msgpack.packb([1, *v[1:4], zlib.decompress(v[5])], use_bin_type=True)
    assert decode_entry(old) == k
    with pytest.raises(LogError):
        decode_entry(msgpack.packb([1, *v[1:4], v[5]], use_bin_type=True))


def test_a_prompt_of_long_tokens_is_kept_compressed(tmp_path: Path) -> None:
    """A flood's cheapest bytes are prompts of long tokens ("____" is one token of 32 bytes): kept
    as they came, 4,096 of them would take 128 KiB a request; compressed, a few hundred bytes."""
    store, me = served(tmp_path, 0)
    kept = serve(store, request("_" * 32 * 4000), me, ["ok"])
    assert kept is not None and store.disk_bytes < 2_000
    assert store.entries()[0].messages == kept.messages


def test_segments_go_once_past_the_retention(tmp_path: Path) -> None:
    store, _ = served(tmp_path, 4, every_ms=SEGMENT_MS)  # segments at 0, 15, 30, 45 minutes
    assert len(store) == 3 and len(segments(tmp_path)) == 3  # at 45 the first expired, and its segment went
    log = ServedLog(tmp_path)
    later = NOW_MS + 3 * SEGMENT_MS + RETENTION_MS - 1  # the last entry still within the retention
    again = ServedStore.open(log, later)
    # the second's segment is past the retention; the third's may hold more but holds nothing the store keeps
    assert len(again) == 1 and len(segments(tmp_path)) == 1 and log.counts["deleted"] == 2


def test_the_files_hold_at_most_their_cap(tmp_path: Path) -> None:
    one = len(frame(encode_entry(served(tmp_path / "probe", 1)[0].entries()[0])))
    log = ServedLog(tmp_path, segment_ms=1000)
    store, _ = served(tmp_path, 10, every_ms=60_000, log=log, max_disk_bytes=3 * one + 10)  # a segment each
    assert len(store) == 3 and store.dropped["full"] == 7 and store.disk_bytes <= 3 * one + 10
    total = sum(p.stat().st_size for p in segments(tmp_path))  # pruned every minute: what no entry is left in
    assert total <= 4 * one and log.counts["deleted"] >= 6
    assert [k.chunks[0][0] for k in ServedStore.open(ServedLog(tmp_path), NOW_MS + 10 * 60_000).entries()][-3:] \
        == ["answer 7", "answer 8", "answer 9"]


def test_only_an_index_stays_in_memory_and_the_entry_is_read_back(tmp_path: Path) -> None:
    store, me = served(tmp_path, 5)
    assert store.bytes == 5 * _SLOT_BYTES and store.disk_bytes == sum(p.stat().st_size for p in segments(tmp_path))
    req = request("the framer's target")
    digest = signing.request_digest(req, me.node_id)
    assert serve(store, req, me, ["a good answer"], NOW_MS + 10_000) is not None
    secret = wire.escrowed_secret(digest)
    value = wire.commitment(escrow.nonce_of(secret), me.node_id, digest)
    found = store.find(secret, value)
    assert found is not None and found.chunks == (("a good answer", (0, 1)),) and found.kept_ms == NOW_MS + 10_000
    for seg in segments(tmp_path):  # the disk lost since: nothing to read back, and it says so
        seg.unlink()
    assert store.find(secret, value) is None and store.dropped["unreadable"] == 1


def test_a_flood_of_long_prompts_fills_the_disk_not_the_memory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Decision 0038: the framer's target, then a flood of requests with long prompts before its
    release. In memory (decision 0037 as built) a flood of the memory cap's bytes pushed the target
    out; on disk the memory holds only the index, so the same flood leaves it, and only a flood of
    the disk cap's bytes pushes it out, which the node logs."""
    memory = 1 << 20
    req = request("the framer's target")
    rng = random.Random(3)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ."
    # 1.6 MB of prompts (about 1.2 MB compressed on disk): over the memory cap and the small disk's
    flood = [request("".join(rng.choices(letters, k=8000))) for _ in range(200)]
    for where, disk_cap, kept in (("memory", None, False), ("disk", 1 << 30, True), ("small disk", 1 << 20, False)):
        log = None if disk_cap is None else ServedLog(tmp_path / where.replace(" ", "-"))
        store = ServedStore(max_bytes=memory, max_disk_bytes=disk_cap or 1 << 30, log=log)
        me = Identity.generate()
        assert serve(store, req, me, ["a good answer"]) is not None
        for i, r in enumerate(flood):
            serve(store, r, me, ["."], NOW_MS + 1 + i)
        digest = signing.request_digest(req, me.node_id)
        secret = wire.escrowed_secret(digest)
        found = store.find(secret, wire.commitment(escrow.nonce_of(secret), me.node_id, digest))
        assert (found is not None) == kept, where
        assert (store.dropped["full"] > 0) == (not kept), where
    assert "served store: full" in caplog.text and "--served-store-gib" in caplog.text


def test_an_entry_on_disk_costs_at_most_its_slot_in_memory() -> None:
    """What _SLOT_BYTES counts for each entry on disk is what its index takes (tracemalloc)."""
    import tracemalloc

    from model_node.served import _Slot

    rng, node = random.Random(5), Identity.generate().node_id
    store = ServedStore(max_bytes=1 << 40, max_disk_bytes=1 << 40)
    seg, n = Path("served-0000000000000001.log"), 20_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            store._take(_Slot(node, rng.randbytes(32), NOW_MS + i, None, (seg, i * 17_000, 17_000)), NOW_MS + i)
        per_entry = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert 100 < per_entry <= _SLOT_BYTES, per_entry


def test_a_directory_it_cannot_write_keeps_the_replies_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "served"
    blocker.write_bytes(b"not a directory")
    log = ServedLog(blocker)
    store = ServedStore(log=log)
    me = Identity.generate()
    assert serve(store, request("q"), me, ["a"]) is not None
    assert len(store) == 1 and log.counts["write errors"] == 1


def test_a_node_whose_store_directory_cannot_be_made_says_what_to_do(tmp_path: Path) -> None:
    from gentorrent.cli import CliError, build_parser
    from model_node.run import withheld
    from overlay.directory.lists import ValidatorKey
    from overlay.directory.membership import CommitteeSettings
    from overlay.wire import crypto

    (tmp_path / "served").write_bytes(b"not a directory")
    committee = CommitteeSettings(("v0:26657",), "chain", (ValidatorKey(crypto.SigningKey.generate().public_bytes, 10),))
    with pytest.raises(CliError, match="--no-reveal-withheld"):
        withheld(committee, Identity.generate(), build_parser().parse_args(["model-node"]), tmp_path)


def test_a_reply_too_long_ever_to_be_handed_in_is_not_kept_and_spoils_nothing(tmp_path: Path) -> None:
    """A body over MAX_REVEAL_BYTES could never reach a verifier (a node reveal that large goes to
    none). It used to be written all the same; at the next start its frame, over the entry limit,
    read as torn, and the segment was cut there, losing every later entry. Now it is not kept."""
    rng = random.Random(11)
    store, me = served(tmp_path, 0)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    long_reply = ["".join(rng.choices(letters, k=16_000)) for _ in range(12)]  # 192 KB of reply
    assert serve(store, request("before"), me, ["a"], NOW_MS) is not None
    assert serve(store, request("x" * 100_000), me, long_reply, NOW_MS + 1) is not None  # served, all the same
    assert serve(store, request("after"), me, ["c"], NOW_MS + 2) is not None
    assert len(store) == 2 and store.dropped == {"too large": 1}
    again = ServedStore.open(ServedLog(tmp_path), NOW_MS + 10)
    assert [k.chunks[0][0] for k in again.entries()] == ["a", "c"] and again.log is not None
    assert again.log.counts["torn"] == 0
