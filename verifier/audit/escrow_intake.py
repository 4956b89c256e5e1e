"""A verifier's side of escrowed commitments (decision 0037): the four queries that take them, as
pure functions over the book (:mod:`verifier.audit.transcripts`, rules 10 and 11), this
verifier's keys and the validator set. I/O-free, no clock (times are passed in); never raises on
what a sender sends: each answers ``(code, reason, value)``. The wire formats are
:mod:`overlay.directory.transcripts`'; :class:`verifier.abci_app.CommitteeAbciApp` answers the
queries with them.

- :func:`take_escrow_commit` (``/audit/transcript_escrow_commit``): a registered user's escrowed
  commit. This verifier opens its shares, checks them against the points under the validator
  set's plan (:func:`overlay.directory.escrow.plan_of`), holds the commitment and answers its
  signed acceptance. Shares that do not check get no acceptance.
- :func:`take_certificate` (``/audit/transcript_certify``): the acceptances of validators above
  two thirds of the power, before the request leaves; the commitment then takes part in its set.
- :func:`take_node_reveal` (``/audit/transcript_node_reveal``): a registered model node's sealed
  transcript of a certified commitment addressed to it.
- :func:`released_page` (``/audit/transcript_released``): this verifier's shares of an epoch's
  escrowed commitments whose donor's transcript it does not hold, certified here or not
  (:func:`release_list`: at most :data:`~overlay.directory.transcripts.MAX_RELEASED`, shared out
  among donors so that each donor's first comes out), once :func:`release_due`; at most
  :data:`RELEASE_PAGE` a query, after a given commitment.

The holders' order, the one the donor deals to: the validators' Ed25519 keys in ascending
bytes (:func:`overlay.directory.escrow.holders`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.directory.registration import Code
from overlay.wire import crypto
from verifier.audit.transcripts import WINDOW_MS, KeyOf, TranscriptBook, transcript_of

RELEASE_PAGE = 256  # released commitments in one answer
RELEASED_QUERY_LEN = (8, 8 + wire.COMMITMENT_LEN)  # wire.released_query: an epoch, then the last one seen
# epoch e's shares go out the chain's release delay after epoch e + 1 began here (this: the default
# reply window's): every commitment of e was certified before that (rule 10 takes a certificate only
# in its commitment's epoch), so every reply that can count of one was signed before the release
# (rule 1's window), and a margin more (wire.release_delay_s, decision 0040)
RELEASE_DELAY_MS = wire.release_delay_s(WINDOW_MS // 1000) * 1000
_RANK_PERSON = b"gt-release-rank"

__all__ = ["RELEASE_DELAY_MS", "RELEASE_PAGE", "book_code", "release_choice", "release_due", "release_level",
           "release_list", "release_rank", "released_page", "skewed", "take_certificate", "take_escrow_commit",
           "take_node_reveal"]

UserKey = Callable[[bytes], bytes | None]


def skewed(sent_ms: int, now_ms: int) -> str | None:
    """Why a commit made at ``sent_ms`` on the donor's clock is refused at ``now_ms`` (``None``: it is
    within :data:`~overlay.directory.transcripts.MAX_SKEW_MS`): an old commit replayed would stand
    unrevealed and burn its donor."""
    skew = now_ms - sent_ms
    if abs(skew) > wire.MAX_SKEW_MS:
        return (f"it was made {abs(skew) // 1000} s {'before' if skew > 0 else 'after'} this verifier's time "
                f"(at most {wire.MAX_SKEW_MS // 1000} s): check your clock")
    return None


_BOOK_CODES = {
    "malformed": Code.INVALID_FIELD, "burnt": Code.CONFLICT, "full": Code.UNAVAILABLE, "duplicate": Code.DUPLICATE,
    "too many": Code.UNAVAILABLE, "unknown": Code.INVALID_FIELD, "seeded": Code.INVALID_FIELD,
    "unverifiable": Code.UNKNOWN_NODE, "forged": Code.BAD_SIGNATURE, "late": Code.LATE,
    "uncertified": Code.INVALID_FIELD, "escrowed": Code.INVALID_FIELD, "equivocation": Code.CONFLICT,
}


def book_code(why: str) -> Code:
    """The code of a :class:`~verifier.audit.transcripts.TranscriptBook` refusal (``kind: words``)."""
    return _BOOK_CODES.get(why.split(":")[0], Code.INVALID_FIELD)


def take_escrow_commit(book: TranscriptBook, data: bytes, signer: crypto.SigningKey, user_key: UserKey,
                       validators: Mapping[bytes, int], epoch: int, now_ms: int) -> tuple[Code, str, bytes]:
    """A donor's escrowed commit into ``book`` for ``epoch`` at ``now_ms``; its value, this
    verifier's signed acceptance (:func:`overlay.directory.transcripts.encode_acceptance`)."""
    try:
        c = wire.decode_escrow_commit(data)
    except wire.TranscriptError as exc:
        return (Code.UNSUPPORTED_VERSION if exc.unsupported_version else Code.MALFORMED), exc.reason, b""
    me = signer.public_bytes
    if c.verifier != me:
        return Code.INVALID_FIELD, "this commit names another verifier's key; make one for each verifier", b""
    public = user_key(c.donor)
    if public is None:
        return Code.UNKNOWN_NODE, f"donor {c.donor.hex()[:16]} is not a registered user node of this committee", b""
    try:
        wire.verify_escrow_commit(c, public)
    except wire.TranscriptError as exc:
        return Code.BAD_SIGNATURE, exc.reason, b""
    late = skewed(c.sent_ms, now_ms)
    if late is not None:
        return Code.INVALID_FIELD, f"the commit: {late}", b""
    order = [k for k, _ in escrow.holders(validators)]
    try:
        plan = escrow.plan_of(validators)
    except escrow.EscrowError as exc:
        return Code.UNAVAILABLE, f"this committee's powers cannot be escrowed ({exc.reason}); commit without escrow", b""
    if me not in order:
        return Code.NOT_VALIDATOR, "this verifier is not a current validator: it holds no shares", b""
    if len(c.points) != plan.threshold:
        return Code.INVALID_FIELD, (f"{len(c.points)} points; this validator set's plan needs {plan.threshold} "
                                    f"({plan.units} units)"), b""
    try:
        shares = wire.open_shares(signer.private_bytes(), c)
    except wire.TranscriptError as exc:
        return Code.MALFORMED, exc.reason, b""
    if not escrow.verify_holder(plan, order.index(me), c.points, shares):
        return Code.INVALID_FIELD, ("the shares sealed to this verifier are not its own under the plan, or do not lie "
                                    "on the points: not accepted"), b""
    why = book.hold(c.donor, c.value, c.points_raw, shares, epoch, now_ms)
    if why is not None:
        return book_code(why), why, b""
    acceptance = wire.encode_acceptance(signer, me, c.donor, c.value, wire.points_digest(c.points_raw), c.sent_ms)
    return Code.OK, "held: certify it with the acceptances of validators above two thirds of the power", acceptance


def take_certificate(book: TranscriptBook, data: bytes, user_key: UserKey, validators: Mapping[bytes, int],
                     epoch: int, now_ms: int) -> tuple[Code, str]:
    """A donor's certificate into ``book`` for ``epoch`` at ``now_ms``: acceptances of validators
    above two thirds of the power."""
    try:
        cert = wire.decode_certificate(data)
    except wire.TranscriptError as exc:
        return (Code.UNSUPPORTED_VERSION if exc.unsupported_version else Code.MALFORMED), exc.reason
    if user_key(cert.donor) is None:
        return Code.UNKNOWN_NODE, f"donor {cert.donor.hex()[:16]} is not a registered user node of this committee"
    late = skewed(cert.sent_ms, now_ms)
    if late is not None:
        return Code.INVALID_FIELD, f"the certificate's commit: {late}"
    # the acceptances sign the points' digest, and each acceptor checked their number against the plan
    power, total = wire.certified_power(cert, validators), sum(validators.values())
    if 3 * power <= 2 * total:
        return Code.INVALID_FIELD, (f"the acceptances hold {power} of {total} power; more than two thirds are "
                                    "needed")
    why = book.certify(cert.donor, cert.value, cert.points_raw, epoch, now_ms)
    if why is not None:
        return book_code(why), why
    return Code.OK, "certified: send the request now; reveal the transcript (or that no reply came) after it"


def take_node_reveal(book: TranscriptBook, sealed: bytes, seed32: bytes, verifier_pk: bytes,
                     model_key: Callable[[bytes, str], bytes | None], key_of: KeyOf, *,
                     window_ms: int = WINDOW_MS) -> tuple[Code, str]:
    """A model node's sealed reveal into ``book``: the node is registered for the transcript's
    model (``model_key``) and signed it, the request was addressed to it; its reply signed within
    the chain's reply window (``window_ms``) of the commitment."""
    try:
        nr = wire.decode_node_reveal(wire.unseal(seed32, sealed))
    except wire.TranscriptError as exc:
        return (Code.UNSUPPORTED_VERSION if exc.unsupported_version else Code.MALFORMED), exc.reason
    if nr.verifier != verifier_pk:
        return Code.INVALID_FIELD, "this node reveal names another verifier's key; make one for each verifier"
    public = model_key(nr.node_id, nr.body.model)
    if public is None:
        return Code.UNKNOWN_NODE, f"node {nr.node_id.hex()[:16]} is not a registered model node of {nr.body.model!r}"
    try:
        wire.verify_node_reveal(nr, public)
    except wire.TranscriptError as exc:
        return Code.BAD_SIGNATURE, exc.reason
    why = book.node_reveal(transcript_of(nr.body), key_of, window_ms=window_ms)
    if why is not None:
        return book_code(why), why
    return Code.OK, "taken: it stands for the commitment its donor did not reveal"


def release_due(epoch: int, now_epoch: int, seen_ms: Mapping[int, int], now_ms: int, *,
                delay_ms: int = RELEASE_DELAY_MS) -> bool:
    """Whether ``epoch``'s shares may go out: ``epoch + 1`` began at least ``delay_ms`` (the chain's
    release delay, :func:`overlay.directory.transcripts.release_delay_s` of its reply window) ago on
    this verifier's clock (``seen_ms``: when it first saw each epoch), so every commitment
    of ``epoch`` was certified before, every reply to one that can count was signed before, and a
    node that learns from the release which of its requests were donated learns it too late to
    serve them otherwise."""
    began = seen_ms.get(epoch + 1)
    return now_epoch > epoch and began is not None and now_ms >= began + delay_ms


def release_rank(seed: bytes, value: bytes) -> bytes:
    """A released commitment's rank: BLAKE2b-256 of the seed of the epoch after its own (the hash of
    its epoch's last block, :mod:`verifier.audit.chain`) and its value. No donor knows the seed
    while it commits, so none can rank its commitments."""
    return crypto.blake2b(seed + value, size=32, person=_RANK_PERSON)


def release_level(counts: Sequence[int], cap: int = wire.MAX_RELEASED) -> int:
    """How many withheld commitments each donor may have released at most, given each donor's
    count (``counts``) and the most a verifier releases (``cap``): the largest level ``L`` at which
    ``sum(min(c, L))`` fits. At least 1 while there are no more donors than ``cap``, as the book
    ensures (``MAX_DONORS`` is ``MAX_RELEASED``): every donor's withheld commitment comes out
    when it withheld only one, however many others withheld (decision 0039)."""
    if sum(counts) <= cap:
        return max(counts, default=0)
    low, high = 0, max(counts)  # sum(min(c, low)) fits, sum(min(c, high)) does not
    while high - low > 1:
        mid = (low + high) // 2
        if sum(min(c, mid) for c in counts) <= cap:
            low = mid
        else:
            high = mid
    return low


def release_choice(by_donor: Iterable[Sequence[bytes]], seed: bytes, cap: int = wire.MAX_RELEASED) -> list[bytes]:
    """Which withheld commitments come out, given each donor's (``by_donor``): every donor's up to
    :func:`release_level`, a donor over it its own of lowest :func:`release_rank`; what the cap
    has left goes one each to donors over the level, by the rank of their next. So a donor's
    commitment stays in only where that donor withheld more than the level, and a proposer who
    grinds the seed chooses only among those donors' commitments, never a one-shot donor's."""
    donors = [list(values) for values in by_donor]
    level = release_level([len(values) for values in donors], cap)
    out: list[bytes] = []
    next_ones: list[bytes] = []
    for values in donors:
        if len(values) <= level:
            out.extend(values)
            continue
        ranked = sorted(values, key=lambda v: release_rank(seed, v))
        out.extend(ranked[:level])
        next_ones.append(ranked[level])
    next_ones.sort(key=lambda v: release_rank(seed, v))
    return out + next_ones[:cap - len(out)]


def release_list(book: TranscriptBook, epoch: int, seed: bytes) -> list[wire.ReleasedItem]:
    """What this verifier releases of ``epoch`` (``seed``: epoch ``epoch + 1``'s): the items of
    :meth:`~verifier.audit.transcripts.TranscriptBook.released` a page can carry, at most
    :data:`~overlay.directory.transcripts.MAX_RELEASED` (a node reads at most that many of a
    verifier's), shared out among donors (:func:`release_choice`), in ascending order of
    commitment. Were they the lowest by value, a framer who withheld that many junk commitments of
    low values (they need never be asked) would push its withheld good reply out of every node's
    reading; were they the lowest by a rank of the seed, as first built, a junk flood would push
    it out by chance, and a proposer who grinds the seed by choice (decision 0039). Shared out by
    donor, a donor's only withheld commitment always comes out."""
    fit: dict[bytes, tuple[bytes, bytes, tuple[escrow.Share, ...]]] = {}
    by_donor = []
    for withheld in book.released_by_donor(epoch).values():
        mine = [it for it in withheld if len(it[2]) <= wire.MAX_RELEASED_UNITS]
        fit.update((it[0], it) for it in mine)
        by_donor.append([it[0] for it in mine])
    held = [fit[v] for v in release_choice(by_donor, seed)]
    decoded: dict[bytes, tuple[bytes, ...]] = {}
    items = []
    for value, points_raw, shares in held:
        if points_raw not in decoded:
            decoded[points_raw] = escrow.decode_commitments(points_raw, escrow.MAX_UNITS)
        if len(decoded[points_raw]) <= wire.MAX_RELEASED_UNITS:
            items.append((value, decoded[points_raw], shares))
    return sorted(items, key=lambda it: it[0])


def released_page(items: Sequence[wire.ReleasedItem], data: bytes, now_epoch: int, seen_ms: Mapping[int, int],
                  now_ms: int, *, delay_ms: int = RELEASE_DELAY_MS) -> tuple[Code, str, bytes]:
    """Up to :data:`RELEASE_PAGE` of ``items`` (:func:`release_list` of the epoch ``data`` names,
    :func:`overlay.directory.transcripts.released_query`) after the commitment it names, in
    ascending order of commitment; the encoded page
    (:func:`overlay.directory.transcripts.encode_released`)."""
    if len(data) not in RELEASED_QUERY_LEN:
        return Code.MALFORMED, "the query is an epoch (8 bytes, big-endian) and, after the first page, a commitment", b""
    epoch, after = int.from_bytes(data[:8], "big"), data[8:]
    if not release_due(epoch, now_epoch, seen_ms, now_ms, delay_ms=delay_ms):
        return Code.TOO_EARLY, (f"epoch {epoch}'s shares go out once epoch {epoch + 1} is "
                                f"{delay_ms // 1000} s old on this verifier's clock"), b""
    page = [it for it in items if it[0] > after][:RELEASE_PAGE]
    return Code.OK, f"{len(page)} released", wire.encode_released(epoch, page)
