"""Users' own transcripts as audit evidence, chosen so that no user can frame a node (decision 0015).

Challenges a verifier writes can be told from users' requests (decision 0013: a detector reaches
AUC 0.93). Users' own requests cannot: they *are* users' requests. A user who consents hands
the committee a sample of its own signed transcripts. The danger is the other way round: a user
who hands in only the unluckiest of many honest replies could sink an honest node. This module
is a verifier's book of one user's (*donor's*) transcripts, with the rules that make every
counted set an unbiased draw of the node's replies. I/O-free; no clock (times are passed in).

The rules, and the framer each one stops:

1. **Commit before the reply.** Before sending a request it will donate, the donor's client sends
   each verifier ``commitment = BLAKE2b-256(nonce ‖ node id ‖ reply digest)`` (person
   ``gt-transcript``), where the reply digest is :func:`overlay.anon.signing.request_digest` of the
   request *with its request id*. The verifier notes when it got it (:meth:`TranscriptBook.commit`).
   A reply signed before that time, or more than the chain's reply window after it
   (``reply_window_s``, :data:`WINDOW_MS` by default; decision 0040), counts for nothing:
   the framer who commits after seeing a bad reply is refused.
2. **One sample per commitment.** The reply signs the request id and the node the client
   addressed (:func:`overlay.anon.signing.request_digest`), and a model node answers each id once
   (:mod:`overlay.anon.replay`): resending the committed request draws no second sample, and the same
   request sent to ten other nodes draws replies that name those nodes, which do not open a
   commitment naming the first. A reply signed by a member the addressed node forwarded to counts
   for its signer: the member was chosen by the addressed node's routing, not by the donor.
3. **All or nothing.** A donor's commitments of one epoch count only when *every one* of them is
   revealed with a reply that verifies (:meth:`TranscriptBook.close`). Withholding the good ones,
   or saying "no reply came" for them, voids the donor's whole set for that epoch, bad ones
   included: the framer can throw its sample away, never bias it.
4. **No seeds.** A request with a seed is void (rule 3 voids the set): with a seed, an engine's
   sample is reproducible, and a framer could search seeds offline for an unlucky reply.
5. **Bounded weight.** At most :data:`MAX_COMMITS` commitments per donor and epoch, and at most
   :data:`MAX_PER_NODE` counted transcripts per donor, node and epoch; a donor is a registered
   user (registration costs, decision 0012).
6. **Void sets are budgeted.** Rule 3 alone lets a framer commit *one* request an epoch and
   reveal it only when the reply is bad (a set of one, voided when good). So a donor may leave
   at most :data:`VOID_ALLOWANCE` sets plus :data:`VOID_SHARE` of all its closed sets void
   (withheld, "no reply", or a reveal that fails a check); past that it is *burnt*: its
   commitments are refused from then on. Honest donors' void sets come from failed nodes (a busy
   one's signed refusal is no sample, rule 13); a framer can spend the same budget on voiding
   good replies, which moves the share of bad replies among its counted ones from ``q`` to at
   most about ``q / (1 − VOID_SHARE)``
   (``test_a_cherry_picking_framer_gains_little_and_is_burnt_past_its_budget``). That is a
   bound, not a wall: closing it needs the node's side of the reveal (decision 0015, "Not done").

7. **Judged per donor, not only pooled** (decision 0028). A node's transcripts are scored by their
   mean, and a mean can be lifted: a cheater's own registered users (*boosters*) send it requests
   it recognises, get honest replies and hand those in (16 such identities kept a selective
   cheater trusted when users donate a tenth of their requests, measured). So each verifier also
   pools the ``z`` of each donor's transcripts of a node (:func:`capped_by_donor`,
   :func:`verifier.audit.scoring.donors_cap`): when **two** donors' sets are each further from
   sampling than honest sets get (the threshold grows with the log of the node's donors), every
   transcript score of that node this epoch is capped. Boosters' honest sets cannot lift the
   cap; one donor's luck, or choice, cannot set it.
8. **Bounded work** (decision 0032). A transcript may be as long as any request a node serves
   (4,096 tokens), and scoring one that long took 30–65 s of a verifier's CPU where a typical one
   takes 2 s: one donor's 16 such commitments an epoch would take 17 minutes, more than the
   epoch, and delay every other donor's scores. So each donor's counted transcripts of a round
   are scored in an order drawn from the verifier's secret randomness while their cost (reply
   tokens and a quarter of the messages' bytes) stays within :data:`SCORE_BUDGET`, the first
   always (:func:`within_budget`): a random subset of a sample that was already unbiased, which
   neither the donor nor the node chooses. A donor's 16 one-turn requests of a typical length
   (a 141-token reply to a 45-token prompt) cost about 3,000 and are scored whole; a donor of
   long conversations is sampled.
9. **Bounded work per verifier** (decision 0033). Rule 8 bounds one donor, not how many there are:
   registered identities cost work per key, not in total, so a patient attacker's donors (each
   with 16 honest requests a round) could hand a verifier more to score than it can in an epoch,
   every round, and the scores of every node would fall further behind. So a round's counted
   transcripts are scored while their cost stays within the verifier's ``--transcript-budget``
   (:data:`ROUND_BUDGET` a scoring thread by default), shared out among the *nodes* they are of,
   half equally and half in proportion to each node's donors (:func:`node_weights`, decision
   0035): each node may spend up to its weight times a common level, a node asking less giving the
   rest to the others (:func:`within_capacity`), its donors in an order drawn from the verifier's secret
   randomness, one transcript of each before a second of any (:func:`donor_order`), the
   transcript that would cross the level kept with the odds of what is left of it (so each node
   spends its share on average, and the round the budget). Donors flooding other nodes'
   transcripts cannot push a node's share under ``budget / (2 × nodes)``; a node's own (its
   boosters) raise its share with their number, so they dilute its users' transcripts about as
   much as they dilute the whole network's donors, not in proportion to its own; the flooded
   nodes' own donors are crowded out the same way (their nodes are then
   judged by the flood's transcripts, which are honest replies, or by challenges). A quarter of
   the budget waits for a **second draw**: once the first is scored, the nodes one of whose donors'
   sets lies as far from sampling as rule 7 looks for (:func:`suspects`) share it, more of their
   donors' transcripts drawn the same way; so boosters that crowd a cheater's share leave its users'
   sets a second chance, and a framer's set on an honest node brings more of its users' in; a
   suspect stays one for :data:`SUSPECT_EPOCHS` more rounds (:func:`remembered`; the audit loop
   saves them with its plan, so a restart keeps them); what the suspects leave of the reserve goes
   to every node as the first draw's did. Each
   node's draw (and each donor's, rule 8) comes from a stream of its own, keyed by the round's
   secret and its id, and each draw takes the same randomness from the verifier's generator
   whatever the round holds: another node's transcripts (a restart voiding its users' sets, a
   flood) change what is drawn of a node only through its share, which moves with the round's
   donors (decision 0034, 0035). The budget is the
   verifier's capacity, and the audits need about :data:`NODE_BUDGET` of it a node: the audit loop
   warns, naming the flags, when its budget leaves the nodes less (decisions 0034, 0035).

10. **Escrowed commitments** (decision 0037; built in this book and the wire formats, not yet
   taken by the verifier's queries nor made by donors' clients). A donor may escrow its nonce: a
   secret ``s`` dealt among the validators by verifiable sharing
   (:mod:`overlay.directory.escrow`), the nonce ``nonce_of(s)``. The verifier checks its shares
   and holds the commitment (:meth:`TranscriptBook.hold`); it takes part in its set only once a
   certificate of acceptances from validators above two thirds of the power came, before the
   request left (:meth:`TranscriptBook.certify`, which starts rule 1's window). Whether it can
   ever count is then settled before the reply: the honest acceptors hold enough shares to
   rebuild ``s`` without any colluder. A transcript of it counts only with ``s``, whose nonce it
   is and which opens the escrow's ``C_0``: a commitment made under another nonce never counts.
   And ``s`` must carry the request's locator in its low 64 bits (decision 0038), so the node can
   find the request by a lookup: a secret without it never counts either, whoever reveals it.
11. **The node's side** (decision 0037). After the epoch, :meth:`TranscriptBook.released` gives
   this verifier's shares of the escrowed commitments whose donor's transcript it does not hold
   (withheld, "no reply", or a reveal that failed a check), certified here or not: a donor chooses
   which verifiers get its certificate, and one that certified at too few to rebuild the secret
   must not keep the node from it (decision 0039). Never of one its donor revealed. The node
   addressed rebuilds ``s``, finds what it served, and hands it in
   (:meth:`TranscriptBook.node_reveal`, checked as a donor's is). It fills the donor's gap, so a
   set counts when every one of its commitments is revealed by the donor or its node (rule 3 over
   the union); the donor is still charged the void set (rule 6). A framer's counted sample is then
   every reply it committed to. Where the donor's and the node's transcripts differ, both signed,
   the node signed two replies to one request: the donor's counts, and the equivocation is
   counted. A version 1 commitment (no escrow) is revealed by its donor alone, as before.
12. **A full book drops idle sets, the idlest donors' first** (decisions 0039 and 0041). A set
   whose every commitment is escrowed and uncertified here (*idle*) counts for nothing, so a full
   book drops one to take a new donor (:meth:`TranscriptBook._evict_uncertified`): the set of
   the donor that left the most idle sets here before (:attr:`TranscriptBook.idle`, a mark each
   time one of its idle sets is dropped or closed), the oldest latest hold among equals. A flood
   of holds can then push out only sets of identities as fresh to this verifier as its own: to
   drop a one-shot framer's hold, and with it the shares the node needs (rule 11), it takes a
   book's worth of identities never idle here before, or a book filled with sets that count
   (certified, and revealed with real replies), every time.
13. **A signed "busy" is no sample** (decision 0044). A model node that refuses a request as busy
   before any output signs that it did (:func:`overlay.anon.signing.busy_signing_bytes`), and a
   donor reveals that refusal for the request it committed to (a body of kind 3). It closes the
   commitment as neither a transcript nor a gap: the rest of the set still counts, and a set of
   refusals alone is counted neither complete nor void (rule 6), so a donor cannot widen its void
   budget with refusals a node of its own signs. It cannot hide a reply behind one either: a node
   signs "busy" only before any output, and answers each request id once (rule 2), so for one
   commitment a donor holds a reply or a refusal, never both. A forged refusal fails like a forged
   reply (rule 3 voids the set). Before this, a busy node's refusal cost an honest donor a void set
   every time.

What is left to a framer: choosing prompts (before the reply) on which honest replies score
badly; the score is calibrated per reply (decision 0013 §5: honest z has sd 0.91 over real
prompts), and rule 5 bounds how much one donor weighs. A verifier that colludes with a node
learns *when* a donor commits (not to which node, nor what): the node can be honest in the
seconds after each commitment it hears of. Both are measured in docs/benchmarks.md
"audit-evasion" where they are measured at all; see decision 0015.

What is built around this book, and what is not: decision 0015, "Built, and not done".

**Rounds in progress.** The audit loop takes a round's counted transcripts with
:meth:`TranscriptBook.take_round` (it closes the earlier epochs, as :meth:`~TranscriptBook.close_before`
does) and they stay in the book, saved with it, until :meth:`~TranscriptBook.scored_rounds` says
the round's scores went to the carry: a verifier restarted while it scores (which takes most of
an epoch when its budget binds) draws that round again rather than losing it; the loop never
takes a round it is still scoring (``busy``). A round not scored by the end of the next is
dropped (:data:`PENDING_ROUNDS`).

**Persistence.** :meth:`TranscriptBook.to_bytes` and :meth:`TranscriptBook.from_bytes` turn the
whole book (its sets with their commitments, arrival times, escrows and revealed transcripts, ``burnt``,
``history``, ``refused``, ``voided``, the rounds in progress and the :class:`ScoreCarry` it holds
for the audit loop, and ``idle``) into bytes and back; a file of format 1 (before rounds in progress
were kept) loads with none, one of format 2 (before decision 0037) with no escrowed commitment,
one of format 3 (before decision 0041) with no idle marks; the
commitment index is rebuilt from the sets. A book loaded from its bytes
answers every later call as the book that wrote them would. Loading is strict (version,
checksum, shape, the book's own limits, canonical form; a node's transcript only of a certified
escrowed commitment, a secret exactly where the commitment is escrowed) and all or nothing:
:class:`BookError`, never a half-loaded book. The file around it is the verifier's (:mod:`verifier.run`). Format::

    book       = [BOOK_VERSION, BLAKE2b-256(body) (person gt-book), body]
    body       = [sets, burnt, history, refused, voided, carry, pending, idle]
                 (format 1: the first six; formats 2 and 3: the first seven)
    sets       = [[epoch, donor(20), void reason ("" while it may count), [entry, ...]], ...]
                 by (epoch, donor) ascending, at most MAX_DONORS; at most MAX_COMMITS entries
                 each, in the order they were committed (rule 5 counts in that order)
    entry      = [commitment(32), received_ms, transcript | nil, escrow | nil, node's transcript | nil]
                 (formats 1 and 2: the first three only); received_ms of an escrowed one: when
                 it was certified, or held while it is not
    escrow     = [certified (bool), points (escrow.encode_commitments), this verifier's shares
                  (escrow.encode_shares; none where it held none)]
    transcript = [node id(20), nonce(16), Opening.encode(transcript=True) (bytes), request id(16),
                  msgpack of ReplyOutcome.to_wire() (bytes), secret (32 bytes; empty where the
                  commitment is not escrowed)]                  (formats 1 and 2: no secret)
    burnt      = [donor(20), ...] ascending
    history    = [[donor(20), complete sets, void sets], ...] by donor ascending
    refused    = [[kind, count], ...] by kind ascending
    carry      = [dropped, [[node(20), [[epoch, score], ...]], ...]] by node ascending
    pending    = [[round, [[donor(20), node(20), transcript], ...]], ...] by round ascending: at most
                 PENDING_ROUNDS rounds of 1 to MAX_PENDING counted transcripts each, in the order
                 they were closed; node is the transcript's signer
    idle       = [[donor(20), idle sets (at least 1)], ...] by donor ascending
"""

from __future__ import annotations

import random
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack

from overlay.anon import signing
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.directory.registration import DECODE_ERRORS, TxError, pack
from overlay.directory.transcripts import COMMITMENT_LEN, MAX_REVEAL_BYTES, NONCE_LEN, Revealed, commitment
from overlay.wire import codec, crypto
from overlay.wire.identity import NODE_ID_LEN
from overlay.wire.messages import REQUEST_ID_LEN, Request
from verifier.audit.tx import Opening, ReplyOutcome, decode_outcome

WINDOW_MS = wire.DEFAULT_REPLY_WINDOW_S * 1000  # the default reply window: a committed request's reply signed within it
MAX_COMMITS = 16  # per donor and epoch
SCORE_BUDGET = 16_384  # rule 8: cost (about tokens) of a donor's transcripts scored a round: 4 of the longest
ROUND_BUDGET = 49_152  # rule 9: cost of the transcripts a verifier scores a round (mean), per scoring thread
RESERVE_DIVISOR = 4  # rule 9: a quarter of the budget waits for the second draw (suspect nodes)
SUSPECT_EPOCHS = 3  # rule 9: a suspect stays one for this many rounds after the last that found it
NODE_BUDGET = 6_144  # rule 9: the share of a budget a node needs a round for the audits' goals (decisions 0034, 0035)
MAX_PER_NODE = 4  # counted transcripts per donor, node and epoch
MAX_DONORS = 4096  # donors with open commitments at once, per verifier (full: one holding only uncertified ones goes)
CARRY_EPOCHS = 4  # a verifier holds a node's transcript scores this many epochs for the chain's minimum
VOID_ALLOWANCE = 2  # void sets any donor may have (rule 6) ...
VOID_SHARE = 0.2  # ... plus this share of its closed sets
BOOK_VERSION = 4  # of to_bytes' format (module docstring); 1 to 3 still load (3: no idle marks, decision 0041)
PENDING_ROUNDS = 2  # a round's counted transcripts wait in the book for its scores this many rounds at most
MAX_PENDING = MAX_DONORS * MAX_COMMITS  # counted transcripts of one round in progress (all a round can close)
MAX_BOOK_BYTES = 1 << 30  # a saved book: loading it holds it in memory two or three times over
MAX_VOID_REASON = 1024  # characters of a void set's reason kept (only whether a set is void matters)
MAX_REFUSAL_KINDS = 64  # kinds of refusal counted (the book's own messages have about a dozen)
MAX_REFUSAL_KIND = 64  # characters of one ("malformed", "no reply", ...)

__all__ = ["COMMITMENT_LEN", "NODE_BUDGET", "NONCE_LEN", "RESERVE_DIVISOR", "ROUND_BUDGET", "SCORE_BUDGET",
           "SUSPECT_EPOCHS", "BookError", "Counted", "KeyOf", "ScoreCarry", "Transcript", "TranscriptBook", "capped_by_donor",
           "commitment", "cost", "donor_order", "first_draw", "node_weights", "remembered", "second_draw", "share_level",
           "suspects",
           "transcript_of", "within_budget", "within_capacity"]

KeyOf = Callable[[bytes, str], bytes | None]  # (node id, model) -> its registered Ed25519 key, if it serves model


@dataclass(frozen=True, slots=True)
class Transcript:
    """A donated request and the signed reply it got: the node the request was addressed to, the
    commitment's nonce, the request (as an :class:`~verifier.audit.tx.Opening` whose salt is
    unused, and its request id) and the reply (signed by that node or the member of its group it
    forwarded to; the reply's ``score`` and ``tries`` are unused here)."""

    node_id: bytes
    nonce: bytes
    opening: Opening
    request_id: bytes
    reply: ReplyOutcome
    secret: bytes = b""  # an escrowed commitment's secret (decision 0037), whose nonce is ``nonce``

    def request(self) -> Request:
        return self.opening.request(self.request_id)

    def reply_digest(self) -> bytes:
        return signing.request_digest(self.request(), self.node_id)

    def commitment(self) -> bytes:
        return commitment(self.nonce, self.node_id, self.reply_digest())


def _busy(t: Transcript) -> bool:
    """Whether ``t`` is a node's signed "busy" refusal (no reply chunks, rule 13), not a transcript."""
    return not t.reply.chunks


def transcript_of(b: Revealed) -> Transcript:
    """The book's transcript of a donor's revealed one (:class:`overlay.directory.transcripts.Revealed`)."""
    return Transcript(b.node_id, b.nonce, Opening(bytes(16), b.model, b.messages, b.params), b.request_id,
                      ReplyOutcome(b.served_by, b.chunks, b.signature, b.signed_at_ms, 0, 1), b.secret)


def cost(t: Transcript) -> int:
    """About how many tokens scoring ``t`` evaluates: its reply's token ids and a quarter of its
    messages' UTF-8 bytes (rule 8)."""
    size = sum(len(m.content.encode("utf-8", errors="surrogatepass")) for m in t.opening.messages)
    return sum(len(ids) for _, ids in t.reply.chunks) + size // 4


def within_budget(counted: Sequence[Counted], rng: random.Random,
                  budget: int = SCORE_BUDGET) -> tuple[list[Counted], int]:
    """Rule 8: of each donor's ``counted`` transcripts, those kept in an order drawn by ``rng``
    (the verifier's secret randomness) while their :func:`cost` adds up to at most ``budget``, the
    first always; ``(kept, in their given order; how many were left out)``. Each donor's order
    from a stream of its own (one key drawn from ``rng`` a call, and the donor id), so one
    donor's transcripts never move another's."""
    by_donor: dict[bytes, list[int]] = {}
    for i, c in enumerate(counted):
        by_donor.setdefault(c.donor, []).append(i)
    keep: set[int] = set()
    key = rng.randbytes(16)
    for donor in sorted(by_donor):
        order = by_donor[donor]
        random.Random(key + donor).shuffle(order)
        spent = 0
        for i in order:
            spent += cost(counted[i].transcript)
            if spent > budget and i != order[0]:
                break
            keep.add(i)
    return [c for i, c in enumerate(counted) if i in keep], len(counted) - len(keep)


def within_capacity(counted: Sequence[Counted], rng: random.Random, budget: int = ROUND_BUDGET) -> list[Counted]:
    """Rule 9: of a round's ``counted`` transcripts, those a verifier scores within ``budget``:
    each node's in the order :func:`donor_order` draws with ``rng`` while their :func:`cost` stays
    within the node's share (:func:`node_weights`, :func:`share_level`: half of the budget by node,
    half by donor), and the one that would cross it with the odds of the share left over its cost,
    so that every node spends its share on average, however long its transcripts (a node whose
    every transcript costs more than its share is not left out, nor can its or a flood's long ones
    make the round cost more than ``budget`` on average); kept in their given order. All of them
    when they fit. Each node's draw from a stream of its own (one key drawn from ``rng`` a call,
    and the node id): another node's transcripts move it only through its share (the level and,
    with their donors, its weight)."""
    by_node: dict[bytes, list[int]] = {}
    for i, c in enumerate(counted):
        by_node.setdefault(c.node_id, []).append(i)
    costs = [cost(c.transcript) for c in counted]
    nodes_of: dict[bytes, set[bytes]] = {}
    for c in counted:
        nodes_of.setdefault(c.donor, set()).add(c.node_id)
    weights = node_weights([sum(1 / len(nodes_of[d]) for d in {counted[i].donor for i in idx})
                            for idx in by_node.values()])
    level = share_level([sum(costs[i] for i in idx) for idx in by_node.values()], budget, weights)
    donors = [c.donor for c in counted]
    key = rng.randbytes(16)
    keep: set[int] = set()
    for node, weight in sorted(zip(by_node, weights, strict=True)):
        spent, mine = 0, random.Random(key + node)
        share = level * weight
        for i in donor_order(by_node[node], donors, mine):
            if spent + costs[i] > share:
                if mine.random() * costs[i] < share - spent:
                    keep.add(i)
                break
            spent += costs[i]
            keep.add(i)
    return [c for i, c in enumerate(counted) if i in keep]


def first_draw(kept: Sequence[Counted], rng: random.Random,
               budget: int = ROUND_BUDGET) -> tuple[list[Counted], list[Counted], int]:
    """Rule 9's first draw of a round's ``kept`` transcripts (after rule 8): ``(drawn, spare,
    reserve)``: all of them and a reserve of 0 when they fit in ``budget``; else
    :func:`within_capacity` within ``budget`` less a reserve of a :data:`RESERVE_DIVISOR`-th of
    it, and the ones left out (in their given order), from which the second draw takes for the
    :func:`suspects` within the reserve."""
    if sum(cost(c.transcript) for c in kept) <= budget:
        return list(kept), [], 0
    reserve = budget // RESERVE_DIVISOR
    drawn = within_capacity(kept, rng, budget - reserve)
    chosen = {id(c) for c in drawn}
    return drawn, [c for c in kept if id(c) not in chosen], reserve


def second_draw(spare: Sequence[Counted], suspect: set[bytes], rng: random.Random, reserve: int) -> list[Counted]:
    """Rule 9's second draw, once the first is scored: of the ``spare`` transcripts, the
    ``suspect`` nodes' (:func:`suspects`) within ``reserve``, drawn as the first was; what they
    leave of it goes to the other nodes' as in the first (drawn even when nothing is left, so that the
    randomness it takes does not depend on the round)."""
    if reserve <= 0 or not spare:
        return []
    more = within_capacity([c for c in spare if c.node_id in suspect], rng, reserve)
    left = reserve - sum(cost(c.transcript) for c in more)
    return more + within_capacity([c for c in spare if c.node_id not in suspect], rng, max(0, left))


def suspects(scored: Iterable[tuple[bytes, bytes, float]]) -> set[bytes]:
    """Rule 9's second draw: of ``(node, donor, z)`` of the transcripts a verifier scored in a
    round's first draw (``z`` already :func:`~verifier.audit.scoring.transcript_z`), the nodes one
    of whose donors' sets lies further from sampling than honest sets get (rule 7's test, for one
    set where rule 7 caps on two)."""
    from verifier.audit.scoring import donors_cap

    sets: dict[bytes, dict[bytes, list[float]]] = {}
    for node, donor, z in scored:
        sets.setdefault(node, {}).setdefault(donor, []).append(z)
    return {node for node, by_donor in sets.items() if donors_cap(by_donor.values(), need=1) < 1.0}


def remembered(held: dict[bytes, int], epoch: int, fresh: Iterable[bytes]) -> set[bytes]:
    """The suspects of round ``epoch``: ``fresh`` (:func:`suspects` of its first draw) and those
    ``held`` from the :data:`SUSPECT_EPOCHS` rounds before it; ``held`` (node -> the last round it
    was a suspect) takes the fresh ones and drops the older ones. A cheater's boosters can keep
    its users out of one round's first draw by luck, not out of every round's."""
    for node in fresh:
        held[node] = epoch
    for node in [n for n, e in held.items() if e < epoch - SUSPECT_EPOCHS]:
        del held[node]
    return set(held)


def donor_order(indices: Sequence[int], donors: Sequence[bytes], rng: random.Random) -> list[int]:
    """``indices`` (of transcripts whose donors are ``donors[i]``) in rounds: the donors in an
    order drawn by ``rng``, each one's first transcript (its own drawn by ``rng``), then each
    one's second, and so on; so a node's share goes to as many donors as it can, each alike
    however many transcripts it handed in (a cheater's boosters handing in 4 each weigh as its
    users handing in 1; decision 0033)."""
    by_donor: dict[bytes, list[int]] = {}
    for i in indices:
        by_donor.setdefault(donors[i], []).append(i)
    order = sorted(by_donor)
    rng.shuffle(order)
    for d in order:
        rng.shuffle(by_donor[d])
    most = max((len(v) for v in by_donor.values()), default=0)
    return [by_donor[d][k] for k in range(most) for d in order if k < len(by_donor[d])]


def node_weights(donors: Sequence[float]) -> list[float]:
    """Each node's weight in rule 9's share when the nodes have ``donors`` donors each: its donors
    plus the mean, so that, where every node asks more than its share, half of the budget is shared
    equally among the nodes and half among the donors (decision 0035). A donor of several nodes'
    transcripts counts for each of them as a part of one (:func:`within_capacity`): one registered
    identity weighs one, however many nodes it hands in transcripts of. By node alone, a cheater's
    boosters crowd its users out of a share that stays the same; by donor alone, a flood of any
    nodes' donors shrinks every other node's share without bound. Half and half, a node keeps at
    least half an equal share, and a booster dilutes the network's donors, not its cheater's."""
    mean = sum(donors) / len(donors) if donors else 0.0
    return [d + mean for d in donors]


def share_level(demands: Sequence[int], budget: int, weights: Sequence[float] | None = None) -> float:
    """The most each node may spend of ``budget`` per unit of its weight (all 1 when ``weights``
    is None) when nodes ask ``demands``: every node asking less than that times its weight gets all
    it asks, and the rest share what is left in proportion to their weights (weighted max-min
    fair); infinite when everything fits."""
    w = [1.0] * len(demands) if weights is None else list(weights)
    left, rest = float(budget), sum(w)
    for d, wi in sorted(zip(demands, w, strict=True), key=lambda x: x[0] / x[1]):
        level = left / rest
        if d > level * wi:
            return level
        left -= d
        rest -= wi
    return float("inf")


def capped_by_donor(scored: Iterable[tuple[bytes, bytes, int, float]]) -> list[tuple[bytes, int]]:
    """Rule 7: ``(node, donor, score, z)`` of each transcript a verifier scored this epoch (fixed
    point score; ``z`` already :func:`~verifier.audit.scoring.transcript_z`) → ``(node, score)``
    in the same order, each score at most its node's
    :func:`~verifier.audit.scoring.donors_cap` over that node's donors' sets."""
    from verifier.audit.reputation import to_fixed
    from verifier.audit.scoring import donors_cap

    rows = list(scored)
    sets: dict[bytes, dict[bytes, list[float]]] = {}
    for node, donor, _, z in rows:
        sets.setdefault(node, {}).setdefault(donor, []).append(z)
    caps = {node: to_fixed(donors_cap(by_donor.values())) for node, by_donor in sets.items()}
    return [(node, min(score, caps[node])) for node, _, score, _ in rows]


@dataclass(slots=True)
class _Escrow:
    """An escrowed commitment's side (decision 0037): its public points (encoded), this verifier's
    shares of the secret (none where it did not hold any), and whether a certificate came."""

    points_raw: bytes
    shares: tuple[escrow.Share, ...] = ()
    certified: bool = False

    def points(self) -> tuple[bytes, ...]:
        return escrow.decode_commitments(self.points_raw, escrow.MAX_UNITS)


@dataclass(slots=True)
class _Entry:
    received_ms: int
    transcript: Transcript | None = None  # the donor's
    escrow: _Escrow | None = None  # None: a commitment of version 1, which nobody but its donor reveals
    node: Transcript | None = None  # the addressed node's (decision 0037), of a certified escrowed one

    def counts(self) -> bool:
        """Whether it takes part in its set: a version 1 commitment, or a certified escrowed one."""
        return self.escrow is None or self.escrow.certified

    def filled(self) -> Transcript | None:
        return self.transcript if self.transcript is not None else self.node


def _escrow_problem(t: Transcript, e: _Escrow, digest: bytes) -> str | None:
    """Rule 10: why ``t``'s secret does not open escrow ``e`` (None when it does): it must be the
    escrowed one (``s·B = C_0``), its nonce the secret's, and it must carry the locator of the
    request's ``digest`` (decision 0038: else the node could not find a request its donor withheld)."""
    try:
        secret = escrow.scalar_of(t.secret)
        opens = secret != 0 and escrow.nonce_of(secret) == t.nonce and escrow.opens(e.points(), secret)
    except escrow.EscrowError:
        opens = False
    if not opens:
        return "escrowed: the secret is not the escrowed one (its nonce opens the commitment, not the escrow)"
    if wire.secret_locator(secret) != wire.locator(digest):
        return "escrowed: the secret does not carry the request's locator (decision 0038)"
    return None


@dataclass(slots=True)
class _Set:
    """One donor's commitments of one epoch, by commitment value."""

    entries: dict[bytes, _Entry] = field(default_factory=dict)
    void: str = ""  # why the set counts for nothing ("" while it may still count)


def _idle(s: _Set) -> bool:
    """Rule 12: whether ``s`` holds only escrowed commitments no certificate came for here."""
    return not s.void and all(e.escrow is not None and not e.escrow.certified for e in s.entries.values())


@dataclass(frozen=True, slots=True)
class Counted:
    """A transcript that counts: for ``node_id``, the node that signed the reply (the addressed
    node, or the member it forwarded to)."""

    donor: bytes
    node_id: bytes
    transcript: Transcript


class BookError(ValueError):
    """Bytes that are not a saved :class:`TranscriptBook` (:meth:`TranscriptBook.from_bytes`), or a
    book that cannot be saved (:meth:`TranscriptBook.to_bytes`); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class TranscriptBook:
    """One verifier's transcripts, by epoch and donor (see the module docstring). Never raises on
    what donors send: every method returns a refusal reason or ``None``, and counts.

    ``carry`` holds the scores of counted transcripts for the audit loop
    (:class:`verifier.audit.auditor.Auditor` takes this one when it is given the book), so they are
    saved with the book. :meth:`revision` changes whenever the book or its carry may have: what
    tells the verifier's writer (:class:`verifier.run.Keeper`) that there is something to save."""

    def __init__(self) -> None:
        self._sets: dict[tuple[int, bytes], _Set] = {}
        self._where: dict[bytes, tuple[int, bytes]] = {}  # commitment -> (epoch, donor)
        self.burnt: set[bytes] = set()  # donors past their void budget (rule 6)
        self.history: dict[bytes, tuple[int, int]] = {}  # donor -> (complete sets, void sets); registered users
        self.idle: dict[bytes, int] = {}  # donor -> its idle sets dropped or closed here (rule 12)
        self.refused: dict[str, int] = {}
        self.voided = 0
        self.carry = ScoreCarry()
        self.pending: dict[int, list[Counted]] = {}  # round -> its counted transcripts, until scored
        self.changes = 0  # calls that may have changed the book (refusals are counted too)

    def revision(self) -> int:
        """A number that grows whenever the book or its :attr:`carry` may have changed."""
        return self.changes + self.carry.changes

    def _refuse(self, why: str) -> str:
        self._note(why.split(":")[0])
        return why

    def _note(self, kind: str) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1

    def commit(self, donor: bytes, value: bytes, epoch: int, now_ms: int) -> str | None:
        """Note ``donor``'s ``value`` (a :func:`commitment`) received at ``now_ms`` in ``epoch``."""
        made = self._new_entry(donor, value, epoch, now_ms)
        return made if isinstance(made, str) else None

    def _new_entry(self, donor: bytes, value: bytes, epoch: int, now_ms: int) -> _Entry | str:
        """A new entry for ``donor``'s ``value`` in its set of ``epoch``, or why not (counted)."""
        self.changes += 1
        if len(donor) != NODE_ID_LEN or len(value) != COMMITMENT_LEN:
            return self._refuse("malformed: a commitment is 32 bytes from a 20-byte donor id")
        if donor in self.burnt:
            return self._refuse("burnt: this donor left too many sets void or unrevealed; its transcripts no longer "
                                "count")
        if value in self._where:  # before a set is made: a refused commitment must leave no set behind
            return self._refuse("duplicate: this commitment was made already")
        key = (epoch, donor)
        s = self._sets.get(key)
        if s is None:
            if len(self._sets) >= MAX_DONORS and not self._evict_uncertified():
                return self._refuse(f"full: this verifier holds {MAX_DONORS} donors' commitments; try next epoch")
            s = self._sets[key] = _Set()
        if len(s.entries) >= MAX_COMMITS:
            return self._refuse(f"too many: at most {MAX_COMMITS} commitments per donor and epoch")
        entry = s.entries[value] = _Entry(now_ms)
        self._where[value] = key
        return entry

    def _evict_uncertified(self) -> bool:
        """Make room for a donor in a full book (rule 12): drop an idle set, one whose every
        commitment is escrowed and uncertified. Such a set counts for nothing and costs its donor
        nothing, so registered identities holding one each, epoch after epoch, would otherwise keep
        every donor out for good (decision 0039). A set that holds anything that may count is never
        dropped: the book is full only of those. Of the idle sets, the one of the donor with the
        most idle sets here before goes first, then the one whose latest hold is oldest: reused
        idle identities cannot push a fresh donor's hold out (decision 0041). Whether one was
        dropped (counted "evicted"; its donor is marked idle once more)."""
        idle = [(-self.idle.get(key[1], 0), max(e.received_ms for e in s.entries.values()), key)
                for key, s in self._sets.items() if _idle(s)]
        if not idle:
            return False
        key = min(idle)[2]
        for value in self._sets.pop(key).entries:
            self._where.pop(value, None)
        self._mark_idle(key[1])
        self._note("evicted")
        return True

    def _mark_idle(self, donor: bytes) -> None:
        self.idle[donor] = self.idle.get(donor, 0) + 1

    def hold(self, donor: bytes, value: bytes, points_raw: bytes, shares: Sequence[escrow.Share], epoch: int,
             now_ms: int) -> str | None:
        """Rule 10: ``donor``'s escrowed commitment ``value`` with this verifier's ``shares`` of its
        secret, which the caller checked against the points (:func:`overlay.directory.escrow.verify_holder`)
        before it signs its acceptance. It counts for nothing until :meth:`certify`."""
        made = self._new_entry(donor, value, epoch, now_ms)
        if isinstance(made, str):
            return made
        made.escrow = _Escrow(points_raw, tuple(shares))
        return None

    def certify(self, donor: bytes, value: bytes, points_raw: bytes, epoch: int, now_ms: int) -> str | None:
        """Rule 10: validators above two thirds of the power accepted ``donor``'s escrowed ``value``
        with these points (the caller checked the certificate), at ``now_ms``: the commitment takes
        part in its set from now on, and its window (rule 1) starts now. A verifier that held no
        shares of it (it refused them, or never got the commit) takes it too, with none to release.
        Only in the epoch it was held in: its reply must be signed before that epoch's release."""
        where = self._where.get(value)
        if where is None:
            made = self._new_entry(donor, value, epoch, now_ms)
            if isinstance(made, str):
                return made
            made.escrow = _Escrow(points_raw, (), True)
            return None
        self.changes += 1
        entry = self._sets[where].entries[value]
        if where[1] != donor or entry.escrow is None:
            return self._refuse("unknown: no such escrowed commitment from this donor")
        if where[0] != epoch:  # after its epoch's release was computed, a reply to it would escape the node's reveal
            return self._refuse(f"late: the commitment was held in epoch {where[0]} and its certificate came in "
                                f"epoch {epoch}; a certificate must come in its commitment's epoch: commit again")
        if entry.escrow.certified:
            return self._refuse("duplicate: this commitment was certified already")
        shares = entry.escrow.shares if entry.escrow.points_raw == points_raw else ()  # ours were of other points
        entry.escrow = _Escrow(points_raw, shares, True)
        entry.received_ms = now_ms
        return None

    def _set_of(self, donor: bytes, value: bytes) -> _Set | None:
        where = self._where.get(value)
        return None if where is None or where[1] != donor else self._sets.get(where)

    def reveal(self, donor: bytes, t: Transcript, key_of: KeyOf, *, window_ms: int = WINDOW_MS) -> str | None:
        """``donor``'s transcript for one of its open commitments. A transcript that fails any
        check voids the donor's set of that commitment's epoch (rule 3) and burns the donor
        (rule 6); the reason is returned. ``window_ms``: the chain's reply window (rule 1)."""
        self.changes += 1
        try:
            value = t.commitment()
        except ValueError:
            return self._refuse("malformed: the transcript's node id, nonce or request id has the wrong length")
        s = self._set_of(donor, value)
        entry = None if s is None else s.entries.get(value)
        if s is None or entry is None:
            return self._refuse("unknown: no such open commitment from this donor (committed after the reply?)")
        if not entry.counts():
            return self._refuse("uncertified: no certificate came for this escrowed commitment; it counts for nothing")
        if entry.transcript is not None:
            return self._refuse("duplicate: this commitment was revealed already")
        why = self._check(t, entry, key_of, window_ms)
        if why is not None:
            return self._void(donor, s, why)
        if entry.node is not None and entry.node != t:
            self._note("equivocation")  # the node's own copy differs: the donor's, the one the user got, counts
        entry.transcript = t
        return None

    def node_reveal(self, t: Transcript, key_of: KeyOf, *, window_ms: int = WINDOW_MS) -> str | None:
        """Rule 11: the addressed node's transcript ``t`` of a certified escrowed commitment whose
        donor revealed none (the caller checked that ``t.node_id``'s key signed it). It fills the
        donor's gap in its set; it changes nothing of the donor's count of void sets. Where the
        donor's transcript stands and differs, the node signed two replies to one request: the
        donor's stands, and the equivocation is counted."""
        self.changes += 1
        try:
            value = t.commitment()
        except ValueError:
            return self._refuse("malformed: the transcript's node id, nonce or request id has the wrong length")
        where = self._where.get(value)
        entry = None if where is None else self._sets[where].entries[value]
        if entry is None or entry.escrow is None or not entry.escrow.certified:
            return self._refuse("unknown: no such certified escrowed commitment is open")
        if entry.node is not None:
            return self._refuse("duplicate: this commitment was revealed by its node already")
        why = self._check(t, entry, key_of, window_ms)
        if why is not None:
            return self._refuse(why)
        if entry.transcript is not None:
            if entry.transcript == t:
                return self._refuse("duplicate: the donor revealed this transcript already")
            return self._refuse("equivocation: the node signed another reply to this request; the donor's counts")
        entry.node = t
        return None

    def released(self, epoch: int) -> list[tuple[bytes, bytes, tuple[escrow.Share, ...]]]:
        """Rule 11: ``(commitment, points, this verifier's shares)`` of every escrowed commitment of
        ``epoch`` whose donor's transcript this verifier does not hold (withheld, "no reply", or a
        reveal that failed a check), in set and commitment order; certified here or not, since the
        donor chooses where its certificate goes (decision 0039: certified at too few verifiers to
        rebuild the secret, it would otherwise be withheld where it counts and never filled in).
        Nothing of a commitment its donor revealed: a node learns which of its requests were
        donated only where a donor withheld them (a client that gets no certificate sends its
        request under another id). The caller releases them only once no reply to them can count
        any more (decisions 0037 and 0040: the chain's release delay into ``epoch + 1``, eleven minutes
        by default)."""
        return [item for items in self.released_by_donor(epoch).values() for item in items]

    def donors(self, epoch: int) -> int:
        """How many donors hold a set of ``epoch`` here (each one of the :data:`MAX_DONORS` slots)."""
        return sum(1 for key in self._sets if key[0] == epoch)

    def released_by_donor(self, epoch: int) -> dict[bytes, list[tuple[bytes, bytes, tuple[escrow.Share, ...]]]]:
        """:meth:`released`, by donor (those with at least one), in donor order: a verifier shares
        its release out among donors (:func:`verifier.audit.escrow_intake.release_list`)."""
        out: dict[bytes, list[tuple[bytes, bytes, tuple[escrow.Share, ...]]]] = {}
        for key in sorted(k for k in self._sets if k[0] == epoch):
            items = [(v, e.escrow.points_raw, e.escrow.shares) for v, e in self._sets[key].entries.items()
                     if e.escrow is not None and e.escrow.shares and e.transcript is None]
            if items:
                out[key[1]] = items
        return out

    def no_reply(self, donor: bytes, value: bytes) -> str | None:
        """The donor says a committed request got no reply: that set is void (rule 6 counts it)."""
        self.changes += 1
        s = self._set_of(donor, value)
        if s is None:
            return self._refuse("unknown: no such open commitment from this donor")
        if not s.entries[value].counts():
            return self._refuse("uncertified: no certificate came for this escrowed commitment; it counts for nothing")
        self._void(donor, s, "no reply: a committed request got none")
        return None

    def _void(self, donor: bytes, s: _Set, why: str) -> str:
        if not s.void:
            s.void = why[:MAX_VOID_REASON]
            self.voided += 1
            self._closed(donor, complete=False)
        return self._refuse(why)

    def _closed(self, donor: bytes, *, complete: bool) -> None:
        """Count one of ``donor``'s sets as complete or void; burn it past its budget (rule 6)."""
        done, void = self.history.get(donor, (0, 0))
        done, void = (done + 1, void) if complete else (done, void + 1)
        self.history[donor] = (done, void)
        if void > VOID_ALLOWANCE + VOID_SHARE * (done + void):
            self.burnt.add(donor)

    @staticmethod
    def _check(t: Transcript, entry: _Entry, key_of: KeyOf, window_ms: int) -> str | None:
        received_ms = entry.received_ms
        try:
            t.opening.check(transcript=True)  # a transcript's limits (decision 0032), not a challenge's
        except TxError as exc:
            return f"malformed: {exc}"
        if len(t.request_id) != REQUEST_ID_LEN:
            return "malformed: the request id is not 16 bytes"
        if t.opening.params.seed is not None:
            return "seeded: a request with a seed is never a transcript (its sample could be searched offline)"
        busy = _busy(t)
        if busy and t.secret:
            return "malformed: a busy refusal is revealed by the commitment's nonce, never with a secret"
        if not busy and (entry.escrow is None) != (not t.secret):
            return "malformed: an escrowed commitment is revealed with its secret, and only an escrowed one"
        digest = t.reply_digest()
        if not busy and entry.escrow is not None and (why := _escrow_problem(t, entry.escrow, digest)) is not None:
            return why
        key = key_of(t.reply.served_by, t.opening.model)
        if key is None:
            return f"unverifiable: the reply's signer is not a registered model node of {t.opening.model!r}"
        try:
            if busy:
                signing.verify_busy(key, t.reply.signature, digest, t.opening.model, t.reply.served_by,
                                    t.reply.signed_at_ms)
            else:
                chain = signing.chain_start(digest)
                for text, ids in t.reply.chunks:
                    chain = signing.chain_next(chain, text, ids)
                signing.verify_reply(key, t.reply.signature, digest, chain, True, t.opening.model,
                                     t.reply.served_by, t.reply.signed_at_ms)
        except signing.ReplyVerifyError as exc:
            return f"forged: {exc}"
        if not received_ms < t.reply.signed_at_ms <= received_ms + window_ms:
            return ("late: the reply was signed before the commitment arrived (or over "
                    f"{window_ms // 1000} s after it): it was not committed before the reply")
        return None

    def close(self, epoch: int) -> list[Counted]:
        """Every donor's set of ``epoch`` whose commitments were all revealed with a reply that
        verifies, by the donor or, for a certified escrowed one, by the node (rule 11), at most
        :data:`MAX_PER_NODE` per donor and node (in commitment order); the epoch's sets are dropped.
        Uncertified escrowed commitments take no part. Call it once no commitment of ``epoch`` can
        be revealed any more."""
        self.changes += 1
        out: list[Counted] = []
        for key in sorted(k for k in self._sets if k[0] == epoch):
            s = self._sets.pop(key)
            for value in s.entries:
                self._where.pop(value, None)
            entries = [e for e in s.entries.values() if e.counts()]
            if not entries:
                if _idle(s):
                    self._mark_idle(key[1])
                continue
            if key[1] in self.burnt:
                continue
            if not s.void:
                complete = all(e.transcript is not None for e in entries)
                if not complete or not all(_busy(e.transcript) for e in entries if e.transcript is not None):
                    self._closed(key[1], complete=complete)  # a set of "busy" refusals alone: neither (rule 13)
                if not complete:
                    self.voided += 1
                    self._note("unrevealed")
            elif any(e.escrow is None for e in entries):
                continue  # a void set of version 1 counts for nothing, as before decision 0037
            filled = [e.filled() for e in entries]
            if any(t is None for t in filled):
                continue
            per_node: dict[bytes, int] = {}
            for t in filled:
                assert t is not None
                if _busy(t):
                    continue  # rule 13: no sample
                n = t.reply.served_by
                if per_node.get(n, 0) < MAX_PER_NODE:
                    per_node[n] = per_node.get(n, 0) + 1
                    out.append(Counted(key[1], n, t))
        return out

    def close_before(self, epoch: int) -> list[Counted]:
        """:meth:`close` every open epoch before ``epoch`` (what counts of them, oldest first): what
        the audit loop does once its report of ``epoch`` is on the chain (commitments of ``epoch - 1``
        had all of ``epoch`` to be revealed)."""
        return [c for e in self.open_epochs() if e < epoch for c in self.close(e)]

    def take_round(self, epoch: int, busy: Container[int] = ()) -> tuple[list[Counted], tuple[int, ...]]:
        """What the audit loop scores in round ``epoch`` and the rounds it comes from:
        :meth:`close_before` ``epoch``, kept in the book as round ``epoch``'s until
        :meth:`scored_rounds`, after what earlier rounds left unscored (a restart while scoring)
        but those ``busy`` (being scored still); rounds older than :data:`PENDING_ROUNDS` are
        dropped, counted as refused "unscored". Taken again (a restarted loop), it returns the same."""
        fresh = self.close_before(epoch)  # counts a change when it closes anything
        for old in [r for r in self.pending if r <= epoch - PENDING_ROUNDS]:
            dropped = self.pending.pop(old)
            self.refused["unscored"] = self.refused.get("unscored", 0) + len(dropped)
            self.changes += 1
        if fresh:
            self.pending.setdefault(epoch, []).extend(fresh)
        rounds = tuple(r for r in sorted(self.pending) if r <= epoch and r not in busy)
        return [c for r in rounds for c in self.pending[r]], rounds

    def scored_rounds(self, rounds: Iterable[int]) -> None:
        """The scores of ``rounds`` (of :meth:`take_round`) went to the carry: their transcripts
        leave the book."""
        for r in rounds:
            if self.pending.pop(r, None) is not None:
                self.changes += 1

    def open_epochs(self) -> list[int]:
        return sorted({e for e, _ in self._sets})

    # ------------------------------------------------------------------ persistence

    def to_bytes(self, *, limit: int = MAX_BOOK_BYTES) -> bytes:
        """The whole book and its carry in the format of the module docstring (canonical: one book,
        one encoding). :class:`BookError` for a book over ``limit`` bytes, or holding a reply over a
        reveal's size (the intake takes none): it could not be loaded, so it is not saved."""
        return _encode_book(self, limit)

    @classmethod
    def from_bytes(cls, raw: bytes, *, limit: int = MAX_BOOK_BYTES) -> TranscriptBook:
        """The book :meth:`to_bytes` wrote, which answers every later call as that book would.
        :class:`BookError` for anything else: another format version, a checksum that does not
        match (damaged or cut short), a shape or a limit the book never has, a non-canonical
        encoding, more than ``limit`` bytes. Never a half-loaded book."""
        return _decode_book(raw, limit)


class ScoreCarry:
    """A verifier's scores of counted transcripts, per signing node, held until the node has
    :data:`verifier.audit.chain.MIN_TRANSCRIPTS` of them (then handed out together, to go on the
    chain as one vote) or they are :data:`CARRY_EPOCHS` epochs old (then dropped). The chain counts
    a validator's transcript scores for a node only from that many on (so a framer's one or two
    unlucky transcripts are never a node's whole score); carrying them over epochs keeps the few
    transcripts a node gets each epoch from being wasted."""

    def __init__(self, minimum: int | None = None) -> None:
        from verifier.audit.chain import MIN_TRANSCRIPTS

        self.minimum = MIN_TRANSCRIPTS if minimum is None else minimum
        self._held: dict[bytes, list[tuple[int, int]]] = {}
        self.dropped = 0
        self.changes = 0  # calls to hold or add (TranscriptBook.revision)

    def hold(self, epoch: int, scored: Iterable[tuple[bytes, int]]) -> None:
        """Take ``epoch``'s ``(node, score)`` pairs and hand nothing out: this epoch's scores have
        gone out already (held ones, at the report), so these wait for the next :meth:`add`."""
        self.changes += 1
        for node, score in scored:
            self._held.setdefault(node, []).append((epoch, score))

    def add(self, epoch: int, scored: Iterable[tuple[bytes, int]]) -> list[tuple[bytes, tuple[int, ...]]]:
        """Take ``epoch``'s ``(node, score)`` pairs; the nodes (ascending) whose held scores reach
        the minimum, with those scores (oldest first), which are no longer held."""
        self.hold(epoch, scored)
        out = []
        for node in sorted(self._held):
            kept = _kept(self._held[node], epoch)
            self.dropped += len(self._held[node]) - len(kept)
            if len(kept) >= self.minimum:
                out.append((node, tuple(s for _, s in kept)))
                del self._held[node]
            elif kept:
                self._held[node] = kept
            else:
                del self._held[node]
        return out

    def put_back(self, epoch: int, rows: Iterable[tuple[bytes, Sequence[int]]]) -> None:
        """Hold again ``rows`` (``(node, scores)`` as :meth:`add` handed them out for ``epoch``)
        that never reached the chain: it refused them because its epoch had ended before they came
        (scoring outlasted the epoch's last blocks). They are held as scores of ``epoch`` and go
        out with the next epoch's, within :data:`CARRY_EPOCHS` of it."""
        self.changes += 1
        for node, scores in rows:
            self._held[node] = [*((epoch, s) for s in scores), *self._held.get(node, ())]

    def held(self) -> int:
        return sum(map(len, self._held.values()))

    def ready(self, epoch: int) -> bool:
        """Would :meth:`add` of nothing in ``epoch`` hand a node's scores out (held ones that reach
        the minimum alone: put back, or held while the epoch's one submission went out)?"""
        return any(len(_kept(held, epoch)) >= self.minimum for held in self._held.values())


def _kept(held: Sequence[tuple[int, int]], epoch: int) -> list[tuple[int, int]]:
    """The ``(epoch, score)`` pairs of ``held`` still young enough in ``epoch`` (:data:`CARRY_EPOCHS`)."""
    return [(e, s) for e, s in held if e > epoch - CARRY_EPOCHS]


# --------------------------------------------------------------------------- persistence

_BOOK_PERSON = b"gt-book"
_BOOK_HEAD = b"\x93"  # msgpack: an array of 3 items ([version, checksum, body]), each packed as it is alone
_NIL = 0xC0  # msgpack's nil


def _checksum(body: bytes | memoryview) -> bytes:
    return crypto.blake2b(body, size=32, person=_BOOK_PERSON)


def _transcript_wire(t: Transcript, version: int = BOOK_VERSION) -> list[Any]:
    reply = pack(t.reply.to_wire())
    if len(reply) > MAX_REVEAL_BYTES:
        raise BookError(f"a transcript's reply takes {len(reply)} bytes, over a reveal's {MAX_REVEAL_BYTES}")
    out = [t.node_id, t.nonce, t.opening.encode(transcript=True), t.request_id, reply]
    return [*out, t.secret] if version > 2 else out


def _maybe(t: Transcript | None, version: int) -> list[Any] | None:
    return None if t is None else _transcript_wire(t, version)


def _entry_wire(value: bytes, e: _Entry, version: int) -> list[Any]:
    out = [value, e.received_ms, _maybe(e.transcript, version)]
    if version < 3:
        return out
    x = e.escrow
    held = None if x is None else [x.certified, x.points_raw, escrow.encode_shares(x.shares)]
    return [*out, held, _maybe(e.node, version)]


def _encode_book(b: TranscriptBook, limit: int, version: int = BOOK_VERSION) -> bytes:
    """``b`` in format ``version`` (1 only for a book with no rounds in progress, 2 only for one
    with no escrowed commitments, 3 only for one with no idle marks: the canonical check of an
    older file)."""
    sets = [[epoch, donor, s.void, [_entry_wire(v, e, version) for v, e in s.entries.items()]]
            for (epoch, donor), s in sorted(b._sets.items(), key=lambda kv: kv[0])]
    carry = [b.carry.dropped, [[n, [[e, x] for e, x in held]] for n, held in sorted(b.carry._held.items())]]
    pending = [[r, [[c.donor, c.node_id, _transcript_wire(c.transcript, version)] for c in b.pending[r]]]
               for r in sorted(b.pending)]
    items = [sets, sorted(b.burnt), [[d, c, v] for d, (c, v) in sorted(b.history.items())],
             [[k, n] for k, n in sorted(b.refused.items())], b.voided, carry, pending,
             [[d, n] for d, n in sorted(b.idle.items())]]
    body = pack(items[:{1: 6, 2: 7, 3: 7}.get(version, 8)])
    raw = _BOOK_HEAD + pack(version) + pack(_checksum(body)) + body
    if len(raw) > limit:
        raise BookError(f"the book takes {len(raw)} bytes, over the {limit} a saved book may take")
    return raw


def _decode_book(raw: bytes, limit: int) -> TranscriptBook:
    if type(raw) is not bytes:
        raise BookError("a saved book is bytes")
    if len(raw) > limit:
        raise BookError(f"{len(raw)} bytes, over the {limit} a saved book may take")
    r = codec.ShapeReader(raw, MAX_REVEAL_BYTES)  # no string or bytes in a book is longer than a reveal
    try:
        b, version = _read_book(r)
        if not r.done():
            raise BookError("trailing bytes after the book")
        canonical = _encode_book(b, limit, version) == raw
    except BookError:
        raise
    except codec.ShapeError as exc:
        raise BookError(f"not a saved book ({exc})") from None
    except TxError as exc:
        raise BookError(f"a transcript in it does not decode ({exc.reason})") from None
    except msgpack.OutOfData:
        raise BookError("cut short") from None
    except DECODE_ERRORS as exc:
        raise BookError(f"not a saved book (malformed msgpack: {type(exc).__name__})") from None
    if not canonical:
        raise BookError("not in canonical form (items out of order or repeated, or encoded wider than needed)")
    return b


def _read_book(r: codec.ShapeReader) -> tuple[TranscriptBook, int]:
    """The book of ``r`` and its format version, read by shape: every count checked before its
    items are read, the checksum before the body."""
    _shape(r, 3, "[version, checksum, body]")
    version = r.value()
    if type(version) is not int or not 1 <= version <= BOOK_VERSION:
        raise BookError(f"format version {version!r}; this verifier reads versions 1 to {BOOK_VERSION}")
    if r.value() != _checksum(memoryview(r.raw)[r.u.tell():]):
        raise BookError("its checksum does not match its content (damaged, or cut short)")
    b = TranscriptBook()
    if version == 1:
        _shape(r, 6, "[sets, burnt, history, refused, voided, carry]")
    elif version < 4:
        _shape(r, 7, "[sets, burnt, history, refused, voided, carry, pending]")
    else:
        _shape(r, 8, "[sets, burnt, history, refused, voided, carry, pending, idle]")
    for _ in range(_most(r, MAX_DONORS, "sets (one per donor and epoch)")):
        _read_set(r, b, version)
    b.burnt = {_exact(r.value(), NODE_ID_LEN, "a burnt donor") for _ in range(r.array())}
    for _ in range(r.array()):
        _shape(r, 3, "[donor, complete sets, void sets]")
        donor = _exact(r.value(), NODE_ID_LEN, "a donor of the history")
        b.history[donor] = (_count(r.value(), "complete sets"), _count(r.value(), "void sets"))
    if not b.burnt <= b.history.keys():
        raise BookError("a burnt donor has no history")
    for _ in range(_most(r, MAX_REFUSAL_KINDS, "kinds of refusal")):
        _shape(r, 2, "[refusal kind, count]")
        kind = _text(r.value(), MAX_REFUSAL_KIND, "a refusal kind")
        b.refused[kind] = _count(r.value(), "refusals")
    b.voided = _count(r.value(), "void sets")
    _read_carry(r, b.carry)
    if version > 1:
        _read_pending(r, b, version)
    if version > 3:
        for _ in range(r.array()):
            _shape(r, 2, "[donor, idle sets]")
            donor = _exact(r.value(), NODE_ID_LEN, "an idle donor")
            n = _count(r.value(), "idle sets")
            if n == 0 or donor in b.idle:
                raise BookError("an idle donor is marked 0 times or twice")
            b.idle[donor] = n
    return b, version


def _read_pending(r: codec.ShapeReader, b: TranscriptBook, version: int) -> None:
    for _ in range(_most(r, PENDING_ROUNDS, "rounds in progress")):
        _shape(r, 2, "[round, counted transcripts]")
        round_ = _typed(r.value(), int, "a round in progress")
        if round_ in b.pending:
            raise BookError("a round in progress stands twice")
        n = _most(r, MAX_PENDING, "counted transcripts of a round in progress")
        if not n:
            raise BookError("a round in progress holds no transcripts")
        held = b.pending[round_] = []
        for _ in range(n):
            _shape(r, 3, "[donor, node, transcript]")
            donor = _exact(r.value(), NODE_ID_LEN, "a counted transcript's donor")
            node = _exact(r.value(), NODE_ID_LEN, "a counted transcript's node")
            t = _read_transcript(r, version)
            if node != t.reply.served_by:
                raise BookError("a counted transcript is not counted for the node that signed its reply")
            held.append(Counted(donor, node, t))


def _read_set(r: codec.ShapeReader, b: TranscriptBook, version: int) -> None:
    _shape(r, 4, "[epoch, donor, void reason, commitments]")
    key = (_typed(r.value(), int, "an epoch"), _exact(r.value(), NODE_ID_LEN, "a donor"))
    if key in b._sets:
        raise BookError("a donor's set of one epoch stands twice")
    s = b._sets[key] = _Set(void=_text(r.value(), MAX_VOID_REASON, "a void reason"))
    for _ in range(_most(r, MAX_COMMITS, "commitments of one donor and epoch")):
        if version < 3:
            _shape(r, 3, "[commitment, received_ms, transcript or nil]")
        else:
            _shape(r, 5, "[commitment, received_ms, transcript or nil, escrow or nil, node's transcript or nil]")
        value = _exact(r.value(), COMMITMENT_LEN, "a commitment")
        if value in b._where:
            raise BookError("a commitment stands in two sets")
        entry = _Entry(_typed(r.value(), int, "a commitment's arrival time"), _read_optional(r, version))
        if version > 2:
            entry.escrow = _read_escrow(r)
            entry.node = _read_optional(r, version)
        for t in (entry.transcript, entry.node):
            if t is not None and t.commitment() != value:
                raise BookError("a revealed transcript does not open its commitment")
            if t is not None and (entry.escrow is None) != (not t.secret):
                raise BookError("a transcript carries a secret where its commitment is not escrowed, or none where "
                                "it is")
        if entry.node is not None and (entry.escrow is None or not entry.escrow.certified):
            raise BookError("a node's transcript stands for a commitment that is not certified and escrowed")
        s.entries[value] = entry
        b._where[value] = key


def _read_optional(r: codec.ShapeReader, version: int) -> Transcript | None:
    if r.head() == _NIL:
        r.value()
        return None
    return _read_transcript(r, version)


def _read_escrow(r: codec.ShapeReader) -> _Escrow | None:
    if r.head() == _NIL:
        r.value()
        return None
    _shape(r, 3, "[certified, points, shares]")
    certified = _typed(r.value(), bool, "an escrow's certified flag")
    points_raw = _typed(r.value(), bytes, "an escrow's points")
    try:
        shares = escrow.decode_shares(_typed(r.value(), bytes, "an escrow's shares"), escrow.MAX_UNITS)
    except escrow.EscrowError as exc:
        raise BookError(f"an escrow's shares do not decode ({exc.reason})") from None
    return _Escrow(points_raw, shares, certified)


def _read_transcript(r: codec.ShapeReader, version: int) -> Transcript:
    if version < 3:
        _shape(r, 5, "[node id, nonce, request, request id, reply]")
    else:
        _shape(r, 6, "[node id, nonce, request, request id, reply, secret]")
    node_id = _exact(r.value(), NODE_ID_LEN, "a transcript's node id")
    nonce = _exact(r.value(), NONCE_LEN, "a transcript's nonce")
    opening = Opening.decode(_typed(r.value(), bytes, "a transcript's request"), transcript=True)
    request_id = _exact(r.value(), REQUEST_ID_LEN, "a transcript's request id")
    reply = decode_outcome(_typed(r.value(), bytes, "a transcript's reply"), transcript=True)
    if not isinstance(reply, ReplyOutcome):
        raise BookError("a transcript's reply is a failure")
    secret = _typed(r.value(), bytes, "a transcript's secret") if version > 2 else b""
    if secret and len(secret) != escrow.SECRET_LEN:
        raise BookError(f"a transcript's secret is not {escrow.SECRET_LEN} bytes")
    return Transcript(node_id, nonce, opening, request_id, reply, secret)


def _read_carry(r: codec.ShapeReader, carry: ScoreCarry) -> None:
    _shape(r, 2, "[dropped, held scores]")
    carry.dropped = _count(r.value(), "dropped scores")
    for _ in range(r.array()):
        _shape(r, 2, "[node, [[epoch, score], ...]]")
        node = _exact(r.value(), NODE_ID_LEN, "a node of the held scores")
        held = []
        for _ in range(r.array()):
            _shape(r, 2, "[epoch, score]")
            held.append((_typed(r.value(), int, "a held score's epoch"), _typed(r.value(), int, "a held score")))
        if not held:
            raise BookError("a node is held with no scores")
        carry._held[node] = held


def _shape(r: codec.ShapeReader, n: int, what: str) -> None:
    if r.array() != n:
        raise BookError(f"not a saved book: an item is not {what}")


def _most(r: codec.ShapeReader, most: int, what: str) -> int:
    n = r.array()
    if n > most:
        raise BookError(f"{n} {what}, over the book's limit of {most}")
    return n


T = TypeVar("T")
_KINDS: dict[type, str] = {int: "an integer", bytes: "bytes", bool: "a boolean"}


def _typed(v: Any, tp: type[T], what: str) -> T:
    if type(v) is not tp:
        raise BookError(f"{what} is not {_KINDS[tp]}")
    return v


def _count(v: Any, what: str) -> int:
    if type(v) is not int or v < 0:
        raise BookError(f"a count of {what} is not an integer of at least 0")
    return v


def _exact(v: Any, n: int, what: str) -> bytes:
    if type(v) is not bytes or len(v) != n:
        raise BookError(f"{what} is not {n} bytes")
    return v


def _text(v: Any, most: int, what: str) -> str:
    if type(v) is not str or len(v) > most:
        raise BookError(f"{what} is not a string of at most {most} characters")
    return v
