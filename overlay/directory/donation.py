"""The donation format: a prompt a user donates to one verifier for audit challenges (decision
0013 §4), the one codec both sides use: the user's client makes donations
(``user_client/donate.py``: when, to whom, which turns) and the verifier takes them
(``verifier/audit/pool.py``: from whom, for which models, how many). Nothing here does I/O.

Wire format (at most :data:`MAX_DONATION_BYTES` sealed)::

    sealed    = seal_to_ed25519(verifier's Ed25519 validator key, plaintext)
    plaintext = msgpack([2, donor_node_id(20), model(str), [[role, content], ...],
                         [temperature(float), top_p(float), top_k(int), max_tokens(int), seed(int|nil)],
                         [seen_by_node_id(20), ...], signature(64)])
    signature = Ed25519(donor's node key,
                        DONATION_CONTEXT + msgpack([donor_node_id, model, messages, params, seen_by]))

``seen_by`` (version 2, decision 0029) names the model nodes the donor's conversation was sent to
or served by (at most :data:`MAX_SEEN_BY`, distinct, in ascending order): they have read the
prompt, so the verifier never challenges them with it (``verifier/audit/pool.py``). The donor's
word is taken as it stands: a false list only moves its own prompts between nodes.

(:func:`signing_bytes`; msgpack with bin types for bytes). :func:`encode` writes the values as
given (a caller holding an int where a float belongs converts it first, as the user's client
does); :func:`decode` is the strict side: exact types, no trailing bytes, no maps or
extensions, no array over :data:`MAX_ITEMS` items, a non-empty model, 1 or more messages and a
canonical ``seen_by``.
Every refusal of :func:`decode`, :func:`unseal` and :func:`verify` is a :class:`DonationError`
with a reason; nothing else is raised on any input. How many messages a challenge may carry,
and every other limit, is the verifier's check, not the format's
(:meth:`verifier.audit.tx.Opening.check`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

import msgpack

from overlay.wire import crypto
from overlay.wire.identity import NODE_ID_LEN, node_id_of
from overlay.wire.messages import ChatMessage, SamplingParams

DONATION_VERSION = 2  # 2: with seen_by (decision 0029); 1 is refused as an unsupported version
DONATION_CONTEXT = b"gentorrent/donation/v2\x00"
MAX_DONATION_BYTES = 16 * 1024  # sealed
MAX_ITEMS = 64  # items of any array in a donation (so at most 64 messages; a challenge takes fewer)
SIGNATURE_LEN = 64
MAX_SEEN_BY = 16  # model nodes a donated conversation may name as having read it
# The verifier's CometBFT RPC queries (abci_query) a donor asks: the key to seal to, then the donation
KEY_PATH = "/audit/donate_key"
DONATE_PATH = "/audit/donate"

__all__ = [
    "DONATION_CONTEXT", "DONATION_VERSION", "MAX_DONATION_BYTES", "MAX_ITEMS", "MAX_SEEN_BY", "SIGNATURE_LEN",
    "Donation",
    "DonationError", "Signer", "decode", "donated_messages", "encode", "seal_donation", "signing_bytes", "unseal",
    "verify",
]


class DonationError(Exception):
    """A donation that is not in this format, does not open or does not verify; ``reason`` says
    why. ``unsupported_version`` is True when only its version is not :data:`DONATION_VERSION`.
    (The user's client raises it too when a donation cannot be made.)"""

    def __init__(self, reason: str, *, unsupported_version: bool = False) -> None:
        self.reason = reason
        self.unsupported_version = unsupported_version
        super().__init__(reason)


class Signer(Protocol):
    """A donor's signing key: :class:`overlay.wire.identity.Identity` or :class:`overlay.wire.crypto.SigningKey`."""

    def sign(self, message: bytes, /) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Donation:
    """One donated prompt: the donor's node id, the model, the chat messages, the sampling
    parameters and the model nodes that have read the conversation (``seen_by``: distinct, in
    ascending order; module docstring)."""

    donor: bytes
    model: str
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    seen_by: tuple[bytes, ...] = ()

    def wire(self) -> list[object]:
        """``[donor, model, [[role, content], ...], [temperature, top_p, top_k, max_tokens, seed],
        [seen_by, ...]]``."""
        p = self.params
        return [self.donor, self.model, [[m.role, m.content] for m in self.messages],
                [p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed], list(self.seen_by)]


def seen_by_of(nodes: Iterable[bytes]) -> tuple[bytes, ...]:
    """``nodes`` as a donation's ``seen_by``: distinct, in ascending order; :class:`DonationError`
    if there are more than :data:`MAX_SEEN_BY` (a conversation that many nodes read is not donated)."""
    out = tuple(sorted(set(nodes)))
    if len(out) > MAX_SEEN_BY:
        raise DonationError(f"the conversation was sent to {len(out)} model nodes, more than a donation may name "
                            f"({MAX_SEEN_BY})")
    return out


def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def donated_messages(messages: Sequence[ChatMessage]) -> list[ChatMessage] | None:
    """The messages a client donates of a request (user_client/donate.py): the system messages
    before the first user turn, then the latest :data:`~overlay.directory.transcripts.MAX_TURNS`
    user turns, without the replies between them (a challenge replays the user turns and the
    challenged node's own replies take the replies' places, decision 0025; the replies this user
    got are not donated, decision 0027). ``None`` when the last message is not a non-empty user
    message (nothing an audit could send)."""
    from overlay.directory.transcripts import MAX_TURNS  # (transcripts imports this module)

    if not messages or messages[-1].role != "user" or not messages[-1].content.strip():
        return None
    first = next(i for i, m in enumerate(messages) if m.role == "user")
    head = [m for m in messages[:first] if m.role == "system"]
    return head + [m for m in messages if m.role == "user"][-MAX_TURNS:]


def signing_bytes(d: Donation) -> bytes:
    """What the donor signs: :data:`DONATION_CONTEXT` + msgpack(:meth:`Donation.wire`)."""
    return DONATION_CONTEXT + _pack(d.wire())


def encode(signer: Signer, donor: bytes, model: str, messages: Iterable[ChatMessage],
           params: SamplingParams, seen_by: Iterable[bytes] = ()) -> bytes:
    """The plaintext of a donation from ``donor``, signed by ``signer`` (the donor's key: a test
    may hand another). Values are written as given (module docstring), ``seen_by`` made canonical
    (:func:`seen_by_of`)."""
    d = Donation(donor, model, tuple(messages), params, seen_by_of(seen_by))
    return _pack([DONATION_VERSION, *d.wire(), signer.sign(signing_bytes(d))])


def seal_donation(verifier_pk: bytes, signer: Signer, donor: bytes, model: str, messages: Iterable[ChatMessage],
                  params: SamplingParams, seen_by: Iterable[bytes] = ()) -> bytes:
    """:func:`encode`'s plaintext sealed to ``verifier_pk`` (a verifier's Ed25519 validator key);
    :class:`overlay.wire.crypto.CryptoError` for a key that is not a valid Ed25519 point. The size is
    not checked here (at most :data:`MAX_DONATION_BYTES` is the sender's to keep)."""
    return crypto.seal_to_ed25519(verifier_pk, encode(signer, donor, model, messages, params, seen_by))


def unseal(seed32: bytes, sealed: bytes) -> bytes:
    """The plaintext of ``sealed``, opened with the Ed25519 seed it was sealed to;
    :class:`DonationError` if it was sealed to another key or altered."""
    try:
        return crypto.open_sealed_ed25519(seed32, sealed)
    except crypto.CryptoError:
        raise DonationError("the donation does not open with this key (sealed to another key, or altered)") from None


def _malformed(why: str) -> DonationError:
    return DonationError(f"the donation is not {why}")


def decode(plaintext: bytes) -> tuple[Donation, bytes]:
    """The donation and its signature, decoded strictly (module docstring); the signature is not
    checked here (:func:`verify`). :class:`DonationError` with the reason otherwise."""
    try:
        doc = msgpack.unpackb(plaintext, raw=False, strict_map_key=True, use_list=True,
                              max_bin_len=MAX_DONATION_BYTES, max_str_len=MAX_DONATION_BYTES,
                              max_array_len=MAX_ITEMS, max_map_len=0, max_ext_len=0)
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as exc:
        raise _malformed(f"msgpack ({type(exc).__name__})") from None
    if type(doc) is not list or not doc:
        raise _malformed("[version, donor, model, messages, params, seen_by, signature]")
    if type(doc[0]) is not int or doc[0] != DONATION_VERSION:  # checked first: a version 1 is shorter
        raise DonationError(f"donation version {doc[0]!r} is not {DONATION_VERSION}", unsupported_version=True)
    if len(doc) != 7:
        raise _malformed("[version, donor, model, messages, params, seen_by, signature]")
    _, donor, model, messages, params, seen_by, sig = doc
    if type(donor) is not bytes or len(donor) != NODE_ID_LEN:
        raise _malformed(f"from a {NODE_ID_LEN}-byte donor node id")
    if type(model) is not str or not model:
        raise _malformed("for a model (a non-empty string)")
    if type(messages) is not list or not all(
            type(m) is list and len(m) == 2 and type(m[0]) is str and type(m[1]) is str for m in messages):
        raise _malformed("made of messages [[role, content], ...]")
    if not messages:
        raise _malformed("a prompt (it holds no messages)")
    if type(params) is not list or len(params) != 5:
        raise _malformed("with params [temperature, top_p, top_k, max_tokens, seed]")
    temp, top_p, top_k, max_tokens, seed = params
    if type(temp) is not float or type(top_p) is not float or type(top_k) is not int \
            or type(max_tokens) is not int or not (seed is None or type(seed) is int):
        raise _malformed("with params of types [float, float, int, int, int or nil]")
    if type(seen_by) is not list or len(seen_by) > MAX_SEEN_BY \
            or not all(type(n) is bytes and len(n) == NODE_ID_LEN for n in seen_by):
        raise _malformed(f"with seen_by a list of at most {MAX_SEEN_BY} {NODE_ID_LEN}-byte node ids")
    if any(a >= b for a, b in pairwise(seen_by)):
        raise _malformed("with seen_by distinct and in ascending order")
    if type(sig) is not bytes or len(sig) != SIGNATURE_LEN:
        raise _malformed(f"signed (a {SIGNATURE_LEN}-byte signature)")
    d = Donation(donor, model, tuple(ChatMessage(r, c) for r, c in messages),
                 SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed),
                 tuple(seen_by))
    return d, sig


def verify(d: Donation, signature: bytes, ed25519_public: bytes) -> None:
    """:class:`DonationError` unless ``ed25519_public`` is the donor's key (its node id is
    ``d.donor``) and ``signature`` is that key's over :func:`signing_bytes` of ``d``."""
    if len(ed25519_public) != crypto.ED25519_PK_LEN or node_id_of(ed25519_public) != d.donor:
        raise DonationError("the key is not the donor's")
    try:
        crypto.ed25519_verify(ed25519_public, signature, signing_bytes(d))
    except crypto.CryptoError:
        raise DonationError("the donation's signature does not verify") from None
