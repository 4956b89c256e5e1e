"""The served store on disk (model_node/served_log.py, decision 0037 step 5): a model node that
restarts still holds, and hands in, the replies it served before; a torn or damaged file loses
what follows the damage and nothing else; segments go once past the retention or the byte cap."""

from __future__ import annotations

import random
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_node.served import RETENTION_MS, ServedStore
from model_node.served_log import SEGMENT_MS, LogError, ServedLog, decode_entry, encode_entry, frame
from overlay.anon import signing
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.wire.identity import Identity
from tests.unit.test_served_store import NOW_MS, request, serve


def served(tmp: Path, n: int, *, every_ms: int = 1000, log: ServedLog | None = None) -> tuple[ServedStore, Identity]:
    """A store on ``tmp`` that served ``n`` requests ``every_ms`` apart from NOW_MS."""
    store, me = ServedStore.open(log or ServedLog(tmp), NOW_MS), Identity.generate()
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
    secret = escrow.new_secret()
    nonce = escrow.nonce_of(secret)
    value = wire.commitment(nonce, me.node_id, signing.request_digest(req, me.node_id))
    again = ServedStore.open(ServedLog(tmp_path), NOW_MS + 20 * 60 * 1000)  # the restart, before the release
    found = again.find(nonce, value)
    assert found is not None and found == store.entries()[0]
    body = found.revealed(secret)
    assert body.chunks == (("a good ", (0, 1)), ("answer", (1, 2))) and body.secret == escrow.scalar_bytes(secret)
    # and without the disk, the control: nothing
    assert ServedStore().find(nonce, value) is None


def test_the_files_are_private_to_the_node(tmp_path: Path) -> None:
    served(tmp_path / "served", 1)
    (seg,) = segments(tmp_path / "served")
    assert stat.S_IMODE(seg.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "served").stat().st_mode) == 0o700


def test_a_write_cut_short_loses_that_entry_only(tmp_path: Path) -> None:
    store, _ = served(tmp_path, 3)
    (seg,) = segments(tmp_path)
    size = seg.stat().st_size
    with seg.open("r+b") as f:
        f.truncate(size - 5)  # the process died writing the third
    log = ServedLog(tmp_path)
    again = ServedStore.open(log, NOW_MS + 10_000)
    assert [k.request_id for k in again.entries()] == [k.request_id for k in store.entries()[:2]]
    assert log.counts["torn"] == 1
    third = len(frame(encode_entry(store.entries()[2])))
    assert seg.stat().st_size == size - third  # truncated at the bad frame: the next append follows good ones
    assert serve(again, request("after"), Identity.generate(), ["x"], NOW_MS + 11_000) is not None
    assert len(ServedStore.open(ServedLog(tmp_path), NOW_MS + 12_000)) == 3


@pytest.mark.parametrize("damage", ["checksum", "length", "garbage"])
def test_a_damaged_frame_drops_the_rest_of_its_segment_and_nothing_else(tmp_path: Path, damage: str) -> None:
    store, _ = served(tmp_path, 3, every_ms=SEGMENT_MS)  # three segments, one entry each
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
    assert [k.request_id for k in again.entries()] == [store.entries()[0].request_id, store.entries()[2].request_id]
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
    for i, bad in ((0, 2), (0, True), (1, -1), (2, 0), (3, b"\x00" * 31), (4, b"\x90")):
        w = list(v)
        w[i] = bad
        with pytest.raises(LogError):
            decode_entry(msgpack.packb(w, use_bin_type=True))


def test_segments_go_once_past_the_retention(tmp_path: Path) -> None:
    served(tmp_path, 4, every_ms=SEGMENT_MS)  # segments at 0, 15, 30, 45 minutes
    assert len(segments(tmp_path)) == 4
    log = ServedLog(tmp_path)
    later = NOW_MS + 3 * SEGMENT_MS + RETENTION_MS - 1  # the last entry still within the retention
    again = ServedStore.open(log, later)
    assert len(again) == 1 and len(segments(tmp_path)) == 2  # the third's entry expired, its segment may hold more
    assert log.counts["deleted"] == 2


def test_the_files_hold_at_most_their_cap(tmp_path: Path) -> None:
    one = len(frame(encode_entry(served(tmp_path / "probe", 1)[0].entries()[0])))
    log = ServedLog(tmp_path, segment_ms=1000, max_bytes=3 * one + 10)
    served(tmp_path, 10, every_ms=60_000, log=log)  # a segment each, pruned every minute
    total = sum(p.stat().st_size for p in segments(tmp_path))
    assert total <= 3 * one + 10 + one and log.counts["deleted"] >= 6


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
