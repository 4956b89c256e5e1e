"""A verifier operator's private challenge prompts (``gentorrent verifier --audit
--challenge-prompts FILE``).

A challenge must read like a user's request: a node that can tell one from users' traffic
answers challenges honestly and cheats users. Users' donated prompts (:mod:`verifier.audit.pool`)
are the best source, but a verifier may hold none for a node; the built-in generator
(:mod:`verifier.audit.challenges`) is a template in this public repository, so a node that has
read it recognises every challenge it makes. This module is the source between the two: prompts
the verifier's operator writes or collects and keeps secret, drawn after the donated ones and
before the generator (:meth:`verifier.audit.auditor.Auditor._opening`).

What keeps them useful: the file stays secret (a node holding it recognises every challenge from
it), and its prompts look like what users send the audited model (several user turns where users
write several). Each conversation is used **once**, for any node and model, ever: the node it
was sent to has read it, and the audit report reveals it on the chain. The used prompts' keys
(:meth:`~verifier.audit.tx.Opening.prompt_keys`, every user turn's) are kept in
``DATA_DIR/audit-corpus-used.msgpack`` (:func:`save_used`, mode 0600), written before a challenge
using them can go out (:meth:`verifier.audit.loop.AuditDriver.persist`). A conversation that
shares any user turn with a used prompt (this file's, a donated one or a generated one) is used
too: the chain voids a challenge carrying a revealed prompt, and refuses a report carrying one
prompt twice.

File format: JSON Lines in UTF-8, one conversation per line::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}, {"role": "user", "content": "..."}]}

(one line each). No other keys; at most one system message, and only first; at least one user
turn; blank lines are skipped. Assistant messages are dropped (when the script is replayed turn
by turn, the challenged node's own replies take their places, decision 0025) and the latest
:data:`~verifier.audit.tx.MAX_TURNS` user turns kept, as a donation is
(:func:`overlay.directory.donation.donated_messages`); what is left must pass a challenge's
limits (:meth:`~verifier.audit.tx.Opening.check_script`). Sampling parameters are drawn per
challenge as users' clients send them (:func:`verifier.audit.challenges.draw_params`).
:func:`read_corpus` refuses the whole file on any line it cannot take, with a
:class:`CorpusError` ``"FILE:LINE: reason"``; a conversation whose first user turn repeats an
earlier one's (the same :meth:`~verifier.audit.tx.Opening.prompt_key`) is dropped and counted.

:class:`ChallengeCorpus` is I/O-free; :func:`read_corpus`, :func:`load_corpus` and
:func:`save_used` do the reading and writing.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgpack

from overlay.directory.donation import donated_messages
from overlay.directory.registration import TxError, pack
from overlay.wire.identity import write_private
from overlay.wire.messages import ChatMessage
from verifier.audit.challenges import CHAT_DEFAULTS, draw_params
from verifier.audit.tx import PROMPT_KEY_LEN, SALT_LEN, Opening

log = logging.getLogger("gentorrent.audit")

MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_LINE_BYTES = 256 * 1024  # 16 messages of 8 KiB (a challenge's most) with room for JSON escapes and replies
USED_FILE = "audit-corpus-used.msgpack"
_USED_VERSION = 1
_CHECK_MODEL = "model"  # an opening needs a model id to be checked; the corpus serves every model
ROLES = ("system", "user", "assistant")

Script = tuple[ChatMessage, ...]


class CorpusError(ValueError):
    """A file of challenge prompts that cannot be taken: ``"FILE:LINE: reason"`` (what to fix)."""


# --------------------------------------------------------------------------- parsing (I/O-free)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) < len(keys):
        raise ValueError(f"an object repeats a key ({', '.join(sorted({k for k in keys if keys.count(k) > 1}))})")
    return dict(pairs)


def _message(i: int, m: Any) -> ChatMessage:
    """Message ``i`` (0-based) of a line as a :class:`ChatMessage`; ValueError with the reason."""
    where = f"message {i + 1}"
    if type(m) is not dict or set(m) != {"role", "content"}:
        raise ValueError(f'{where} is not an object of exactly "role" and "content"')
    role, content = m["role"], m["content"]
    if type(role) is not str or role not in ROLES:
        raise ValueError(f'{where}: role must be "system", "user" or "assistant", not {role!r:.40}')
    if type(content) is not str:
        raise ValueError(f"{where}: content must be a string, not {type(content).__name__}")
    try:
        content.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: content holds a lone surrogate (a \\ud800-\\udfff escape)") from None
    if role == "system" and i:
        raise ValueError(f"{where}: a system message may only be the first")
    if role == "user" and not content.strip():
        raise ValueError(f"{where}: a user turn is empty")
    return ChatMessage(role, content)


def parse_line(text: str) -> Script:
    """One line's conversation as a challenge's script (module docstring); ValueError with the
    reason (without the file and line) otherwise."""
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if type(doc) is not dict or set(doc) != {"messages"}:
        raise ValueError('a line is one JSON object with one key, "messages"')
    messages = doc["messages"]
    if type(messages) is not list or not messages:
        raise ValueError('"messages" must be a non-empty list')
    kept = [m for m in (_message(i, m) for i, m in enumerate(messages)) if m.role != "assistant"]
    script = donated_messages(kept)
    if script is None:
        raise ValueError("a conversation needs at least one user turn")
    try:
        Opening(bytes(SALT_LEN), _CHECK_MODEL, tuple(script), CHAT_DEFAULTS).check_script()
    except TxError as exc:
        raise ValueError(f"not a prompt a challenge may carry: {exc.reason}") from None
    return tuple(script)


def parse_lines(lines: Iterable[bytes], name: str) -> list[Script]:
    """The conversations of ``lines`` (a file's lines as bytes, ``name`` the file's for errors),
    blank lines skipped; :class:`CorpusError` ``"name:LINE: reason"`` at the first bad line."""
    out: list[Script] = []
    for n, raw in enumerate(lines, 1):
        if len(raw.removesuffix(b"\n")) > MAX_LINE_BYTES:
            raise CorpusError(f"{name}:{n}: a line longer than {MAX_LINE_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{name}:{n}: not UTF-8 (byte {exc.start + 1} of the line)") from None
        if not text.strip():
            continue
        try:
            out.append(parse_line(text))
        except ValueError as exc:
            raise CorpusError(f"{name}:{n}: {exc}") from None
    if not out:
        raise CorpusError(f"{name}: no conversation in the file (one JSON object a line: "
                          '{"messages": [{"role": "user", "content": "..."}]})')
    return out


# --------------------------------------------------------------------------- the corpus


def _keys(script: Script) -> tuple[bytes, ...]:
    return Opening(bytes(SALT_LEN), _CHECK_MODEL, script, CHAT_DEFAULTS).prompt_keys()


class ChallengeCorpus:
    """An operator's private prompts and which of them are used (module docstring). ``source``
    names the file in logs; ``duplicates`` counts the conversations dropped as repeats of an
    earlier one's first user turn; ``dirty`` says the used set changed since :func:`save_used`
    last wrote it."""

    def __init__(self, scripts: Iterable[Script], source: str = "") -> None:
        self.source = source
        self.dirty = False
        self.duplicates = 0
        self._scripts: list[Script] = []
        self._keys: list[tuple[bytes, ...]] = []  # every user turn's prompt key, per script
        firsts: set[bytes] = set()
        for script in scripts:
            keys = _keys(script)
            if keys[0] in firsts:
                self.duplicates += 1
                continue
            firsts.add(keys[0])
            self._scripts.append(script)
            self._keys.append(keys)
        self._all = {k for keys in self._keys for k in keys}
        self._used: set[bytes] = set()  # of self._all
        self._unused = list(range(len(self._scripts)))  # may hold scripts used since (dropped when met)

    def __len__(self) -> int:
        return len(self._scripts)

    def _fresh(self, i: int) -> bool:
        return self._used.isdisjoint(self._keys[i])

    def _take(self, j: int) -> None:
        self._unused[j] = self._unused[-1]
        self._unused.pop()

    def one_turn(self) -> int:
        """How many conversations are a single user turn (recognisable by their shape: decision 0030)."""
        return sum(len(keys) == 1 for keys in self._keys)

    def left(self) -> int:
        """How many conversations are still unused."""
        self._unused = [i for i in self._unused if self._fresh(i)]
        return len(self._unused)

    def used_keys(self) -> frozenset[bytes]:
        return frozenset(self._used)

    def mark_used(self, keys: Iterable[bytes]) -> None:
        """These prompt keys were used (drawn here, or a donated or generated challenge's): a
        conversation holding any of them is never drawn. Keys of no conversation here are not kept."""
        new = (set(keys) & self._all) - self._used
        if new:
            self._used |= new
            self.dirty = True

    def draw(self, model: str, rng: random.Random, urandom: Callable[[int], bytes] = os.urandom,
             most: int | None = None, avoid: Callable[[bytes], bool] | None = None) -> Opening | None:
        """A challenge for ``model`` from a conversation chosen uniformly among the unused ones
        none of whose user turns' keys ``avoid`` names (turns another verifier's report revealed:
        the chain voids them for a while, so such a conversation stays unused for a later plan),
        with parameters drawn like users' clients' (:func:`~verifier.audit.challenges.draw_params`)
        and a fresh salt, marked used. None when no conversation is left so, or when the one
        chosen is over ``most`` bytes encoded (it stays unused for a later plan)."""
        j = self._pick(rng, avoid)
        if j is None:
            return None
        i = self._unused[j]
        o = Opening(urandom(SALT_LEN), model, self._scripts[i], draw_params(rng))
        if most is not None and (size := len(o.encode())) > most:
            log.info("audit: a private prompt of %d bytes would take this plan's openings past their room (%d "
                     "bytes left); kept for a later plan", size, most)
            return None
        self._take(j)
        self.mark_used(self._keys[i])
        return o

    def _pick(self, rng: random.Random, avoid: Callable[[bytes], bool] | None) -> int | None:
        """The index in the unused list of a conversation chosen uniformly among those fresh and
        not avoided (conversations found used since are dropped from the list on the way)."""
        while self._unused:
            j = rng.randrange(len(self._unused))
            i = self._unused[j]
            if not self._fresh(i):  # a turn of it was used since
                self._take(j)
                continue
            if avoid is None or not any(avoid(k) for k in self._keys[i]):
                return j
            # uniform among the rest: the first try was uniform, so this keeps every one's chance equal
            left = [x for x, m in enumerate(self._unused) if self._fresh(m) and not any(avoid(k) for k in self._keys[m])]
            return rng.choice(left) if left else None
        return None

    # ------------------------------------------------------------------ the used set

    def used_bytes(self) -> bytes:
        """The used keys as :data:`USED_FILE` holds them: msgpack ``[1, [key, ...]]``, keys sorted."""
        return pack([_USED_VERSION, sorted(self._used)])

    def take_used(self, raw: bytes) -> None:
        """Mark used the keys of :meth:`used_bytes`'s ``raw`` (those of conversations here); ValueError
        (nothing changes) if ``raw`` is not such a file. Leaves :attr:`dirty` as it was."""
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True, max_str_len=0,
                                  max_map_len=0, max_ext_len=0, max_bin_len=PROMPT_KEY_LEN)
        except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as exc:
            raise ValueError(f"not msgpack ({type(exc).__name__})") from None
        if type(doc) is not list or len(doc) != 2 or type(doc[0]) is not int:
            raise ValueError("not [version, [key, ...]]")
        if doc[0] != _USED_VERSION:
            raise ValueError(f"version {doc[0]} is not {_USED_VERSION}")
        keys = doc[1]
        if type(keys) is not list or not all(type(k) is bytes and len(k) == PROMPT_KEY_LEN for k in keys):
            raise ValueError(f"the keys are not a list of {PROMPT_KEY_LEN}-byte strings")
        dirty = self.dirty
        self.mark_used(keys)
        self.dirty = dirty


# --------------------------------------------------------------------------- files


def read_corpus(path: str | os.PathLike[str]) -> ChallengeCorpus:
    """The conversations of the file at ``path`` (module docstring), none used;
    :class:`CorpusError` for a file that cannot be read or holds a line that cannot be taken."""
    name = str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise CorpusError(f"{name}: {size} bytes, more than {MAX_FILE_BYTES}")
            scripts = parse_lines(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), name)
    except OSError as exc:
        raise CorpusError(f"{name}: cannot read it: {exc.strerror or exc}") from None
    corpus = ChallengeCorpus(scripts, name)
    if corpus.duplicates:
        log.warning("audit: %s: %d conversations repeat an earlier one's first user turn; dropped",
                    name, corpus.duplicates)
    if (one := corpus.one_turn()) * 2 > len(corpus):
        log.warning("audit: %s: %d of %d conversations are a single user turn; a node tells such challenges from "
                    "users' conversations by their shape (docs/benchmarks.md \"audit-evasion\", part H): write "
                    "conversations of several user turns, as users do", name, one, len(corpus))
    return corpus


def load_used(corpus: ChallengeCorpus, data_dir: str | os.PathLike[str]) -> None:
    """Mark used what ``data_dir`` (:data:`USED_FILE`) says was used, and log how many are left. A
    file that does not decode is logged as an error and renamed ``.corrupt`` (its prompts may then
    be used again); one that cannot be read raises OSError (the verifier must not reuse prompts
    because of it)."""
    path = Path(data_dir) / USED_FILE
    try:
        raw: bytes | None = path.read_bytes()
    except FileNotFoundError:
        raw = None
    if raw is not None:
        try:
            corpus.take_used(raw)
        except ValueError as exc:
            log.error("audit: the used private prompts file %s is corrupt (%s); set aside as %s.corrupt: the "
                      "prompts it named may be sent again", path, exc, path.name)
            try:
                os.replace(path, path.with_name(path.name + ".corrupt"))
            except OSError:
                pass
    log.info("audit: %d private challenge prompts from %s, %d unused", len(corpus), corpus.source, corpus.left())


def load_corpus(path: str | os.PathLike[str], data_dir: str | os.PathLike[str]) -> ChallengeCorpus:
    """:func:`read_corpus` of ``path`` with the used set kept in ``data_dir`` (:func:`load_used`)."""
    corpus = read_corpus(path)
    load_used(corpus, data_dir)
    return corpus


def save_used(corpus: ChallengeCorpus, data_dir: str | os.PathLike[str]) -> None:
    """Write the used set to ``data_dir`` (:data:`USED_FILE`, mode 0600) if it changed. OSError passes."""
    if not corpus.dirty:
        return
    write_private(Path(data_dir) / USED_FILE, corpus.used_bytes())
    corpus.dirty = False
