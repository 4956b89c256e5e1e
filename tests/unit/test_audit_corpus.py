"""An operator's private challenge prompts (verifier/audit/corpus.py, ``gentorrent verifier
--challenge-prompts FILE``): a strict JSON Lines file, each conversation used once, ever, the used
ones kept in the data dir."""

from __future__ import annotations

import json
import logging
import random
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from overlay.wire.messages import ChatMessage
from verifier.audit import corpus as cp
from verifier.audit import tx as at
from verifier.audit.challenges import draw_params

MODEL = "smollm2-135m-instruct"


def line(*messages: tuple[str, str], **extra: Any) -> str:
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in messages], **extra})


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    return path


def questions(n: int, start: int = 0) -> list[str]:
    return [line(("user", f"question {i}?")) for i in range(start, start + n)]


def counter(start: int = 0) -> Iterator[bytes]:
    i = start
    while True:
        yield i.to_bytes(16, "big")
        i += 1


def urandom_from(it: Iterator[bytes]) -> Any:
    return lambda n: next(it)[:n]


def drain(c: cp.ChallengeCorpus, rng: random.Random) -> list[at.Opening]:
    out = []
    while (o := c.draw(MODEL, rng)) is not None:
        out.append(o)
    return out


# --------------------------------------------------------------------------- the file


def test_a_conversation_becomes_a_script_of_its_user_turns(tmp_path: Path) -> None:
    """Replies are dropped (the node's own take their places), the system prompt kept first, blank
    lines skipped, a conversation past 8 user turns keeps its latest 8, as a donation does."""
    long = [m for i in range(10) for m in (("user", f"turn {i}"), ("assistant", f"reply {i}"))]
    path = write(tmp_path / "p.jsonl",
                 line(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "A joke?")),
                 "", "   ",
                 line(*long),
                 line(("user", "Ends with a reply"), ("assistant", "ignored")))
    c = cp.read_corpus(path)
    assert len(c) == 3 and c.left() == 3 and c.duplicates == 0
    scripts = {o.messages for o in drain(c, random.Random(1))}
    assert scripts == {
        (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"), ChatMessage("user", "A joke?")),
        tuple(ChatMessage("user", f"turn {i}") for i in range(2, 10)),
        (ChatMessage("user", "Ends with a reply"),),
    }


BAD_LINES = [
    ("not json", b"{not json}", "not JSON"),
    ("a list", b"[1, 2]", 'one key, "messages"'),
    ("another key", line(("user", "hi"), model="x").encode(), 'one key, "messages"'),
    ("a repeated key", b'{"messages": [], "messages": [{"role": "user", "content": "hi"}]}', "repeats a key"),
    ("no messages", b'{"messages": []}', "non-empty list"),
    ("messages not a list", b'{"messages": "hi"}', "non-empty list"),
    ("a message with another key", b'{"messages": [{"role": "user", "content": "hi", "name": "x"}]}',
     'message 1 is not an object of exactly "role" and "content"'),
    ("a message not an object", b'{"messages": ["hi"]}', "message 1 is not an object"),
    ("a tool role", line(("user", "hi"), ("tool", "x")).encode(), "message 2: role must be"),
    ("content not a string", b'{"messages": [{"role": "user", "content": 3}]}', "content must be a string"),
    ("a lone surrogate", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "lone surrogate"),
    ("a late system message", line(("user", "hi"), ("system", "x")).encode(), "message 2: a system message"),
    ("two system messages", line(("system", "a"), ("system", "b"), ("user", "hi")).encode(),
     "message 2: a system message"),
    ("an empty user turn", line(("user", "hi"), ("user", "  ")).encode(), "message 2: a user turn is empty"),
    ("no user turn", line(("system", "a"), ("assistant", "b")).encode(), "at least one user turn"),
    ("a repeated turn", line(("user", "Hi"), ("user", " hi ")).encode(), "repeats a user turn"),
    ("a turn over a challenge's limit", line(("user", "x" * (at.MAX_CONTENT_BYTES + 1))).encode(),
     "not a prompt a challenge may carry"),
    ("not UTF-8", b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', "not UTF-8"),
]


@pytest.mark.parametrize(("what", "bad", "reason"), BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_a_bad_line_refuses_the_whole_file_naming_it(tmp_path: Path, what: str, bad: bytes, reason: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join([questions(1)[0].encode(), b"", bad, questions(1, 1)[0].encode()]) + b"\n")
    with pytest.raises(cp.CorpusError) as err:
        cp.read_corpus(path)
    assert str(err.value).startswith(f"{path}:3: ") and reason in str(err.value)


def test_file_limits_and_an_empty_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    long = line(("user", "x" * cp.MAX_LINE_BYTES))
    write(path, questions(1)[0], long)
    with pytest.raises(cp.CorpusError, match=rf"^{path}:2: a line longer than {cp.MAX_LINE_BYTES} bytes"):
        cp.read_corpus(path)
    short = line(("user", "y" * 10), ("assistant", ""))
    fits = line(("user", "y" * 10), ("assistant", "z" * (cp.MAX_LINE_BYTES - len(short))))
    assert len(fits.encode()) == cp.MAX_LINE_BYTES  # a line of the most bytes, its newline not counted
    assert len(cp.read_corpus(write(path, fits))) == 1
    write(path, "", " ")
    with pytest.raises(cp.CorpusError, match="no conversation"):
        cp.read_corpus(path)
    with pytest.raises(cp.CorpusError, match="cannot read it"):
        cp.read_corpus(tmp_path / "missing.jsonl")
    with pytest.raises(cp.CorpusError, match="cannot read it"):
        cp.read_corpus(tmp_path)  # a directory


def test_a_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    with path.open("wb") as f:  # sparse: no bytes written
        f.truncate(cp.MAX_FILE_BYTES + 1)
    with pytest.raises(cp.CorpusError, match=f"more than {cp.MAX_FILE_BYTES}"):
        cp.read_corpus(path)


def test_duplicates_are_dropped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path / "p.jsonl", line(("user", "Same start")), line(("user", "same  START "), ("user", "more")),
                 line(("user", "other")))
    with caplog.at_level(logging.WARNING, "gentorrent.audit"):
        c = cp.read_corpus(path)
    assert len(c) == 2 and c.duplicates == 1
    assert caplog.text.count("repeat an earlier one's first user turn") == 1


def test_a_file_of_mostly_single_turns_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # a node tells one-turn challenges from users' conversations by their shape (bench part H)
    two = [line(("user", f"first {i}"), ("assistant", "ok"), ("user", f"then {i}")) for i in range(2)]
    for ones, warned in ((2, False), (3, True)):
        caplog.clear()
        path = write(tmp_path / f"p{ones}.jsonl", *two, *questions(ones))
        with caplog.at_level(logging.WARNING, "gentorrent.audit"):
            c = cp.read_corpus(path)
        assert c.one_turn() == ones
        assert ("a single user turn" in caplog.text) is warned, caplog.text


# --------------------------------------------------------------------------- drawing


def test_each_prompt_is_drawn_once_then_none() -> None:
    c = cp.ChallengeCorpus([(ChatMessage("user", f"q{i}"),) for i in range(20)])
    salts = counter()
    got = []
    rng = random.Random(3)
    while (o := c.draw(MODEL, rng, urandom_from(salts))) is not None:
        o.check_script()
        assert o.model == MODEL and len(o.salt) == at.SALT_LEN
        got.append(o.messages)
        assert c.left() == 20 - len(got)
    assert sorted(m[0].content for m in got) == sorted(f"q{i}" for i in range(20))
    assert c.draw(MODEL, rng) is None and c.left() == 0 and c.dirty


def test_a_draw_is_uniform_and_its_params_and_salt_are_fresh() -> None:
    """The first draw from 4 prompts lands on each about as often; params are draw_params' from the
    same rng (a seeded rng gives the same draws) and every salt is the urandom's."""
    scripts = [(ChatMessage("user", f"q{i}"),) for i in range(4)]
    counts = dict.fromkeys(range(4), 0)
    for seed in range(800):
        o = cp.ChallengeCorpus(scripts).draw(MODEL, random.Random(seed))
        assert o is not None
        counts[int(o.messages[0].content[1])] += 1
    assert all(150 < n < 250 for n in counts.values()), counts

    def draws(seed: int) -> list[tuple[Any, ...]]:
        return [(o.messages, o.params) for o in drain(cp.ChallengeCorpus(scripts), random.Random(seed))]

    assert draws(7) == draws(7) and draws(7) != draws(8)
    rng, mirror = random.Random(11), random.Random(11)
    c = cp.ChallengeCorpus(scripts)
    for n in (4, 3, 2, 1):
        o = c.draw(MODEL, rng, urandom_from(counter(9)))
        assert o is not None and o.salt == (9).to_bytes(16, "big")
        mirror.randrange(n)  # the draw's own pick among the n unused
        assert o.params == draw_params(mirror)


def test_a_prompt_sharing_any_turn_with_a_used_one_is_used() -> None:
    """The chain voids a challenge carrying a revealed prompt and refuses a report with one prompt
    twice: a conversation sharing a user turn with a drawn one, or with a donated or generated
    challenge's (mark_used), is never drawn."""
    a = (ChatMessage("user", "Explain tides."), ChatMessage("user", "Shorter please."))
    b = (ChatMessage("user", "Explain volcanoes."), ChatMessage("user", "shorter  please."))
    c = (ChatMessage("user", "Explain wind."),)
    corpus = cp.ChallengeCorpus([a, b, c])
    first = corpus.draw(MODEL, random.Random(0))
    assert first is not None and first.messages in (a, b, c)
    rest = drain(corpus, random.Random(1))
    drawn = [first.messages, *(o.messages for o in rest)]
    assert len(drawn) == 2 and c in drawn and (a in drawn) != (b in drawn)
    other = cp.ChallengeCorpus([a, c])
    other.mark_used([at.Opening(bytes(16), MODEL, (ChatMessage("user", "EXPLAIN wind."),),
                                draw_params(random.Random(0))).prompt_key(), b"\x00" * 16])
    assert other.left() == 1 and len(other.used_keys()) == 1  # a key of no conversation here is not kept
    assert [o.messages for o in drain(other, random.Random(2))] == [a]


def test_a_conversation_with_a_turn_to_avoid_stays_unused_and_the_rest_are_drawn_uniformly() -> None:
    """``avoid`` names turns another verifier's report revealed (void on the chain for a while): a
    conversation holding one is not drawn but stays unused; the others are drawn as often each;
    with every one avoided there is no draw, and nothing is used."""
    thanks = at.Opening(bytes(16), MODEL, (ChatMessage("user", "Thanks!"),), draw_params(random.Random(0))).prompt_key()
    scripts = [(ChatMessage("user", f"q{i}"),) for i in range(3)] + [(ChatMessage("user", "q3"),
                                                                      ChatMessage("user", "thanks!"))]
    counts = dict.fromkeys(range(4), 0)
    for seed in range(600):
        c = cp.ChallengeCorpus(scripts)
        o = c.draw(MODEL, random.Random(seed), avoid=lambda k: k == thanks)
        assert o is not None and c.left() == 3
        counts[int(o.messages[0].content[1])] += 1
    assert counts[3] == 0 and all(150 < counts[i] < 250 for i in range(3)), counts
    c = cp.ChallengeCorpus(scripts[3:])
    assert c.draw(MODEL, random.Random(0), avoid=lambda k: k == thanks) is None and c.left() == 1 and not c.dirty
    assert c.draw(MODEL, random.Random(0)) is not None  # once the chain has forgotten it


def test_a_prompt_over_the_room_left_stays_unused() -> None:
    c = cp.ChallengeCorpus([(ChatMessage("user", "x" * 4000),)])
    assert c.draw(MODEL, random.Random(0), most=1000) is None and c.left() == 1 and not c.dirty
    o = c.draw(MODEL, random.Random(0), most=10_000)
    assert o is not None and len(o.encode()) <= 10_000 and c.left() == 0


# --------------------------------------------------------------------------- the used set on disk


def test_the_used_set_survives_a_restart_in_a_private_file(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", *questions(10))
    data = tmp_path / "data"
    c = cp.load_corpus(path, data)
    sent = {o.messages for o in (c.draw(MODEL, random.Random(5)) for _ in range(4)) if o is not None}
    assert len(sent) == 4
    cp.save_used(c, data)
    used = data / cp.USED_FILE
    assert stat.S_IMODE(used.stat().st_mode) == 0o600 and not c.dirty
    mtime = used.stat().st_mtime_ns
    cp.save_used(c, data)  # unchanged: not written
    assert used.stat().st_mtime_ns == mtime
    back = cp.load_corpus(path, data)
    assert back.left() == 6 and not back.dirty
    again = drain(back, random.Random(5))
    assert len(again) == 6 and not sent & {o.messages for o in again}
    # a file with keys of another corpus: only this one's are kept (and written back)
    other = cp.ChallengeCorpus([(ChatMessage("user", "elsewhere"),)])
    assert other.draw(MODEL, random.Random(0)) is not None
    (data / cp.USED_FILE).write_bytes(other.used_bytes())
    fresh = cp.load_corpus(path, data)
    assert fresh.left() == 10 and fresh.used_keys() == frozenset()


@pytest.mark.parametrize("raw", [
    b"\xc1 not msgpack",
    msgpack.packb([2, []], use_bin_type=True),  # another version
    msgpack.packb([1, [b"short"]], use_bin_type=True),
    msgpack.packb([1, ["a" * 16]], use_bin_type=True),  # a str, not bytes
    msgpack.packb({"v": 1}, use_bin_type=True),
    msgpack.packb([1, []], use_bin_type=True) + b"\x00",  # trailing bytes
], ids=["garbage", "version", "short key", "str key", "map", "trailing"])
def test_a_corrupt_used_file_is_logged_as_an_error_and_set_aside(tmp_path: Path, raw: bytes,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path / "p.jsonl", *questions(3))
    (tmp_path / cp.USED_FILE).write_bytes(raw)
    with caplog.at_level(logging.ERROR, "gentorrent.audit"):
        c = cp.load_corpus(path, tmp_path)
    assert c.left() == 3 and "corrupt" in caplog.text and "may be sent again" in caplog.text
    assert not (tmp_path / cp.USED_FILE).exists() and (tmp_path / (cp.USED_FILE + ".corrupt")).read_bytes() == raw


def test_an_unreadable_used_file_stops_the_load(tmp_path: Path) -> None:
    """Starting with nothing used would send used prompts again: a used file that cannot be read
    (here: a directory) is not passed over."""
    path = write(tmp_path / "p.jsonl", *questions(3))
    (tmp_path / cp.USED_FILE).mkdir()
    with pytest.raises(OSError):
        cp.load_corpus(path, tmp_path)
