"""``gentorrent bench audit-evasion``: can a cheating model node tell audit challenges from users'
requests, and does it get caught anyway? (issue 27 "Benchmark"; decision 0013; docs/benchmarks.md
"audit-evasion").

Nine parts, every one seeded (the same seeds give the same figures):

**A. Detectors.** One model node's view of a stream of requests, epoch after epoch: users'
requests (prompts from ``../shared/data/user-prompts.jsonl``, read at run time; sessions of
several requests per user over the user's own proxy paths, which live :data:`PATH_REFRESH_S`
seconds as :class:`overlay.anon.paths.PathManager` keeps them; the chat client's and the gateway's
parameters, defaults and user-set values) mixed with challenges, from the built-in generator
(:class:`verifier.audit.challenges.ChallengeGenerator`) or from donated prompts (users' own
requests, drawn from a donation pool as :mod:`verifier.audit.pool` draws: a donor first, each on a
network of its own). Every challenge goes out at a random height of the epoch's send window over
the paths its verifier's *persona* holds for the epoch (decisions 0026 and 0027,
``paths="script_personas"``: four
personas a verifier, each chosen uniformly for a challenge, each with one path set from its first
send to the epoch's end); a donated conversation is a script (decisions 0025 and 0027: what the
donor's client donates, its system prompt and latest 8 user turns), its user turns replayed one
after another, each after the node's own reply and a user's think time, cut where the next turn
no longer fits in the send window. Part B sends and signs the scripts' turns the same way. The file is split in
two halves by a seeded shuffle: this node's users write from one, donors from the other. What
the node sees of each request gives the features (:func:`observe`): how much of the last user
message the generator's public part lists cover (template), the parameters, whether its proxy
paths and proxies are new, whether its paths carried a challenge that an earlier report
revealed, the block height within the epoch, a conversation history this node never served,
the number of turns, a system prompt, and whether the prompt was seen before (by this node;
and, separately, by a node that remembers every prompt it or a colluder served: every donor's
original request). Detectors are scoring functions of those; the combined one is a logistic
regression (numpy) trained on one seed's stream (labels: what the reports reveal) and evaluated
on another's. AUC by Mann–Whitney (ties count half). What-ifs that are not decision 0013's
protocol are measured beside it (:func:`stream`'s ``paths``): donated conversations sent whole
over fresh paths (``fresh``, decision 0013 before 0025); their scripts with fresh paths for every
turn (``script``) or over one path set a script (``script_held``, decision 0025 before 0026);
challenge paths built once an epoch per verifier (``epoch``); donated conversations replayed turn
by turn with no send window (``replay``); and decision 0020's personas (``persona``, not built):
challenge traffic made exactly as users' traffic is (sessions over the whole epoch, of users'
lengths, timing and parameters), from donors' prompts, every persona path retired at its epoch's
end.

**B. Cheaters** against the real chain core (:mod:`verifier.audit.chain`: ``take`` of
:mod:`verifier.audit.tx` transactions signed by four equal-power validators with real Ed25519
keys, ``end_block`` every block; reply entries signed as a node signs replies,
:class:`overlay.anon.signing.ReplySigner`). Each reply's score is drawn from the engine's measured
per-reply scores (``simulations/data/audit_scores.json``) by the challenge's setting and the
kind of reply the cheater returns. A cheater is honest for :data:`WARMUP_EPOCHS` epochs (so it
starts trusted, the harder case), then cheats; the figure is the epochs from then until its
reputation is below the trust line.

**C. Honest nodes with faults** on the same chain for :data:`HONEST_EPOCHS` epochs: restarts,
busy answers, a flood. Each run is replayed with every faulty node replaced by a fault-free one
(the same random streams): an epoch in which any *other* node's reputation differs between the
two runs is an epoch one node's outcome changed another's.

**D. Cost** per verifier per audited node per epoch: challenges sent (tries included) and
replies scored, against main's protocol (the leader sends k = 3, every verifier rescores the
3 replies), in CPU seconds at the measured one-pass scoring time (docs/benchmarks.md "verify").

**Transcripts** (decision 0015; :class:`ChainRun`'s ``rho``). B and C are run again with users'
transcripts at each donation rate of :data:`RHOS` (rate 0: the figures above, unprefixed; others
under ``transcripts_rho{percent}_``): per node and epoch, :func:`user_requests` requests of its
users (drawn from its view's evaluation stream, with the detector's score), each committed with
probability ``rho`` when a donor's client may choose it (:func:`overlay.directory.transcripts.fits`), through
the real :class:`verifier.audit.transcripts.TranscriptBook` (commit, signed reply, reveal or "no
reply"; closed in the next epoch's report window, as the verifier's audit loop closes it: a
transcript counts one epoch after its request), each verifier scoring what rules 8 and 9 draw of
them with its own randomness within a budget of :data:`SCORING_THREADS` threads (decision 0033),
shared with the other honest nodes of a network of :data:`SCORING_NETWORK_NODES` (:meth:`ChainRun._others`;
a reply as long as the measured one when that ended early, else as the request's ``max_tokens``), and every validator's
:class:`verifier.audit.tx.TranscriptScores` taken by the chain after its report. What each node
serves its users: as it answers a challenge (a detecting cheater acts on its detector's flag of
the user's request: the selective one serves it honestly, the forwarder forwards it to the honest
peer, whose signed transcript counts for the peer, the aborter stays silent, which voids a
donor's set and, past the book's void budget, burns the donor), except the leaked cheater, whose
colluding verifier tells it when commitments arrive: it serves committed requests honestly (F
prices that).

**E. Framing** (:func:`framing`): an honest node facing one-shot framers, each identity committing
one request an epoch (at the setting where honest replies most often score low) and revealing it
only when it scores under τ (a withheld one voids the identity's set; the book burns it past its
void budget); a burnt identity is replaced by a fresh one. The figure is the smallest number of
identities per epoch that makes the victim untrusted within FRAMING_EPOCHS epochs in at least
FRAMING_SHARE of runs. Those are commitments without escrow; :func:`framing_escrowed` runs the
same framers against escrowed ones (decision 0037), the victim handing in what they withhold once
the shares are released RELEASE_BLOCKS into the next epoch (unless it is down until the close),
and beside a junk flood of JUNK_FLOODS withheld commitments an epoch from junk donors of
MAX_COMMITS each, where the verifiers' release (``escrow_intake.release_choice``, decision 0039)
decides which of theirs come out.

**F. Detecting transcripts** (:func:`committed_auc`, :func:`timing_leak`): the best challenge
detectors against users' committed requests, and a colluding verifier's timing leak (simulated,
seeded; the assumptions are the constants NETWORK_NODES, COMMIT_LEAD_S, LEAK_WINDOWS_S).

**G. Boosting** (:func:`boosting`, decision 0028): the cheater's own sybil users. Each cheater
that challenges alone miss has ``n`` registered user identities that commit BOOST_COMMITS
requests to it every epoch; it serves those honestly and they reveal every reply, so their
honest transcripts count beside its users'. The figure is the smallest ``n`` (BOOSTERS_GRID) that
keeps a cheater trusted past UNTRUSTED_WITHIN epochs in more than 1 − UNTRUSTED_SHARE_GOAL of
runs, with the verifiers' transcript scores as the plain mean (before decision 0028) and capped by
donor (:func:`verifier.audit.transcripts.capped_by_donor`, as built; every transcript run of B, C
and E uses it); 0 when the cheater escapes without boosters. Besides the rates of B, part G runs
at the low rates BOOSTING_LOW_RHOS, where a cheater's users hand in few sets an epoch and the cap,
which needs two of them, is set seldom.

**H. An operator's private prompts** (:func:`run_private`, decision 0030): the auditor's second
source, used when no donated prompt fits a node (``gentorrent verifier --challenge-prompts``).
The node does not hold the file, so what it can go by is how the prompts differ from its users'.
The bench's stand-in is the best case for the text (prompts of the users' own distribution: the
donors' half of the file) sent two ways: one user turn each, no system prompt (``private``: a
list of questions, as an operator would likely write one), or conversations of several user
turns, replayed as scripts (``private_scripts``: the donors' conversations); parameters are
:func:`verifier.audit.challenges.draw_params`'s either way. Part A's detectors for both, and
part B's detecting cheaters of both views on a chain of their own, challenges only.

**I. A network short of donations** (:func:`run_mixed`): a verifier falls back to the generator
for a node when its pool holds no donated prompt the node has not read, so a node's challenges
mix the two. At each of :data:`MIXED_SHARES` (the share donated: ``share * k`` of a verifier's
``k`` challenges to a node, the fraction a coin, as the planner spreads them, decision 0031), part
B's detecting cheaters flag every generated challenge (the template's public parts) and the donated
ones by the donated view's detector, on a chain of their own for each share, challenges only: as built, and at the
lowest shares with the what-if :func:`unrecognised_only` (a verifier scores the generated
challenges it sent a node as the mean of its other replies from that node).
"""

from __future__ import annotations

import json
import math
import random
import re
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from overlay.directory import escrow
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit import chain
from verifier.audit.escrow_intake import RELEASE_DELAY_MS
from verifier.audit.transcripts import MAX_PER_NODE, NODE_BUDGET, ROUND_BUDGET
from verifier.audit.tx import MAX_TURNS

REPO = Path(__file__).resolve().parents[2]
USER_PROMPTS = REPO.parent / "shared" / "data" / "user-prompts.jsonl"
SCORES_FILE = REPO / "simulations" / "data" / "audit_scores.json"
OTHER_ARITHMETIC_FILE = REPO / "simulations" / "data" / "honest_z_f32.json"  # honest, other arithmetic (0023)
SHORT_FILE = REPO / "simulations" / "data" / "honest_z_tokens4.json"  # honest 4-token replies (decision 0021)

# ----------------------------------------------------------------------------- the network's shape
VERIFIERS = 4  # equal power
BLOCK_S = 1.0  # seconds a block (CometBFT timeout_commit 1 s, docs/benchmarks.md "committee")
PATH_REFRESH_S = 15 * 60.0  # overlay.anon.paths.PathManager(refresh=...): a user's paths live this long
PATHS_PER_REQUEST = 4  # overlay.anon.client.AnonClient n = 4 of target 4 ready paths: every path, every request
RELAYS = 200  # proxies a path can end at (the region's user nodes)
# ----------------------------------------------------------------------------- users (assumptions)
USER_REQUESTS_PER_S = 0.2  # this node's users' requests a second (24 in a 120-block epoch, 180 in a 900-block one)
SESSION_MEAN = 3.0  # requests per session: 1 + geometric, this mean
THINK_MEAN_S = 45.0  # between a reply and the user's next request in a session
SHARE_CHAT = 0.5  # sessions from `gentorrent user chat` (else the gateway, an OpenAI client)
SHARE_GATEWAY_HISTORY = 0.7  # gateway sessions that send the conversation (a chat app); else one-shot calls
SHARE_USER_SET = 0.3  # users who set parameters themselves (else the client's defaults)
SHARE_CHAT_SYSTEM = 0.15  # chat users who pass --system
SHARE_GATEWAY_SYSTEM = 0.4  # gateway apps that send a system prompt
USER_SYSTEM_PROMPTS = ("You are a helpful assistant.", "You are a helpful assistant.", "You are a concise assistant.",
                       "Answer in English.", "You are an expert programmer.", "Be brief.",
                       "You are a friendly tutor who explains things simply.")
USER_TEMPERATURES = (0.0, 0.2, 0.3, 0.5, 0.7, 0.8, 1.0, 1.2)
USER_MAX_TOKENS = (64, 128, 256, 512, 1024)
AFFINITY = 0.9  # a follow-up reaches the node that answered the previous turn (chat's session affinity)
DONATE_RATE = 0.25  # user_client/donate.py --donate-rate
DONORS = 40  # users who donate (each with its own sessions, served elsewhere)
CHAT_TEMPERATURE, GATEWAY_TEMPERATURE, DEFAULT_MAX_TOKENS = 0.7, 1.0, 256  # the clients' defaults



def user_requests(epoch_s: float) -> int:
    """This node's users' requests in an epoch of ``epoch_s`` seconds."""
    return round(USER_REQUESTS_PER_S * epoch_s)


# ----------------------------------------------------------------------------- cheaters and faults
WARMUP_EPOCHS = 4  # honest epochs before a cheater starts cheating
UNTRUSTED_WITHIN = 5  # goal: untrusted within this many epochs of cheating ...
UNTRUSTED_SHARE_GOAL = 0.95  # ... in at least this share of runs
AUC_GOAL = 0.6
HONEST_EPOCHS = 100
RESTART_EVERY = 10  # a restart per this many epochs (silent for a random part of one epoch)
# the shares of epoch e's withheld escrowed commitments come out this far into e + 1 (decision 0037)
RELEASE_BLOCKS = round(RELEASE_DELAY_MS / 1000 / BLOCK_S)
# the bench deals each escrowed commitment to one unit: what the book checks of it (s·B = C_0, the
# nonce of s) is the same under any plan; checking shares is the intake's, measured by bench escrow
ESCROW_PLAN = escrow.plan([1], units=1)
BUSY_SHARE = 0.2
FLOOD_BUSY_SHARE = 0.9
SELECTIVE_TPRS = (0.5, 0.55, 0.6, 0.7, 0.8, 0.9, 0.95)  # shares of challenges a selective cheater wants to
# answer honestly (fine at the low end, where a near-chance detector makes the sweep matter; part B's
# 1 + 4 + 3 x (7 + 2) nodes are the 32 a verifier's plan holds at most)
MAX_FPR = 0.5  # ... while serving at least half of its users' requests cheaply (else it is no cheater)
# ----------------------------------------------------------------------------- transcripts (decision 0015)
RHOS = (0.0, 0.1, 0.25)  # donation rates: the share of users' requests committed and revealed (0: challenges only)
RHO_HONEST = 0.25  # part C and the committed-request AUC run at this rate
USER_RETRY_BLOCKS = 30  # a donor retries a committed request that got no reply at most this many blocks later
FRAMER_TAU = 750_000  # a one-shot framer reveals a reply only when it scores under this (reputation.TAU)
FRAMER_PARAMS = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=256, seed=None)  # the setting
# where honest replies most often score under FRAMER_TAU (t1.0: 4 of 24 measured replies, mean 0.686)
FRAMERS_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # framing identities per epoch, searched in order
# junk withheld commitments an epoch beside the framers: 2 and 8 times a release, and every donor
# slot a verifier's book has left (MAX_DONORS x MAX_COMMITS, less the epoch's other donors)
JUNK_FLOODS = (8192, 32768, 65536)
FRAMING_EPOCHS = 20  # ... the victim untrusted within this many epochs of framing ...
FRAMING_SHARE = 0.5  # ... in at least this share of runs
NETWORK_NODES = (10, 100)  # model nodes whose users' commitments a colluding verifier hears (timing leak)
COMMIT_LEAD_S = (0.3, 1.5)  # a commitment reaches the verifiers this long (uniform) before its request reaches
# the node: the client sends the request once its commitment is acknowledged (rule 1), over onion paths
AUC_DRAWS = 20  # coin draws the committed-request AUC is averaged over
LEAK_WINDOWS_S = (1.0, 2.0, 10.0)  # the node serves honestly what arrives within W s of any commitment
POOLED = True  # challenge replies capped by their pooled z per verifier and node (decision 0023)
BY_DONOR = True  # transcript scores capped by their donors' sets per verifier and node (decision 0028)
BUDGETED = True  # each verifier scores within its budget (rules 8 and 9, decision 0033); else every transcript
BOOST_COMMITS = MAX_PER_NODE  # requests a booster commits to its cheater an epoch (as many as count)
BOOSTERS_GRID = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # booster identities per cheating node, searched in order
BOOSTING_LOW_RHOS = (0.01, 0.02, 0.03, 0.05)  # part G also at these rates: where the users' sets a node gets an epoch are few
HONEST_KINDS = ("honest", "restart", "busy", "flood")  # behaviours that never cheat
MAIN_K = 3  # main's protocol: the leader sends k = 3 a node, every verifier rescores them
MAIN_EPOCH_BLOCKS = 120  # ... in epochs of this many blocks (decision 0010's default)
SCORE_S = 0.877  # docs/benchmarks.md "verify": one-pass scoring, 877 ms a verification
MEASURED_MAX_TOKENS = 128  # the scores file's replies were asked for this many tokens (its settings say so)
SCORING_NETWORK_NODES = 32  # rule 9 (decision 0033): a verifier's budget is shared among this many nodes: a run's
# and, up to this many, other honest ones (ChainRun._others; part B's 32; transcript-scoring's network)
SCORING_THREADS = -(-NODE_BUDGET * SCORING_NETWORK_NODES // ROUND_BUDGET)  # --audit-threads: a verifier's budget
# is ROUND_BUDGET times this; sized as docs/committee.md "Sizing a verifier" asks (NODE_BUDGET a node: 4 for 32
# nodes; decision 0036); the CLI's default of 1 thread is measured in docs/benchmarks.md (decisions 0034, 0035)


class BenchError(Exception):
    """A prerequisite is missing (the prompts file, the measured scores)."""


# ============================================================================= A. what a node sees


def load_user_prompts(path: Path = USER_PROMPTS) -> list[str]:
    """The users' prompts (docs: ../shared/data/README.md); never copied into the package."""
    if not path.is_file():
        raise BenchError(f"bench audit-evasion: {path} is missing: the users' prompts are read from "
                         f"../shared/data/user-prompts.jsonl next to the repository (see its README)")
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(str(json.loads(line)["prompt"]))
    if len(out) < 20:
        raise BenchError(f"bench audit-evasion: {path} holds {len(out)} prompts; at least 20 are needed")
    return out


def split_prompts(prompts: Sequence[str], seed: int) -> tuple[list[str], list[str]]:
    """Two disjoint halves by a seeded shuffle: (this node's users', donors')."""
    order = list(range(len(prompts)))
    random.Random(f"split/{seed}").shuffle(order)
    half = len(order) // 2
    return [prompts[i] for i in order[:half]], [prompts[i] for i in order[half:]]


@dataclass(frozen=True, slots=True)
class Timing:
    """An epoch's windows in blocks (decision 0013): commit, send, report."""

    epoch_blocks: int
    commit_blocks: int

    @property
    def report_blocks(self) -> int:
        return chain.AuditParams(epoch_blocks=self.epoch_blocks).report_blocks()  # the chain's own rule

    @property
    def send_first(self) -> int:  # offsets within the epoch, 0-based (offset o is height e*E + o + 1)
        return self.commit_blocks

    @property
    def send_last(self) -> int:
        return self.epoch_blocks - self.report_blocks - 1

    @property
    def epoch_s(self) -> float:
        return self.epoch_blocks * BLOCK_S


@dataclass(slots=True)
class Req:
    """One request as the model node sees it, with the truth the bench keeps beside it."""

    t: float
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    paths: tuple[int, ...]  # the ReturnPaths' proxy path ids (a path is named by its id at its proxy)
    proxies: tuple[int, ...]
    ident: int  # the prompt's identity (users' prompts never repeat; a retry repeats its challenge's)
    prev_reply: int  # the conversation's previous reply (0: no history)
    served_prev: bool  # this node served that reply
    source: str  # "user", or the challenge's source (SOURCES)
    user: int = -1  # the user who sent it (-1: a verifier)


@dataclass(slots=True)
class _User:
    kind: str  # "chat" | "gateway"
    params: SamplingParams
    system: str | None
    path_offset: float


def _user_params(rng: random.Random, kind: str) -> SamplingParams:
    if rng.random() >= SHARE_USER_SET:
        temp = CHAT_TEMPERATURE if kind == "chat" else GATEWAY_TEMPERATURE
        return SamplingParams(temperature=temp, top_p=1.0, top_k=0, max_tokens=DEFAULT_MAX_TOKENS, seed=None)
    temp = rng.choice(USER_TEMPERATURES) if rng.random() < 0.7 else (CHAT_TEMPERATURE if kind == "chat"
                                                                      else GATEWAY_TEMPERATURE)
    top_p = 1.0 if kind == "chat" or rng.random() < 0.7 else rng.choice((0.9, 0.95))
    max_tokens = rng.choice(USER_MAX_TOKENS) if rng.random() < 0.6 else DEFAULT_MAX_TOKENS
    seed = rng.randrange(1 << 31) if rng.random() < 0.3 else None
    return SamplingParams(temperature=float(temp), top_p=float(top_p), top_k=0, max_tokens=max_tokens, seed=seed)


class _Ids:
    """Fresh identities (paths, prompts, replies) shared by one stream."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


def _sessions(rng: random.Random, prompts: Sequence[str], ids: _Ids, duration_s: float, requests_per_s: float,
              n_users: int, served_here: bool, retire_s: float | None = None,
              source: str = "user") -> Iterator[Req]:
    """Users' requests over ``duration_s``: each user's sessions arrive as a Poisson process,
    each a conversation (history kept: chat always, the gateway's chat apps) or one-shot calls,
    over the user's paths (rebuilt every PATH_REFRESH_S; `user chat` builds fresh ones at start).
    ``served_here``: this node answers the sessions (else another node: donors' traffic).
    ``retire_s`` (the persona what-if): every path is also retired at each multiple of it (an
    epoch's end), so no path outlives the epoch it was built in; ``source``: the requests' label."""
    users = []
    for _ in range(n_users):
        kind = "chat" if rng.random() < SHARE_CHAT else "gateway"
        share = SHARE_CHAT_SYSTEM if kind == "chat" else SHARE_GATEWAY_SYSTEM
        system = rng.choice(USER_SYSTEM_PROMPTS) if rng.random() < share else None
        users.append(_User(kind, _user_params(rng, kind), system, rng.uniform(0, PATH_REFRESH_S)))
    session_rate = requests_per_s / SESSION_MEAN / n_users
    paths: dict[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def paths_of(u: int, gen: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if (u, gen) not in paths:
            paths[(u, gen)] = (tuple(ids() for _ in range(PATHS_PER_REQUEST)),
                               tuple(rng.randrange(RELAYS) for _ in range(PATHS_PER_REQUEST)))
        return paths[(u, gen)]

    out: list[Req] = []
    for u, user in enumerate(users):
        t = rng.expovariate(session_rate)
        while t < duration_s:
            n = 1
            while rng.random() > 1.0 / SESSION_MEAN:
                n += 1
            history = user.kind == "chat" or rng.random() < SHARE_GATEWAY_HISTORY
            start = t
            msgs: list[ChatMessage] = [ChatMessage("system", user.system)] if user.system else []
            prev, served_prev = 0, False
            gen_base = ids() if user.kind == "chat" else 0  # `user chat` starts with fresh paths
            for _ in range(n):
                gen = int((t - (start if user.kind == "chat" else -user.path_offset)) // PATH_REFRESH_S)
                if retire_s is not None:
                    gen = gen * 1_000_000 + int(t // retire_s)
                p, x = paths_of(u, gen_base * 1_000_000_000_000 + gen)
                text = rng.choice(prompts)
                if not history:
                    msgs = [ChatMessage("system", user.system)] if user.system else []
                    prev, served_prev = 0, False
                msgs.append(ChatMessage("user", text))
                out.append(Req(t, tuple(msgs), user.params, p, x, ids(), prev, served_prev, source, u))
                reply = ids()
                msgs.append(ChatMessage("assistant", f"(reply {reply})"))
                prev = reply
                served_prev = served_here and rng.random() < AFFINITY
                t += rng.expovariate(1.0 / THINK_MEAN_S) + 10.0
            t += rng.expovariate(session_rate)
    return iter(sorted(out, key=lambda r: r.t))


@dataclass(slots=True)
class Donation:
    donor: int
    messages: tuple[ChatMessage, ...]  # the conversation as the donor sent it (the what-ifs send this)
    params: SamplingParams
    ident: int
    script: tuple[ChatMessage, ...] = ()  # what the donor's client donates (user_client/donate.py fit)


def _donated(messages: tuple[ChatMessage, ...], params: SamplingParams) -> tuple[ChatMessage, ...] | None:
    """What a donor's client donates of a request (:func:`overlay.directory.donation.donated_messages`:
    the system prompt and the latest user turns, no replies), if the pool takes it as a script; else
    ``None``."""
    from overlay.directory.donation import donated_messages
    from overlay.directory.registration import TxError
    from verifier.audit import tx as at

    msgs = donated_messages(messages)
    if msgs is None:
        return None
    try:
        at.Opening(bytes(16), "m", at.script_of(tuple(msgs)), params).check_script()
    except TxError:
        return None
    return tuple(msgs)


class DonationPool:
    """Donors' requests (served by other nodes: the pool never draws a prompt for a node its donor
    names as having read it, decision 0029), each donated with probability DONATE_RATE when it
    passes an opening's limits; drawn as verifier/audit/pool.py draws: a donor uniformly among
    those with unused prompts (the pool draws a network first, then a donor: the bench's donors
    are each on a network of their own), then one of its prompts uniformly, used once."""

    def __init__(self, rng: random.Random, prompts: Sequence[str], ids: _Ids, needed: int) -> None:
        self.rng = rng
        self.by_donor: dict[int, list[Donation]] = {}
        self.served: set[int] = set()  # identities of every donor request (a colluder may have served each)
        while sum(map(len, self.by_donor.values())) < needed:  # an hour of the donors' traffic at a time
            for r in _sessions(rng, prompts, ids, 3600.0, 8.0 / 3600.0 * DONORS, DONORS, served_here=False):
                self.served.add(r.ident)
                if rng.random() < DONATE_RATE and (script := _donated(r.messages, r.params)) is not None:
                    self.by_donor.setdefault(r.user, []).append(Donation(r.user, r.messages, r.params, r.ident,
                                                                         script))

    def draw(self) -> Donation:
        donors = [d for d, left in self.by_donor.items() if left]
        if not donors:
            raise BenchError("bench audit-evasion: the donation pool ran dry")
        d = self.rng.choice(sorted(donors))
        left = self.by_donor[d]
        return left.pop(self.rng.randrange(len(left)))


def _challenge_prompt(source: str, gen: Any, pool: DonationPool | None, corpus: Sequence[str] = (),
                      ) -> tuple[tuple[ChatMessage, ...], SamplingParams, int, int, tuple[ChatMessage, ...]]:
    """(messages, params, identity, previous reply, script) of one fresh challenge from ``source``
    (:data:`SOURCES`; "private" draws one user turn of ``corpus``)."""
    from verifier.audit.challenges import draw_params

    if source == "generator":
        p = gen.prompt()
        return tuple(p.messages), p.params, -1, 0, tuple(p.messages)
    if source == "private":  # an operator's one-turn prompt, with parameters as the auditor draws them
        msgs = (ChatMessage("user", gen.rng.choice(corpus)),)
        return msgs, draw_params(gen.rng), -1, 0, msgs
    assert pool is not None
    d = pool.draw()  # a donation carries its own parameters (decision 0013 §3)
    prev = 0
    for m in reversed(d.messages):
        if m.role == "assistant":
            prev = int(m.content.split()[1].rstrip(")"))
            break
    if source == "private_scripts":  # an operator's conversation: parameters drawn by the auditor (decision 0030)
        return d.messages, draw_params(gen.rng), d.ident, prev, d.script
    return d.messages, d.params, d.ident, prev, d.script


def stream(seed: int, source: str, epochs: int, timing: Timing, k: int, user_prompts: Sequence[str],
           donor_prompts: Sequence[str], paths: str = "fresh",
           user_rate_s: float | None = None, personas_per_verifier: int | None = None,
           ) -> tuple[list[Req], set[int]]:
    """One node's view over ``epochs`` epochs: its users' requests and the first try of every
    challenge of ``source`` (:data:`SOURCES`), in time order; and the identities of every donor
    request (what a node that remembers every prompt a colluder served knows; none for an
    operator's private prompts, which no node served before).

    ``paths``: "script_personas" (as built: decision 0026, every challenge over the paths one of its
    verifier's ``personas_per_verifier`` personas (default: as the auditor,
    :func:`verifier.audit.auditor.persona_count`) holds for the epoch; donated ones as scripts,
    decision 0025), "fresh" (decision 0013: every challenge over newly built paths), or a what-if:
    "epoch" (each verifier builds fresh paths once an epoch and sends all its challenges of the
    epoch over them) or "replay" (donated prompts only: a donated conversation is replayed turn by
    turn over one set of fresh paths, each turn after the node's reply to the previous one, as
    its user sent it; every turn is a challenge)."""
    from verifier.audit.auditor import persona_count
    from verifier.audit.challenges import ChallengeGenerator

    rng = random.Random(f"stream/{seed}/{source}")
    n_personas = persona_count(k) if personas_per_verifier is None else personas_per_verifier
    ids = _Ids()
    duration = epochs * timing.epoch_s
    rate = USER_REQUESTS_PER_S if user_rate_s is None else user_rate_s
    users = list(_sessions(random.Random(f"users/{seed}"), user_prompts, ids, duration, rate, 60, served_here=True))
    n_challenges = epochs * VERIFIERS * k
    personas = paths.startswith("persona") and source == "donated"
    scripted = source in ("donated", "private_scripts")  # conversations of several user turns
    pool = DonationPool(random.Random(f"donors/{seed}"), donor_prompts, ids, n_challenges) \
        if scripted and not personas else None
    gen = ChallengeGenerator(rng=random.Random(f"gen/{seed}"), urandom=random.Random(f"salt/{seed}").randbytes)
    if paths not in ("fresh", "script", "script_held", "script_personas", "epoch", "replay", "persona"):
        raise ValueError(f"paths must be 'fresh', 'script', 'script_held', 'script_personas', 'epoch', 'replay' or "
                         f"'persona', not {paths!r}")
    if personas:
        # Verifiers' personas: challenge traffic made as users' is (donors' conversations sent turn
        # by turn as sessions of user-like clients, their timing, parameters and paths, spread over
        # the whole epoch), every persona path retired at its epoch's end, before the reports
        chs = list(_sessions(random.Random(f"personas/{seed}"), donor_prompts, ids, duration,
                             VERIFIERS * k / timing.epoch_s, PERSONAS, served_here=True,
                             retire_s=timing.epoch_s, source=source))
        # donors' conversations: a colluder that served the originals knows every one
        return sorted(users + chs, key=lambda r: r.t), {r.ident for r in chs}
    chs = []
    known: set[int] = set()  # scripts' earlier turns: donors' requests too
    for e in range(epochs):
        kept = [(tuple(ids() for _ in range(PATHS_PER_REQUEST)),
                 tuple(rng.randrange(RELAYS) for _ in range(PATHS_PER_REQUEST))) for _ in range(VERIFIERS)]
        held: dict[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}  # (verifier, persona): its paths
        for i in range(VERIFIERS * k):
            off = rng.randint(timing.send_first, timing.send_last)
            t = e * timing.epoch_s + (off + rng.random()) * BLOCK_S
            msgs, params, ident, prev, donated = _challenge_prompt(source, gen, pool, donor_prompts)
            p, x = kept[i // k] if paths == "epoch" else (tuple(ids() for _ in range(PATHS_PER_REQUEST)),
                                                          tuple(rng.randrange(RELAYS) for _ in range(PATHS_PER_REQUEST)))
            if paths == "script_personas":  # the verifier's persona's paths of this epoch
                p, x = held.setdefault((i // k, rng.randrange(n_personas)), (p, x))
            if paths in ("script", "script_held", "script_personas") and scripted:
                # decision 0025 as built: the donated conversation's script (its user turns, the
                # donor's replies dropped), each turn after the node's own reply a think time later,
                # cut where the next turn no longer fits in the send window; each turn over freshly
                # built paths ("script"), the first turn's ("script_held") or, as built (decision
                # 0026), its persona's ("script_personas")
                script = list(donated)  # the donation: system prompt, then the latest user turns
                users_at = [j for j, m in enumerate(script) if m.role == "user"][:MAX_SCRIPT_TURNS]
                before, end = 0, e * timing.epoch_s + (timing.send_last + 1) * BLOCK_S
                for n, j in enumerate(users_at):
                    last = n == len(users_at) - 1
                    turn_id = ident if last else ids()
                    known.add(turn_id)  # every turn is a donor's request a colluder may have served
                    chs.append(Req(t, tuple(script[:j + 1]), params, p, x, turn_id, before, before != 0, source))
                    before = ids()
                    t += rng.expovariate(1.0 / THINK_MEAN_S) + 10.0
                    if t >= end:
                        break
                    if paths == "script":
                        p = tuple(ids() for _ in range(PATHS_PER_REQUEST))
                        x = tuple(rng.randrange(RELAYS) for _ in range(PATHS_PER_REQUEST))
                continue
            if paths == "replay" and source == "donated":
                turns = [j for j, m in enumerate(msgs) if m.role == "user"]
                before = 0
                for n, j in enumerate(turns):
                    last = n == len(turns) - 1
                    chs.append(Req(t, msgs[:j + 1], params, p, x, ident if last else ids(), before, before != 0,
                                   source))
                    before = ids()
                    t += rng.expovariate(1.0 / THINK_MEAN_S) + 10.0
                continue
            chs.append(Req(t, msgs, params, p, x, ident if ident >= 0 else ids(), prev, False, source))
    # an operator's private conversations were never sent to any node: nothing to remember
    memory = pool.served | known if pool and source == "donated" else set()
    return sorted(users + chs, key=lambda r: r.t), memory


# ----------------------------------------------------------------------------- features


def _segments() -> list[str]:
    """The fixed pieces of the generator's public part lists (templates split at their holes)."""
    from verifier.audit import challenges

    pieces: set[str] = set()
    lists: list[Sequence[str]] = list(getattr(challenges, "PARTS", ()))
    for name in ("SYSTEM_PROMPTS",):
        lists.append(getattr(challenges, name, ()))
    for part in lists:
        for s in part:
            for piece in str(s).split("{}"):
                piece = piece.strip()
                if len(piece) >= 3:
                    pieces.add(piece)
    return sorted(pieces, key=lambda p: (-len(p), p))


class TemplateMatcher:
    """Share of a text's non-space characters covered by the generator's public parts."""

    def __init__(self) -> None:
        segs = _segments()
        self.rx = re.compile("(?<!\\w)(?:" + "|".join(re.escape(s) for s in segs) + ")(?!\\w)") if segs else None

    def __call__(self, text: str) -> float:
        total = sum(not c.isspace() for c in text)
        if not total or self.rx is None:
            return 0.0
        covered = sum(sum(not c.isspace() for c in m.group(0)) for m in self.rx.finditer(text))
        return covered / total


FEATURES = ("template", "params", "path_novelty", "proxy_novelty", "revealed_paths", "time", "orphan_history",
            "turns", "system_prompt", "seen_before", "seen_before_all")
PATH_AGE = "path_age"  # the persona what-if's extra feature (after FEATURES)


def _params_key(p: SamplingParams) -> tuple[float, float, int, int, bool]:
    return (round(p.temperature, 2), round(p.top_p, 3), p.top_k, p.max_tokens, p.seed is None)


@dataclass
class Observed:
    """Features of every request of a stream (one row each, :data:`FEATURES` order; "params" and
    "time" are filled in by :func:`matrix` from ``keys`` and ``offsets``)."""

    rows: list[list[float]] = field(default_factory=list)
    keys: list[tuple[float, float, int, int, bool]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    label: list[int] = field(default_factory=list)  # 1 challenge, 0 user
    reqs: list[Req] = field(default_factory=list)


def observe(reqs: Sequence[Req], donor_served: set[int], timing: Timing, match: TemplateMatcher,
            path_age: bool = False) -> Observed:
    """What the node derives from each request, given everything it saw before it; ``path_age``:
    one more column (:data:`PATH_AGE`), the log of how long this node has seen the request's
    paths. An epoch's challenges are revealed at its end (decision 0013)."""
    out = Observed()
    first_seen: dict[int, float] = {}
    seen_paths: set[int] = set()
    proxy_last: dict[int, float] = {}
    seen: set[int] = set()
    revealed: set[int] = set()  # paths that carried a challenge an epoch's reports revealed
    pending: dict[int, list[int]] = {}  # epoch -> paths of its challenges (revealed at its end)
    for r in reqs:
        epoch = int(r.t // timing.epoch_s)
        for e in [e for e in pending if e < epoch]:
            revealed.update(pending.pop(e))
        last_user = next(m.content for m in reversed(r.messages) if m.role == "user")
        path_new = sum(p not in seen_paths for p in r.paths) / len(r.paths)
        proxy_new = sum(r.t - proxy_last.get(x, -math.inf) > PATH_REFRESH_S for x in r.proxies) / len(r.proxies)
        orphan = 1.0 if r.prev_reply and not r.served_prev else 0.0
        turns = math.log1p(sum(m.role == "user" for m in r.messages))
        system = 1.0 if r.messages[0].role == "system" else 0.0
        s_before = 1.0 if r.ident in seen else 0.0
        s_all = 1.0 if (r.ident in seen or r.ident in donor_served) else 0.0
        shown = sum(p in revealed for p in r.paths) / len(r.paths)
        out.rows.append([match(last_user), 0.0, path_new, proxy_new, shown, 0.0, orphan, turns, system, s_before,
                         s_all])
        if path_age:
            out.rows[-1].append(math.log1p(statistics.fmean(r.t - first_seen.get(p, r.t) for p in r.paths)))
            for p in r.paths:
                first_seen.setdefault(p, r.t)
        out.keys.append(_params_key(r.params))
        out.offsets.append(int(r.t / BLOCK_S) % timing.epoch_blocks)
        out.label.append(0 if r.source == "user" else 1)
        out.reqs.append(r)
        seen_paths.update(r.paths)
        for x in r.proxies:
            proxy_last[x] = r.t
        seen.add(r.ident)
        if r.source != "user":
            pending.setdefault(epoch, []).extend(r.paths)
    return out


class LikelihoodRatio:
    """log P(x | challenge) / P(x | user) of a discrete observation, fitted on counts (add-½)."""

    def __init__(self, xs: Sequence[Any], labels: Sequence[int]) -> None:
        self.c: dict[Any, int] = {}
        self.u: dict[Any, int] = {}
        for x, y in zip(xs, labels, strict=True):
            d = self.c if y else self.u
            d[x] = d.get(x, 0) + 1
        self.nc, self.nu = sum(self.c.values()), sum(self.u.values())
        self.k = len(set(self.c) | set(self.u)) + 1

    def __call__(self, x: Any) -> float:
        pc = (self.c.get(x, 0) + 0.5) / (self.nc + 0.5 * self.k)
        pu = (self.u.get(x, 0) + 0.5) / (self.nu + 0.5 * self.k)
        return math.log(pc / pu)


def matrix(obs: Observed, params_lr: LikelihoodRatio, timing: Timing) -> np.ndarray[Any, Any]:
    """The feature matrix: the parameters' fitted log ratio, and for the time whether the request
    came in the epoch's send window (the windows are public: the chain's /audit says them)."""
    m = np.array(obs.rows, dtype=np.float64)
    m[:, FEATURES.index("params")] = [params_lr(k) for k in obs.keys]
    m[:, FEATURES.index("time")] = [float(timing.send_first <= o <= timing.send_last) for o in obs.offsets]
    return m


def auc(scores: np.ndarray[Any, Any], labels: np.ndarray[Any, Any]) -> float:
    """ROC AUC by Mann–Whitney: P(challenge scores above a user request) + ½ P(tie)."""
    pos, neg = int(labels.sum()), int(len(labels) - labels.sum())
    if not pos or not neg:
        return math.nan
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), dtype=np.float64)
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2.0 + 1.0
        i = j + 1
    r = np.empty_like(ranks)
    r[order] = ranks
    return float((r[labels == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


class Logistic:
    """Logistic regression (Newton steps, a small L2 penalty) on standardised features."""

    def __init__(self, x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], l2: float = 1e-2, steps: int = 30) -> None:
        self.mu = x.mean(axis=0)
        self.sd = x.std(axis=0)
        self.sd[self.sd == 0] = 1.0
        z = np.hstack([np.ones((len(x), 1)), (x - self.mu) / self.sd])
        w = np.zeros(z.shape[1])
        pen = l2 * np.eye(z.shape[1])
        pen[0, 0] = 0.0
        # balance the classes: each carries half the weight
        wt = np.where(y == 1, 0.5 / max(1, int(y.sum())), 0.5 / max(1, int(len(y) - y.sum())))
        for _ in range(steps):
            p = 1.0 / (1.0 + np.exp(-(z @ w)))
            g = z.T @ (wt * (p - y)) + pen @ w
            h = (z * (wt * p * (1 - p))[:, None]).T @ z + pen
            step = np.linalg.solve(h, g)
            w -= step
            if float(np.abs(step).max()) < 1e-9:
                break
        self.w = w

    def __call__(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        z = (x - self.mu) / self.sd
        return np.asarray(self.w[0] + z @ self.w[1:])


SINGLE = ("template", "params", "seen_before", "seen_before_all", "path_novelty", "proxy_novelty",
          "revealed_paths", "time", "orphan_history", "turns", "system_prompt")
COMBINED = {"combined": [f for f in FEATURES if f != "seen_before_all"], "combined_all": list(FEATURES)}
MEMORY = ("seen_before_all", "combined_all")  # detectors that use a colluder's memory of donors' requests
WHATIF = ("path_novelty", "revealed_paths", "combined")  # detectors reported for the per-epoch paths what-if
WHATIF_REPLAY = ("path_novelty", "orphan_history", "turns", "combined")  # ... and for the replay what-if
WHATIF_PERSONA = ("path_novelty", "path_age", "proxy_novelty", "revealed_paths", "time", "turns", "params",
                  "combined", "combined_all")  # the personas what-ifs' detectors reported
PERSONAS = 60  # user-like clients the verifiers run between them in the persona what-ifs (as many as the users)
MAX_SCRIPT_TURNS = MAX_TURNS  # a script's user turns (decisions 0025 and 0027)


@dataclass
class View:
    """One adversary's detector on a test stream: its scores of every challenge (with the
    challenge) and of every user request."""

    name: str
    detector: str
    auc: float
    challenges: list[tuple[Req, float]]
    users: np.ndarray[Any, Any]
    user_reqs: list[Req] = field(default_factory=list)  # the users' requests ``users`` scores, in order
    # part I: the built-in generator's challenges (flagged with certainty), sent for the part of a
    # node's challenges ``share`` leaves, ``share * k`` a verifier spread as the planner spreads them
    generated: list[tuple[Req, float]] = field(default_factory=list)
    share: float = 1.0


def detectors(train: tuple[list[Req], set[int]], test: tuple[list[Req], set[int]], timing: Timing,
              match: TemplateMatcher, path_age: bool = False,
              ) -> tuple[dict[str, float], dict[str, np.ndarray[Any, Any]], Observed]:
    """Every detector's AUC on ``test``, fitted on ``train``; and each detector's test scores.
    ``path_age``: with :data:`PATH_AGE` as one more feature, alone and in the combinations."""
    o_tr = observe(*train, timing, match, path_age)
    o_te = observe(*test, timing, match, path_age)
    y_tr, y_te = np.array(o_tr.label), np.array(o_te.label)
    p_lr = LikelihoodRatio(o_tr.keys, o_tr.label)
    x_tr, x_te = matrix(o_tr, p_lr, timing), matrix(o_te, p_lr, timing)
    names = (*FEATURES, PATH_AGE) if path_age else FEATURES
    combined = {k: [*v, PATH_AGE] if path_age else v for k, v in COMBINED.items()}
    scores: dict[str, np.ndarray[Any, Any]] = {}
    for name in (*SINGLE, PATH_AGE) if path_age else SINGLE:  # the attacker orients each feature as training shows
        col = names.index(name)
        sign = -1.0 if auc(x_tr[:, col], y_tr) < 0.5 else 1.0
        scores[name] = sign * x_te[:, col]
    for name, cols in combined.items():
        idx = [names.index(c) for c in cols]
        model = Logistic(x_tr[:, idx], y_tr)
        scores[name] = model(x_te[:, idx])
    return {n: auc(s, y_te) for n, s in scores.items()}, scores, o_te


def views(source: str, aucs: dict[str, float], scores: dict[str, np.ndarray[Any, Any]],
          obs: Observed) -> list[View]:
    """The adversaries' best detectors for a challenge source: without a colluder's memory, and
    (donated prompts) with it."""
    y = np.array(obs.label)
    out = []
    variants = [(source, [d for d in aucs if d not in MEMORY])]
    if source == "donated":
        variants.append(("donated_colluder", list(aucs)))
    for name, allowed in variants:
        best = max(allowed, key=lambda d: (aucs[d], d))
        s = scores[best]
        chs = [(r, float(v)) for r, v, lab in zip(obs.reqs, s, y, strict=True) if lab == 1]
        out.append(View(name, best, aucs[best], chs, s[y == 0], [r for r, lab in zip(obs.reqs, y, strict=True)
                                                                 if lab == 0]))
    return out


def flag_rule(view: View, tpr: float) -> tuple[float, float, float]:
    """The threshold at which ``view``'s detector flags a ``tpr`` share of challenges:
    (threshold, probability of flagging a score equal to it, the share of users' requests it
    flags then)."""
    ch = np.sort(np.array([s for _, s in view.challenges]))[::-1]
    n = len(ch)
    want = min(n, max(0.0, tpr * n))
    thr = float(ch[min(n - 1, max(0, math.ceil(want) - 1))])
    above = float((ch > thr).sum())
    ties = float((ch == thr).sum())
    rho = min(1.0, max(0.0, (want - above) / ties)) if ties else 0.0
    u = view.users
    fpr = float(((u > thr).sum() + rho * (u == thr).sum()) / max(1, len(u)))
    return thr, rho, fpr


# ============================================================================= B/C. the chain

CHAIN_ID = "gt-bench-audit"
MODEL = "smollm2-135m-instruct"
T0 = 1_800_000_000  # block time of height 0 (s); height h has time T0 + h


class ScoreTable:
    """The engine's measured per-reply two-sided scores (``samples[setting][kind]``), drawn by the
    challenge's setting: the measured setting nearest its (temperature, top-p)."""

    def __init__(self, path: Path | None = None, doc: dict[str, Any] | None = None) -> None:
        """From ``path`` (default :data:`SCORES_FILE`), or from ``doc``, a document of its form."""
        if doc is None:
            path = path or SCORES_FILE
            if not path.is_file():
                raise BenchError(f"bench audit-evasion: {path} is missing: measure it with "
                                 "`python -m simulations.measure_audit_scores`")
            doc = json.loads(path.read_text())
        self.samples: dict[str, dict[str, list[int]]] = {}
        self.zs: dict[str, dict[str, list[float]]] = {}  # each sample's z (pooled per node, decision 0023)
        self.transcript_samples: dict[str, dict[str, list[int]]] = {}  # the same replies as transcripts
        self.transcript_zs: dict[str, dict[str, list[float]]] = {}  # ... and their z, weighted as a transcript's
        self.tokens: dict[str, dict[str, list[int]]] = {}  # ... and their lengths (reply tokens)
        self.caps: dict[str, int] = {}  # each setting's max_tokens when it was measured
        self.settings: dict[str, tuple[float, float]] = {}
        from verifier.audit.reputation import to_fixed
        from verifier.audit.scoring import length_weighted, transcript_z

        named = doc.get("settings")
        for setting, kinds in doc["samples"].items():
            if isinstance(named, dict) and isinstance(named.get(setting), dict):
                self.settings[setting] = (float(named[setting]["temperature"]), float(named[setting]["top_p"]))
            else:
                self.settings[setting] = self._parse(setting)
            self.samples[setting] = {k: [to_fixed(float(r["score"])) for r in rows] for k, rows in kinds.items()}
            self.zs[setting] = {k: [float(r["z"]) for r in rows] for k, rows in kinds.items()}
            self.transcript_samples[setting] = {  # weighted by length as the verifier weighs a transcript
                k: [to_fixed(length_weighted(float(r["score"]), int(r["tokens"]))) for r in rows]
                for k, rows in kinds.items()}
            self.transcript_zs[setting] = {k: [transcript_z(float(r["z"]), int(r["tokens"])) for r in rows]
                                           for k, rows in kinds.items()}
            self.tokens[setting] = {k: [int(r["tokens"]) for r in rows] for k, rows in kinds.items()}
            self.caps[setting] = int(named[setting].get("max_tokens", MEASURED_MAX_TOKENS)) if isinstance(
                named, dict) and isinstance(named.get(setting), dict) else MEASURED_MAX_TOKENS
        self.kinds = sorted({k for kinds in self.samples.values() for k in kinds})
        self.measured = str(doc.get("measured", "?"))
        self.how = str(doc.get("how", ""))

    @classmethod
    def honest_only(cls, path: Path) -> ScoreTable:
        """The honest replies of a ``measure_honest_z`` file (``samples[setting]`` rows) as the
        ``honest`` kind of a table: an honest node whose replies were measured there (decision
        0023: the verifier's weights computed in float32, another engine's arithmetic)."""
        if not path.is_file():
            raise BenchError(f"bench audit-evasion: {path} is missing: measure it with "
                             "`python -m simulations.measure_honest_z --node-weights F32 --out` that file")
        src = json.loads(path.read_text())
        return cls(doc={"samples": {s: {"honest": rows} for s, rows in src["samples"].items()},
                        "settings": src["settings"], "measured": src.get("measured"), "how": src.get("how")})

    @staticmethod
    def _parse(name: str) -> tuple[float, float]:
        if name == "greedy":
            return 0.0, 1.0
        m = re.fullmatch(r"t([0-9.]+)(?:p([0-9.]+))?", name)
        if not m:
            raise BenchError(f"bench audit-evasion: unknown setting {name!r} in {SCORES_FILE.name}")
        return float(m.group(1)), float(m.group(2) or 1.0)

    def setting(self, p: SamplingParams) -> str:
        """The measured setting nearest ``p`` (greedy only for greedy-like temperatures)."""
        def dist(s: str) -> float:
            t, tp = self.settings[s]
            return abs(t - p.temperature) + abs(tp - p.top_p)
        return min(sorted(self.settings), key=dist)

    def draw(self, setting: str, kind: str, rng: random.Random) -> int:
        """A measured reply's score."""
        rows = self.samples[setting][kind]
        return rows[rng.randrange(len(rows))]

    def draw_transcript(self, setting: str, kind: str, rng: random.Random, max_tokens: int) -> tuple[int, float, int]:
        """A measured reply as a transcript of a request asking for ``max_tokens``: its score and
        ``z`` weighted by its length (decisions 0021, 0028), and the reply's length in tokens
        (:func:`reply_tokens`)."""
        i = rng.randrange(len(self.transcript_samples[setting][kind]))
        return (self.transcript_samples[setting][kind][i], self.transcript_zs[setting][kind][i],
                reply_tokens(self.tokens[setting][kind][i], self.caps[setting], max_tokens))

    def draw_reply(self, setting: str, kind: str, rng: random.Random) -> tuple[int, float]:
        """A measured challenge reply's score and its ``z`` (the same draw as :meth:`draw`)."""
        i = rng.randrange(len(self.samples[setting][kind]))
        return self.samples[setting][kind][i], self.zs[setting][kind][i]


def reply_tokens(measured: int, measured_cap: int, max_tokens: int) -> int:
    """The length of a reply to a request asking for ``max_tokens``, from a measured reply of
    ``measured`` tokens under a cap of ``measured_cap``: the measured length when the reply ended
    before its cap, else the request's whole ``max_tokens`` (a reply that ran to its cap is taken
    to run to any cap: the dearest case for a verifier's scoring budget, rule 9)."""
    return min(measured, max_tokens) if measured < measured_cap else max_tokens


class ShortReplies:
    """Honest replies a framer gets when it asks for ``max_tokens`` = 4 (decision 0021): measured by
    ``python -m simulations.measure_honest_z --max-tokens 4`` (:data:`SHORT_FILE`), drawn at T = 1.0;
    ``weighted``: scored as the verifier scores a transcript (by length), else as before it did."""

    def __init__(self, weighted: bool, path: Path | None = None) -> None:
        from verifier.audit.reputation import to_fixed
        from verifier.audit.scoring import length_weighted, transcript_z

        path = path or SHORT_FILE
        if not path.is_file():
            raise BenchError(f"bench audit-evasion: {path} is missing: measure it with "
                             "`python -m simulations.measure_honest_z --prompts 24 --replies 4 --max-tokens 4 "
                             f"--out {path}`")
        rows = json.loads(path.read_text())["samples"]["t1.0"]
        self.rows = [to_fixed(length_weighted(r["score"], r["tokens"]) if weighted else r["score"]) for r in rows]
        self.zs = [transcript_z(float(r["z"]), int(r["tokens"])) if weighted else float(r["z"]) for r in rows]
        self.tokens = [int(r["tokens"]) for r in rows]

    def setting(self, params: SamplingParams) -> str:
        return "t1.0"

    def draw_transcript(self, setting: str, kind: str, rng: random.Random, max_tokens: int) -> tuple[int, float, int]:
        """As :meth:`ScoreTable.draw_transcript`; the length is the measured one (the framers ask for 4 tokens)."""
        assert kind == "honest", kind  # framers frame honest nodes
        i = rng.randrange(len(self.rows))
        return self.rows[i], self.zs[i], self.tokens[i]


@dataclass(slots=True)
class _Entry:
    role: int
    model_id: str


@dataclass(slots=True)
class _Record:
    ed25519_public: bytes
    entry: _Entry


@dataclass
class NodeSpec:
    """One model node of a chain run: its behaviour (module docstring), the adversary view whose
    detector it uses and the share of challenges it wants flagged, and from which epoch it cheats."""

    name: str
    behaviour: str
    view: View | None = None
    tpr: float = 0.0
    cheat_from: int = 0


@dataclass
class _Node:
    spec: NodeSpec
    key: Any
    node_id: bytes
    rule: tuple[float, float, float] = (math.inf, 0.0, 0.0)  # detector threshold, tie probability, users' share
    silent: tuple[int, int] = (0, -1)  # heights [a, b] of a restart's silence
    restart: tuple[int, int, int] = (-1, 0, 0)  # the next restart: (epoch, first, last offset)
    flood_epoch: int = -1
    restarted: list[tuple[int, int]] = field(default_factory=list)  # its restarts: (down from, back at) heights


@dataclass
class RunResult:
    reputation: dict[str, list[int]]  # node name -> R after each epoch
    missed: dict[str, int]
    statuses: list[str]
    sends: int = 0  # tries, all verifiers and nodes
    replies: int = 0  # replies received (each scored once, by its sender)
    node_epochs: int = 0  # (node, epoch) pairs audited, per verifier
    counted: dict[str, int] = field(default_factory=dict)  # node name -> transcripts counted for it (signer)
    burnt: dict[str, int] = field(default_factory=dict)  # node name -> honest donors of its users burnt
    framer_counted: int = 0  # framers' transcripts counted
    framer_burnt: int = 0  # framing identities burnt
    framer_withheld: int = 0  # framers' commitments left unrevealed (their replies scored at or above τ)
    node_revealed: int = 0  # withheld replies the node handed in itself (escrow, decision 0037)
    node_lost: int = 0  # withheld replies it could not hand in (down from their release to the book's close)
    node_hidden: int = 0  # withheld replies a junk flood left out of the release (``junk``)
    booster_counted: int = 0  # boosters' transcripts counted (for the cheaters they boost)
    scored: int = 0  # counted transcripts scored, all verifiers (rules 8 and 9 draw them)
    user_sets: dict[str, int] = field(default_factory=dict)  # node name -> (users' donor, epoch) sets counted for it


def _seeded(*parts: object) -> random.Random:
    return random.Random("/".join(map(str, parts)))


def unrecognised_only(entries: Sequence[Any], sources: Sequence[str]) -> list[Any]:
    """Part I's what-if, one verifier's entries for one node (``sources``: where each one's prompt
    came from): when any came from elsewhere than the built-in generator, each generated challenge's
    reply scores as the mean of the others' replies (every turn's), so that the challenges a node
    recognises by the public template count for nothing beside those it cannot recognise."""
    from verifier.audit import tx as at

    other = [r.score for e, src in zip(entries, sources, strict=True) if src != "generator"
             for r in (*e.earlier, e.outcome) if isinstance(r, at.ReplyOutcome)]
    if not other:
        return list(entries)
    mean = round(sum(other) / len(other))
    return [replace(e, outcome=replace(e.outcome, score=mean))
            if src == "generator" and isinstance(e.outcome, at.ReplyOutcome) else e
            for e, src in zip(entries, sources, strict=True)]


class ChainRun:
    """Four equal-power validators and ``specs`` model nodes on the real audit core for
    ``epochs`` epochs (module docstring, part B)."""

    def __init__(self, seed: int, specs: Sequence[NodeSpec], scores: ScoreTable, default_view: View,
                 epoch_blocks: int, k: int, rho: float = 0.0, framers: int = 0, frame_from: int = 0,
                 cache: dict[int, Any] | None = None, framer_scores: ShortReplies | None = None,
                 pooled: bool = POOLED, by_donor: bool = BY_DONOR, boosters: int = 0,
                 unrecognised_only: bool = False, budgeted: bool = BUDGETED,
                 threads: int = SCORING_THREADS, escrowed: bool = False, junk: int = 0) -> None:
        """``rho``: the share of the nodes' users' requests donated as transcripts; ``framers``:
        one-shot framing identities per epoch from ``frame_from`` against the first honest node;
        ``cache``: the validators' plans and reports by epoch, shared by runs of the same seed and
        specs (they do not depend on ``rho``, the framers or the boosters); ``by_donor``: the
        verifiers cap each node's transcript scores by its donors' sets (decision 0028);
        ``boosters``: sybil user identities per cheating node, from its first cheating epoch, each
        committing BOOST_COMMITS requests to it an epoch, which it serves honestly (part G);
        ``unrecognised_only``: part I's what-if (:func:`unrecognised_only`); ``budgeted``: each
        verifier scores what rules 8 and 9 of :mod:`verifier.audit.transcripts` draw within a
        budget of ROUND_BUDGET × ``threads`` (its ``--audit-threads``), shared with the network's
        other nodes (:meth:`_others`), as the audit loop draws it (False: every counted transcript,
        as the bench had it before decision 0034); ``escrowed``: commitments are escrowed (decision
        0037) and the run's honest nodes hand in the withheld replies they served
        (:meth:`_node_reveals`), False: commitments of version 1, which only their donor reveals;
        ``junk``: with escrow, a framer's junk flood: that many withheld commitments an epoch from
        junk donors of MAX_COMMITS each (as many as the book takes beside the epoch's donors),
        beside which the verifiers' release (:func:`_released`) may leave a withheld one out."""
        from overlay.wire import crypto
        from overlay.wire.identity import node_id_of
        from verifier.audit.transcripts import ScoreCarry, TranscriptBook

        self.seed, self.scores, self.default_view, self.k = seed, scores, default_view, k
        self.pooled = pooled  # decision 0023's cap (False: the figures as they were before it)
        self.by_donor, self.boosters = by_donor, boosters  # decision 0028's cap; part G's sybil users
        self.unrecognised_only = unrecognised_only
        self.booster_ids: set[bytes] = set()
        self.tz: dict[tuple[bytes, bytes], float] = {}  # (donor, request id) -> the transcript's z
        self.rho, self.framers, self.frame_from, self.cache = rho, framers, frame_from, cache
        self.framer_scores = framer_scores  # where the framers' replies are drawn from (None: ``scores``)
        self.book = TranscriptBook()  # every honest verifier's book: they all get the same commits and reveals
        self.escrowed, self.junk = escrowed, junk
        # withheld escrowed commitments' replies, as the node that served them keeps them:
        # commitment -> (node, transcript)
        self.served: dict[bytes, tuple[_Node, Any]] = {}
        # each verifier's scores held for the chain's minimum, as the audit loop holds them; its secret
        # randomness (rules 8 and 9 draw with it) and its suspects (rule 9's memory)
        self.carries = [ScoreCarry() for _ in range(VERIFIERS)]
        self.draws = [_seeded("draws", seed, v) for v in range(VERIFIERS)]
        self.suspected: list[dict[bytes, int]] = [{} for _ in range(VERIFIERS)]
        self.budget = ROUND_BUDGET * threads if budgeted else None
        # the network's other nodes, when this run has fewer (:meth:`_others`)
        self.others = [_seeded("other node", seed, j).randbytes(20) for j in range(SCORING_NETWORK_NODES - len(specs))]
        self.ids: dict[int, tuple[int, ...]] = {}  # a reply's token ids by its length (their values unused)
        self.donors: dict[tuple[str, int], bytes] = {}
        self.framer_gen = [0] * framers
        self.framer_ids: set[bytes] = set()
        self.eligible: dict[int, bool] = {}
        self.params = chain.AuditParams(epoch_blocks=epoch_blocks, challenges_per_node=k)
        vkeys = [crypto.SigningKey.from_bytes(_seeded("validator", seed, i).randbytes(32)) for i in range(VERIFIERS)]
        self.vseeds = [v.private_bytes() for v in vkeys]
        self.validators = [(v.public_bytes, 10) for v in vkeys]
        self.nodes: list[_Node] = []
        for s in specs:
            key = crypto.SigningKey.from_bytes(_seeded("node", seed, s.name).randbytes(32))
            n = _Node(s, key, node_id_of(key.public_bytes))
            if s.view is not None:
                n.rule = flag_rule(s.view, s.tpr)
            self.nodes.append(n)
        self.records = {n.node_id: _Record(n.key.public_bytes, _Entry(2, MODEL)) for n in self.nodes}
        self.honest_peer = next((n for n in self.nodes if n.spec.behaviour == "honest"), None)
        self.node_ids = frozenset(n.node_id for n in self.nodes)  # the run's nodes (not the network's others)
        self.st = chain.initial(self.params, CHAIN_ID)

    # ------------------------------------------------------------------ a node's answer to one try

    def _flagged(self, node: _Node, score: float, rng: random.Random) -> bool:
        thr, rho, _ = node.rule
        return score > thr or (score == thr and rng.random() < rho)

    def _answer(self, node: _Node, epoch: int, v: int, height: int, flagged: bool,
                rng: random.Random) -> tuple[str, str, _Node]:
        """("reply", kind, server) or ("busy" | "silent", "", node) for one try."""
        s = node.spec
        b = s.behaviour if epoch >= s.cheat_from else "honest"
        if b in ("honest", "degraded", "greedy", "greedy_honest_weights"):
            return "reply", b, node
        if b == "selective":
            return "reply", "honest" if flagged else "degraded", node
        if b == "forwarder":
            if flagged and self.honest_peer is not None:
                return "reply", "honest", self.honest_peer
            return "reply", "degraded", node
        if b == "aborter":
            return ("silent", "", node) if flagged else ("reply", "degraded", node)
        if b == "leaked":  # validator 0 colludes: it tells the node its challenges
            return "reply", "honest" if v == 0 else "degraded", node
        if b == "restart":
            a, z = node.silent
            return ("silent", "", node) if a <= height <= z else ("reply", "honest", node)
        if b in ("busy", "flood"):
            p = FLOOD_BUSY_SHARE if b == "flood" and epoch == node.flood_epoch else (
                BUSY_SHARE if b == "busy" else 0.0)
            return ("busy", "", node) if rng.random() < p else ("reply", "honest", node)
        raise ValueError(f"unknown behaviour {b!r}")

    # ------------------------------------------------------------------ one epoch

    def _plan(self, v: int, epoch: int, first: int, last: int, result: RunResult) -> tuple[bytes, list[Any]]:
        """Validator ``v``'s challenges this epoch, sent and answered: (salt, report entries)."""
        from verifier.audit import tx as at
        from verifier.audit.auditor import capped
        from verifier.audit.reputation import to_fixed
        from verifier.audit.scoring import pooled_cap

        entries = []
        for node in sorted(self.nodes, key=lambda n: n.node_id):
            rng = _seeded("plan", self.seed, node.spec.name, epoch, v)
            view = node.spec.view or self.default_view
            zs: list[float] = []  # of this node's replies, pooled at the report as the auditor pools them
            sources = []
            donated = [True] * self.k
            if view.generated:  # part I: share * k donated, spread (decision 0031), the rest generated
                n = int(view.share * self.k)
                n += rng.random() < view.share * self.k - n
                donated = [j < n for j in range(self.k)]
            for j in range(self.k):
                pick = view.challenges if donated[j] else view.generated
                req, det = pick[rng.randrange(len(pick))]
                sources.append(req.source)
                tag = f"{node.spec.name}/{epoch}/{v}/{j}"  # each turn tagged: a prompt is used once
                script = [m if m.role != "user" else ChatMessage("user", f"{m.content} [{tag}/{t}]")
                          for t, m in enumerate(at.script_of(req.messages))]
                opening = at.Opening(rng.randbytes(16), MODEL, tuple(script), req.params)
                flagged = self._flagged(node, det, rng)
                entries.append(self._send_script(node, opening, epoch, v, rng.randint(first, last), last, flagged, rng,
                                                 result, zs))
            if self.pooled and zs:
                cap = to_fixed(pooled_cap(zs))
                entries[-self.k:] = [replace(e, outcome=capped(e.outcome, cap),
                                             earlier=tuple(capped(r, cap) for r in e.earlier))
                                     for e in entries[-self.k:]]
            if self.unrecognised_only:
                entries[-self.k:] = unrecognised_only(entries[-self.k:], sources)
        return _seeded("salt", self.seed, epoch, v).randbytes(16), entries

    def _send_script(self, node: _Node, opening: Any, epoch: int, v: int, h: int, last: int, flagged: bool,
                     rng: random.Random, result: RunResult, zs: list[float]) -> Any:
        """``opening``'s turns sent to ``node`` from height ``h`` as the auditor sends them (decision
        0025): each turn tried up to MAX_TRIES times at later heights of the window, the next turn
        a think time after a reply while it fits; each reply signed over its turn's request with
        the node's earlier replies in place. The report entry; each reply's z added to ``zs``."""
        from overlay.anon import signing
        from verifier.audit import tx as at
        from verifier.audit.auditor import think_blocks

        earlier: list[Any] = []
        texts: list[str] = []
        for turn in range(opening.turns()):
            outcome: Any = None
            for tries in range(1, at.MAX_TRIES + 1):
                result.sends += 1
                what, kind, server = self._answer(node, epoch, v, h, flagged, rng)
                if what == "reply":
                    result.replies += 1
                    score, z = self.scores.draw_reply(self.scores.setting(opening.params), kind, rng)
                    zs.append(z)
                    signed_at = (T0 + h) * 1000 + rng.randrange(1000)
                    chunks = ((f"The answer {turn}", (791, 4245)), (" is here.", (318, 767, 13)))
                    signer = signing.ReplySigner(opening.reply_digest(node.node_id, tries, turn, texts), MODEL,
                                                 server.node_id)
                    sig = b""
                    for i, (text, ids) in enumerate(chunks):
                        _, sig = signer.add(text, ids, i == len(chunks) - 1, signed_at, server.key.sign)
                    outcome = at.ReplyOutcome(server.node_id, chunks, sig, signed_at, score, tries)
                    break
                outcome = at.FailOutcome(what, tries)
                if h >= last:
                    break
                h = rng.randint(h + 1, last)
            h += think_blocks(rng)
            if isinstance(outcome, at.FailOutcome) or turn + 1 == opening.turns() or h > last:
                return at.ReportEntry(node.node_id, opening, outcome, tuple(earlier))
            earlier.append(outcome)
            texts.append(at.reply_text(outcome))
        raise AssertionError("unreachable: the last turn returns")

    # ------------------------------------------------------------------ users' transcripts (decision 0015)

    def _key_of(self, node_id: bytes, model: str) -> bytes | None:
        rec = self.records.get(node_id)
        return rec.ed25519_public if rec is not None and model == MODEL else None

    def _serve_user(self, node: _Node, epoch: int, height: int, flagged: bool,
                    rng: random.Random) -> tuple[str, str, _Node]:
        """What ``node`` does with one try of a user's committed request: as with a challenge
        (:meth:`_answer`: a detecting cheater acts on its detector's flag of the user's request),
        except the leaked cheater: its colluding verifier tells it when commitments arrive, so it
        serves every committed request honestly (the cost of that: part 4, "timing leak")."""
        s = node.spec
        if s.behaviour == "leaked" and epoch >= s.cheat_from:
            return "reply", "honest", node
        return self._answer(node, epoch, -1, height, flagged, rng)

    def _transcript(self, node: _Node, donor: bytes, messages: tuple[ChatMessage, ...], params: SamplingParams,
                    det: float, epoch: int, start: int, last: int, rng: random.Random,
                    res: RunResult, reveal_under: int | None = None, booster: bool = False) -> bool:
        """One committed request from ``donor`` to ``node``, as the rules have it: commit (every
        verifier notes the time), send (a try that gets no reply is retried, same request id, up to
        MAX_TRIES, within USER_RETRY_BLOCKS blocks), then reveal the signed reply, or say "no reply"
        (which voids the donor's set; the book burns a donor past its void budget). A framer
        (``reveal_under``) reveals only a reply that scores under it; a ``booster``'s request the
        node serves honestly itself (it knows its own sybils). False when the book refused the
        commitment (a burnt donor)."""
        from overlay.anon import signing
        from overlay.directory.transcripts import commitment, escrowed_secret
        from verifier.audit import transcripts as tr
        from verifier.audit import tx as at

        h = rng.randint(start, last)
        commit_ms = (T0 + h) * 1000 + rng.randrange(1000)
        opening = at.Opening(bytes(16), MODEL, messages, params)
        rid = rng.randbytes(16)
        digest = signing.request_digest(opening.request(rid), node.node_id)
        secret = escrowed_secret(digest, rng) if self.escrowed else 0
        nonce = escrow.nonce_of(secret) if secret else rng.randbytes(16)
        value = commitment(nonce, node.node_id, digest)
        if not secret:
            if self.book.commit(donor, value, epoch, commit_ms) is not None:
                return False
        else:  # escrowed and certified before the request (rule 10)
            dealt = escrow.deal(secret, ESCROW_PLAN, rng)
            points = escrow.encode_commitments(dealt.commitments)
            if self.book.hold(donor, value, points, dealt.shares[0], epoch, commit_ms) is not None:
                return False
            if self.book.certify(donor, value, points, epoch, commit_ms) is not None:
                raise AssertionError("bench audit-evasion: the transcript book refused a certificate")
        flagged = self._flagged(node, det, rng)
        sent, tries = h, 0
        while True:
            tries += 1
            what, kind, server = (("reply", "honest", node) if booster
                                  else self._serve_user(node, epoch, sent, flagged, rng))
            if what == "reply":
                break
            if tries >= at.MAX_TRIES:
                self.book.no_reply(donor, value)
                return True
            sent += rng.randint(1, USER_RETRY_BLOCKS)
        table = self.framer_scores if reveal_under is not None and self.framer_scores is not None else self.scores
        score, z, tokens = table.draw_transcript(table.setting(params), kind, rng, params.max_tokens)
        withheld = reveal_under is not None and score >= reveal_under
        if withheld:
            res.framer_withheld += 1
            if not secret or server.spec.behaviour not in HONEST_KINDS:
                return True  # nobody hands it in: the book voids the set at close (and burns the framer past its budget)
        signed_at = commit_ms + (sent - h) * 1000 + rng.randint(300, 2000)
        ids = self.ids.get(tokens) or self.ids.setdefault(tokens, (791,) * max(1, tokens))  # rule 9 weighs it
        chunks = (("The answer is here.", ids),)  # one chunk: one signature to make
        _, sig = signing.ReplySigner(digest, MODEL, server.node_id).add(*chunks[0], True, signed_at, server.key.sign)
        reply = at.ReplyOutcome(server.node_id, chunks, sig, signed_at, score, tries)
        t = tr.Transcript(node.node_id, nonce, opening, rid, reply, escrow.scalar_bytes(secret) if secret else b"")
        self.tz[(donor, rid)] = z
        if withheld:  # the honest node that signed it keeps it, to hand it in once the shares are out
            self.served[value] = (server, t)
            return True
        why = self.book.reveal(donor, t, self._key_of)
        if why is not None:
            raise AssertionError(f"bench audit-evasion: the transcript book refused a donor's reveal: {why}")
        return True

    def _node_reveals(self, epoch: int, res: RunResult) -> None:
        """Decision 0037, the node's side: the escrowed commitments of ``epoch`` that no donor
        revealed come out RELEASE_BLOCKS into the next epoch; an honest node that served one hands
        the transcript in (its store is on disk: a restart loses none of it) unless it is down from
        the release until the book closes ``epoch``, at the next epoch's report."""
        start_next, close = self.st.start_height(), self.st.report_from()  # called at the next epoch's start
        released = self._released(epoch)
        for value, _, _ in self.book.released(epoch):
            kept = self.served.pop(value, None)
            if kept is None:
                continue  # no reply came (busy or silent), or a node that is not honest
            node, t = kept
            if value not in released:
                res.node_hidden += 1  # out of the release: the node never rebuilds it
                continue
            if any(a <= start_next + RELEASE_BLOCKS and b >= close - 1 for a, b in node.restarted):
                res.node_lost += 1
                continue
            why = self.book.node_reveal(t, self._key_of)
            if why is not None:
                raise AssertionError(f"bench audit-evasion: the transcript book refused a node's reveal: {why}")
            res.node_revealed += 1

    def _released(self, epoch: int) -> set[bytes]:
        """The withheld commitments of ``epoch`` the verifiers release (``escrow_intake``'s rule),
        beside the run's junk flood (``junk``: junk donors of MAX_COMMITS each, as many as the book
        takes beside the epoch's donors). A donor at or under :func:`release_level` has all of its
        out, whatever the seed; the others' are chosen as :func:`release_choice` chooses them."""
        from verifier.audit.escrow_intake import release_choice, release_level
        from verifier.audit.transcripts import MAX_COMMITS, MAX_DONORS

        by_donor = [[v for v, _, _ in items] for items in self.book.released_by_donor(epoch).values()]
        donors = min(-(-self.junk // MAX_COMMITS), MAX_DONORS - self.book.donors(epoch))
        junk_counts = [MAX_COMMITS] * max(0, donors)
        level = release_level([len(values) for values in by_donor] + junk_counts)
        if all(len(values) <= level for values in by_donor):
            return {v for values in by_donor for v in values}
        rng = _seeded("junk", self.seed, epoch)  # only when a real donor is over the level
        junk_values = [[rng.randbytes(32) for _ in range(n)] for n in junk_counts]
        return set(release_choice(by_donor + junk_values, rng.randbytes(32)))

    def _eligible(self, r: Req) -> bool:
        """Whether a donor's client may choose ``r`` (overlay.directory.transcripts.fits: a transcript's limits, decision 0032; no seed)."""
        from overlay.directory.transcripts import fits

        if r.ident not in self.eligible:
            self.eligible[r.ident] = fits(MODEL, r.messages, r.params) is None
        return self.eligible[r.ident]

    def _users(self, epoch: int, start: int, end: int, res: RunResult) -> None:
        """The epoch's committed requests, at uniform heights of the epoch: per node,
        :func:`user_requests` requests of its users (drawn from its view's user requests, with
        the view's detector score), each donated with probability ``rho`` when its client may
        choose it; the framers' commitments against the first honest node; and each cheating
        node's boosters' (:meth:`_boost`)."""
        self._boost(epoch, start, end, res)
        if self.rho <= 0 and not (self.framers and epoch >= self.frame_from):
            return
        for node in self.nodes:
            view = node.spec.view or self.default_view
            reqs, dets = view.user_reqs, view.users
            for i in range(user_requests(self.params.epoch_blocks * BLOCK_S)):
                rng = _seeded("user", self.seed, node.spec.name, epoch, i)  # the same draws at every rho
                j = rng.randrange(len(reqs))
                if rng.random() >= self.rho or not self._eligible(reqs[j]):
                    continue
                key = (node.spec.name, reqs[j].user)
                if key not in self.donors:
                    self.donors[key] = _seeded("donor", self.seed, *key).randbytes(20)
                self._transcript(node, self.donors[key], reqs[j].messages, reqs[j].params, float(dets[j]), epoch,
                                 start, end, rng, res)
        victim = next((n for n in self.nodes if n.spec.behaviour in HONEST_KINDS), None)
        if self.framers and epoch >= self.frame_from and victim is not None:
            prompts = victim.spec.view.user_reqs if victim.spec.view else self.default_view.user_reqs
            for f in range(self.framers):
                while True:  # a burnt identity is replaced by a fresh one (another registration)
                    ident = _seeded("framer", self.seed, f, self.framer_gen[f]).randbytes(20)
                    if ident not in self.book.burnt:
                        break
                    self.framer_gen[f] += 1
                self.framer_ids.add(ident)
                rng = _seeded("frame", self.seed, epoch, f)
                last = next(m.content for m in reversed(prompts[rng.randrange(len(prompts))].messages)
                            if m.role == "user")
                self._transcript(victim, ident, (ChatMessage("user", last),), FRAMER_PARAMS, 0.0, epoch, start, end,
                                 rng, res, reveal_under=FRAMER_TAU)

    def _boost(self, epoch: int, start: int, end: int, res: RunResult) -> None:
        """Part G: ``boosters`` sybil user identities per cheating node (registered users; their
        number is the attacker's cost), each committing BOOST_COMMITS of users' prompts (a new
        conversation each, the gateway's defaults) to that node an epoch from its first cheating
        epoch; the node serves them honestly and the identities reveal every reply."""
        if not self.boosters:
            return
        for node in self.nodes:
            if node.spec.behaviour in HONEST_KINDS or epoch < node.spec.cheat_from:
                continue
            prompts = (node.spec.view or self.default_view).user_reqs
            for b in range(self.boosters):
                ident = _seeded("booster", self.seed, node.spec.name, b).randbytes(20)
                self.booster_ids.add(ident)
                for j in range(BOOST_COMMITS):
                    rng = _seeded("boost", self.seed, node.spec.name, epoch, b, j)
                    last = next(m.content for m in reversed(prompts[rng.randrange(len(prompts))].messages)
                                if m.role == "user")
                    self._transcript(node, ident, (ChatMessage("user", last),), FRAMER_PARAMS, math.inf, epoch,
                                     start, end, rng, res, booster=True)

    def _close(self, epoch: int, res: RunResult) -> list[tuple[tuple[bytes, tuple[int, ...]], ...]]:
        """What each validator submits in epoch ``epoch``'s report window, as the verifier's audit
        loop does (verifier/audit/auditor.py): the book's epochs before this one closed (the
        commitments of epoch ``epoch − 1`` had all of this epoch to be revealed), the transcripts
        it scores of them (:meth:`_drawn`), and per signing node their scores (a score is a
        function of the reply: every honest verifier scores a reply alike) once it has the chain's
        minimum (held over epochs as the audit loop holds them,
        :class:`verifier.audit.transcripts.ScoreCarry`), at most MAX_TRANSCRIPTS_PER_NODE (a seeded
        sample when more count); with ``by_donor``, capped by each node's donors' sets first
        (:func:`verifier.audit.transcripts.capped_by_donor`, as the audit driver caps them)."""
        from verifier.audit import tx as at
        from verifier.audit.transcripts import capped_by_donor

        if self.escrowed:
            for old in self.book.open_epochs():
                if old < epoch:
                    self._node_reveals(old, res)
        counted = self.book.close_before(epoch)
        res.framer_burnt = len(self.framer_ids & self.book.burnt)
        for name in res.burnt:
            res.burnt[name] = sum(d in self.book.burnt for k, d in self.donors.items() if k[0] == name)
        names = {n.node_id: n.spec.name for n in self.nodes}
        for c in counted:
            res.counted[names[c.node_id]] += 1
            res.framer_counted += c.donor in self.framer_ids
            res.booster_counted += c.donor in self.booster_ids
        for nid, _ in {(c.node_id, c.donor) for c in counted
                       if c.donor not in self.framer_ids and c.donor not in self.booster_ids}:
            res.user_sets[names[nid]] = res.user_sets.get(names[nid], 0) + 1
        z_of = {id(c): self.tz.pop((c.donor, c.transcript.request_id)) for c in counted}
        others = self._others(epoch, counted, z_of)
        outs = []
        for v in range(VERIFIERS):
            drawn = self._drawn(v, epoch, counted, others, z_of)
            res.scored += len(drawn)
            scored = [(c.node_id, c.donor, c.transcript.reply.score, z_of[id(c)]) for c in drawn]
            pairs = capped_by_donor(scored) if self.by_donor else [(n, sc) for n, _, sc, _ in scored]
            out = []
            for nid, sc in self.carries[v].add(epoch, pairs):
                if len(sc) > at.MAX_TRANSCRIPTS_PER_NODE:
                    sc = tuple(_seeded("cap", self.seed, epoch, nid).sample(sc, at.MAX_TRANSCRIPTS_PER_NODE))
                out.append((nid, sc))
            outs.append(tuple(out))
        return outs

    def _drawn(self, v: int, epoch: int, counted: Sequence[Any], others: Sequence[Any],
               z_of: dict[int, float]) -> list[Any]:
        """The counted transcripts verifier ``v`` scores this round, in the order the audit loop
        scores them: all of them unbudgeted; else of them and the ``others`` (the network's other
        nodes', :meth:`_others`) rule 8 (:func:`~verifier.audit.transcripts.within_budget`),
        rule 9's first draw within its budget, and its second for the suspect nodes of that draw
        and of the rounds before (:meth:`verifier.audit.auditor.Auditor.second_draw`), each with
        the verifier's own randomness; this run's nodes' only."""
        from verifier.audit import transcripts as tr

        if self.budget is None:
            return list(counted)
        rng = self.draws[v]
        kept, _ = tr.within_budget([*counted, *others], rng)
        first, spare, reserve = tr.first_draw(kept, rng, self.budget)
        fresh = tr.suspects((c.node_id, c.donor, z_of[id(c)]) for c in first)
        more = tr.second_draw(spare, tr.remembered(self.suspected[v], epoch, fresh), rng, reserve)
        return [c for c in first + more if c.node_id in self.node_ids]

    def _others(self, epoch: int, counted: Sequence[Any], z_of: dict[int, float]) -> list[Any]:
        """The round's transcripts of the network's other nodes (SCORING_NETWORK_NODES in all), which
        share each verifier's budget with this run's: each as many as the run's first honest node's
        users handed in this round, the same requests (so the same costs), scored afresh as honest
        replies (their ``z`` added to ``z_of``), their donors their own; none unbudgeted."""
        from verifier.audit.transcripts import Counted

        if self.budget is None or not self.others or self.honest_peer is None:
            return []
        peer = self.honest_peer.node_id
        theirs = [c for c in counted if c.node_id == peer and c.donor not in self.framer_ids
                  and c.donor not in self.booster_ids]
        rng = _seeded("others", self.seed, epoch)
        out = []
        for j, node in enumerate(self.others):
            for c in theirs:
                params = c.transcript.opening.params
                _, z, _ = self.scores.draw_transcript(self.scores.setting(params), "honest", rng, params.max_tokens)
                o = Counted(bytes([j]) + c.donor[1:], node, c.transcript)
                z_of[id(o)] = z
                out.append(o)
        return out

    def _faults(self, epoch: int, start: int) -> None:
        """A restarting node: one restart in each RESTART_EVERY epochs, in a random one of them,
        silent from a random height of that epoch to a random later one of the same epoch."""
        e_blocks = self.params.epoch_blocks
        for node in self.nodes:
            if node.spec.behaviour != "restart":
                continue
            if epoch % RESTART_EVERY == 0:
                rng = _seeded("restart", self.seed, node.spec.name, epoch)
                a = rng.randrange(e_blocks)
                node.restart = (epoch + rng.randrange(RESTART_EVERY), a, rng.randint(a, e_blocks - 1))
            e, a, b = node.restart
            node.silent = (start + a, start + b) if e == epoch else (0, -1)
            if e == epoch:
                node.restarted.append((start + a, start + b))

    def _txs(self, e: int, commit_until: int, report_from: int, res: RunResult) -> tuple[list[Any], list[Any]]:
        """The validators' plan commits and audit reports of epoch ``e``, signed and decoded:
        ``([(tx, raw)] commits, [(tx, raw)] reports)``; from the cache when a run of the same seed
        and specs made them already (the sends and replies are counted once, by the first run)."""
        from verifier.audit import tx as at

        if self.cache is not None and e in self.cache:
            return self.cache[e]  # type: ignore[no-any-return]
        plans = [self._plan(v, e, commit_until + 1, report_from - 1, res) for v in range(VERIFIERS)]
        commits, reports = [], []
        for v, (salt, entries) in enumerate(plans):
            pk = self.validators[v][0]
            ph = at.plan_hash(salt, [(x.node_id, x.opening.commitment()) for x in entries])
            raw = at.sign_tx(at.PlanCommit(e, pk, (MODEL,), ph), CHAIN_ID, self.vseeds[v])
            commits.append((at.decode_audit_tx(raw, CHAIN_ID), raw))
        for v, (salt, entries) in enumerate(plans):
            pk = self.validators[v][0]
            raw = at.sign_tx(at.AuditReport(e, pk, salt, tuple(entries)), CHAIN_ID, self.vseeds[v])
            reports.append((at.decode_audit_tx(raw, CHAIN_ID), raw))
        if self.cache is not None:
            self.cache[e] = (commits, reports)
        return commits, reports

    def run(self, epochs: int) -> RunResult:
        from verifier.audit import tx as at

        names = [n.spec.name for n in self.nodes]
        res = RunResult({n: [] for n in names}, {n: 0 for n in names}, [], counted={n: 0 for n in names},
                        burnt={n: 0 for n in names})
        for n in self.nodes:
            if n.spec.behaviour == "flood":
                n.flood_epoch = _seeded("flood", self.seed, n.spec.name).randrange(epochs)
        for e in range(epochs):
            st = self.st
            assert st.epoch == e
            start, commit_until, report_from, end = st.start_height(), st.commit_until(), st.report_from(), st.end_height()
            self._faults(e, start)
            commits, reports = self._txs(e, commit_until, report_from, res)
            transcripts = self._close(e, res)  # the commitments of earlier epochs
            self._users(e, start, end, res)
            res.node_epochs += len(self.nodes)
            powers = dict(self.validators)
            for h in range(start, end + 1):
                txs: list[tuple[Any, bytes]] = []
                if h == start:
                    txs = commits
                if h == report_from:
                    txs = list(reports)
                    for v in range(VERIFIERS):  # each validator's scores of the transcripts it scored, after its report
                        if transcripts[v]:
                            ts = at.TranscriptScores(e, self.validators[v][0], transcripts[v])
                            raw = at.sign_tx(ts, CHAIN_ID, self.vseeds[v])
                            txs.append((at.decode_audit_tx(raw, CHAIN_ID), raw))
                for tx, raw in txs:
                    st = chain.take(st, tx, raw, height=h, time_s=T0 + h, validators=self.validators,
                                    nodes=self.records)
                if h == end:
                    for n in self.nodes:
                        if chain.node_epoch(st, n.node_id, powers) == "missed":
                            res.missed[n.spec.name] += 1
                st = chain.end_block(st, h, _seeded("block", self.seed, h).randbytes(32), self.validators)
            self.st = st
            res.statuses.append(st.outcomes[-1].status if st.outcomes else "none")
            for n in self.nodes:
                res.reputation[n.spec.name].append(st.reputation.get(n.node_id).value)
        return res


# ============================================================================= the runs

VIEWS = ("generator", "donated", "donated_colluder")
# Part H (decision 0030): an operator's private prompts, the auditor's second source; the bench's
# stand-in is the donors' half of the users' prompts, as one-turn prompts ("private") or as
# conversations of several user turns ("private_scripts"), with the parameters draw_params draws
PRIVATE_VIEWS = ("private", "private_scripts")
SOURCES = ("generator", "donated", *PRIVATE_VIEWS)  # where a challenge's prompt comes from
PLAIN_CHEATERS = ("degraded", "greedy", "greedy_honest_weights", "leaked")
DETECTING = ("selective", "forwarder", "aborter")
FAULTS = ("plain", "restart", "busy", "flood")


def cheater_specs(views_: dict[str, View], names: Sequence[str] = VIEWS,
                  plain: Sequence[str] = PLAIN_CHEATERS) -> tuple[list[NodeSpec], dict[str, float]]:
    """An honest peer (the forwarders' target), the ``plain`` cheaters, and per adversary view of
    ``names`` the selective cheater at every swept share and the forwarder and aborter at the
    highest share that still serves at least 1 − MAX_FPR of users' requests cheaply; and that
    share per view."""
    specs = [NodeSpec("honest", "honest")]
    specs += [NodeSpec(b, b, cheat_from=WARMUP_EPOCHS) for b in plain]
    chosen: dict[str, float] = {}
    for name in names:
        v = views_[name]
        ok = [t for t in SELECTIVE_TPRS if flag_rule(v, t)[2] <= MAX_FPR]
        chosen[name] = max(ok) if ok else min(SELECTIVE_TPRS)
        for t in SELECTIVE_TPRS:
            specs.append(NodeSpec(f"selective_{name}_tpr{round(100 * t)}", "selective", v, t, WARMUP_EPOCHS))
        for b in ("forwarder", "aborter"):
            specs.append(NodeSpec(f"{b}_{name}", b, v, chosen[name], WARMUP_EPOCHS))
    return specs, chosen


def _epochs_to_untrusted(rs: Sequence[int], cheat_from: int, trust_line: int) -> int | None:
    """Epochs of cheating until R is below the trust line (1 = after the first), None if never."""
    for i, r in enumerate(rs[cheat_from:], start=1):
        if r < trust_line:
            return i
    return None


def _pct(values: Sequence[float], q: float) -> float:
    from gentorrent.bench.stats import percentile

    return percentile(sorted(values), q)


def rho_prefix(rho: float) -> str:
    """The figures' prefix at donation rate ``rho``: none at 0 (challenges only: the figures as
    they were before transcripts), ``transcripts_rho{percent}_`` otherwise."""
    return "" if rho <= 0 else f"transcripts_rho{round(100 * rho)}_"


def run_cheaters(seeds: Sequence[int], epochs: int, scores: ScoreTable, views_: dict[str, View], epoch_blocks: int,
                 k: int, rhos: Sequence[float] = (0.0,), transcript_seeds: Sequence[int] | None = None,
                 names: Sequence[str] = VIEWS, plain: Sequence[str] = PLAIN_CHEATERS,
                 unrecognised_only: bool = False) -> tuple[dict[str, float], dict[str, Any]]:
    """Part B at every donation rate of ``rhos`` (rate 0 over ``seeds``, the others over
    ``transcript_seeds``, a prefix of them: the same seeds give the same challenges, so each run
    with transcripts differs from its challenges-only twin by the transcripts alone), for the
    adversary views ``names`` and the ``plain`` cheaters (part H: the private views alone; part I:
    the mixed ones, ``unrecognised_only`` for its what-if)."""
    from overlay.wire.constants import TRUST_LINE

    specs, chosen = cheater_specs(views_, names, plain)
    t_seeds = set(seeds if transcript_seeds is None else transcript_seeds)
    got: dict[float, dict[str, list[int | None]]] = {r: {s.name: [] for s in specs} for r in rhos}
    r_after: dict[float, dict[str, list[int]]] = {r: {s.name: [] for s in specs} for r in rhos}
    honest_min: dict[float, list[int]] = {r: [] for r in rhos}
    counted: dict[float, list[int]] = {r: [] for r in rhos}
    scored: dict[float, list[int]] = {r: [] for r in rhos}
    burnt: dict[float, list[int]] = {r: [] for r in rhos}
    for seed in seeds:
        cache: dict[int, Any] = {}
        for rho in sorted(rhos):  # rate 0 first: it fills the cache
            if rho > 0 and seed not in t_seeds:
                continue
            res = ChainRun(seed, specs, scores, views_["donated"], epoch_blocks, k, rho=rho, cache=cache,
                           unrecognised_only=unrecognised_only).run(epochs)
            counted[rho].append(sum(res.counted.values()))
            scored[rho].append(res.scored)
            burnt[rho].append(sum(res.burnt.values()))
            for s in specs:
                rs = res.reputation[s.name]
                if s.behaviour == "honest":
                    honest_min[rho].append(min(rs))
                    continue
                got[rho][s.name].append(_epochs_to_untrusted(rs, s.cheat_from, TRUST_LINE))
                r_after[rho][s.name].append(rs[min(len(rs), s.cheat_from + UNTRUSTED_WITHIN) - 1])
    never = epochs - WARMUP_EPOCHS + 1
    f: dict[str, float] = {}
    sweep: dict[str, Any] = {}
    for rho in rhos:
        pre = rho_prefix(rho)

        def figures(label: str, name: str, rho: float = rho, pre: str = pre) -> None:
            xs = got[rho][name]
            f[f"{pre}cheater_{label}_untrusted_within_5_share"] = sum(x is not None and x <= UNTRUSTED_WITHIN
                                                                       for x in xs) / len(xs)
            ep = [float(never if x is None else x) for x in xs]
            f[f"{pre}cheater_{label}_epochs_to_untrusted_p50"] = _pct(ep, 50)
            f[f"{pre}cheater_{label}_epochs_to_untrusted_p95"] = _pct(ep, 95)
            f[f"{pre}cheater_{label}_reputation_after_5_mean"] = sum(r_after[rho][name]) / len(r_after[rho][name]) / 1e6

        for b in plain:
            figures(b, b)
        for name in names:
            worst = None
            for t in SELECTIVE_TPRS:
                sname = f"selective_{name}_tpr{round(100 * t)}"
                xs = got[rho][sname]
                share = sum(x is not None and x <= UNTRUSTED_WITHIN for x in xs) / len(xs)
                fpr = flag_rule(views_[name], t)[2]
                f[f"{pre}{sname}_untrusted_within_5_share"] = share
                if rho <= 0:
                    f[f"{sname}_users_flagged_share"] = fpr
                if fpr <= MAX_FPR and (worst is None or share < f[f"{pre}{worst}_untrusted_within_5_share"]):
                    worst = sname
            worst = worst or f"selective_{name}_tpr{round(100 * min(SELECTIVE_TPRS))}"
            figures(f"selective_{name}", worst)
            sweep.setdefault(name, {"forwarder_aborter_share_flagged": chosen[name]})[f"worst_rho{rho}"] = worst
            for b in ("forwarder", "aborter"):
                figures(f"{b}_{name}", f"{b}_{name}")
        f[f"{pre}cheater_run_honest_min_reputation"] = min(honest_min[rho]) / 1e6
        if rho > 0:
            node_epochs = len(counted[rho]) * len(specs) * epochs
            f[f"{pre}counted_per_node_epoch"] = sum(counted[rho]) / node_epochs
            f[f"{pre}scored_per_verifier_node_epoch"] = sum(scored[rho]) / (VERIFIERS * node_epochs)
            f[f"{pre}donors_burnt_per_run"] = sum(burnt[rho]) / len(burnt[rho])
    return f, sweep


def run_private(seeds: Sequence[int], epochs: int, scores: ScoreTable, views_: dict[str, View], epoch_blocks: int,
                k: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Part H (decision 0030): part B's detecting cheaters of the private views, challenges only
    (a chain of their own: an honest peer and each view's selective, forwarder and aborter
    nodes); its honest peer's lowest reputation as ``private_run_honest_min_reputation``."""
    f, sweep = run_cheaters(seeds, epochs, scores, views_, epoch_blocks, k, names=PRIVATE_VIEWS, plain=())
    f["private_run_honest_min_reputation"] = f.pop("cheater_run_honest_min_reputation")
    return f, sweep


# Part I: a network short of donations. A verifier draws a donated prompt for a node while its pool
# holds one the node has not read, and falls back to the generator (decision 0030's private prompts
# left aside); at these shares of a node's challenges donated, the rest generated
MIXED_SHARES = (0.1, 0.25, 0.5, 0.75)
MIXED_VIEWS = tuple(f"mixed{round(100 * s)}" for s in MIXED_SHARES)
WHATIF_MIXED_VIEWS = MIXED_VIEWS[:2]  # the what-if where the generator's challenges are most of a node's


def mixed_view(donated: View, generator: View, share: float) -> View:
    """A node of which a ``share`` of the challenges are donated and the rest generated: its
    detector flags a generated one with certainty (the template's public parts: AUC 1 against users'
    requests, ``auc_template_generator``, flagging none of them; scored +inf here) and a donated one
    by the donated view's detector, whose scores of users' requests are the view's. The AUC is that
    detector's over the challenges in those shares: a generated one scores above every user's
    request, a donated one as in the donated view."""
    gen = [(r, math.inf) for r, _ in generator.challenges]
    return View(f"mixed{round(100 * share)}", f"template, else {donated.detector}",
                share * donated.auc + (1.0 - share), donated.challenges, donated.users, donated.user_reqs, gen, share)


def run_mixed(seeds: Sequence[int], epochs: int, scores: ScoreTable, views_: dict[str, View], epoch_blocks: int,
              k: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Part I: part B's detecting cheaters of each :data:`MIXED_VIEWS` view, challenges only, as
    built, and of :data:`WHATIF_MIXED_VIEWS` with :func:`unrecognised_only` (``whatif_unrecognised_*``);
    a chain for each view and way (a report covers at most MAX_AUDITED_NODES nodes)."""
    mixed = {v: mixed_view(views_["donated"], views_["generator"], s) for v, s in zip(MIXED_VIEWS, MIXED_SHARES,
                                                                                     strict=True)}
    f = {f"auc_best_{v}": mixed[v].auc for v in MIXED_VIEWS}
    sweep: dict[str, Any] = {}
    for pre, names in (("", MIXED_VIEWS), ("whatif_unrecognised_", WHATIF_MIXED_VIEWS)):
        for v in names:
            cf, sw = run_cheaters(seeds, epochs, scores, {**views_, **mixed}, epoch_blocks, k, names=(v,), plain=(),
                                  unrecognised_only=bool(pre))
            del cf["cheater_run_honest_min_reputation"]  # its honest peer's challenges are all donated: part B's
            f.update({pre + key: value for key, value in cf.items()
                      if not (pre and key.endswith("_users_flagged_share"))})  # the view's: as built
            sweep.setdefault(pre + "sweep", {}).update(sw)
    return f, sweep


def run_honest(seeds: Sequence[int], epochs: int, scores: ScoreTable, view: View, epoch_blocks: int,
               k: int, per_kind: int, rho: float = RHO_HONEST,
               transcript_seeds: Sequence[int] | None = None) -> dict[str, float]:
    """Part C, and D's counts: nodes with faults and fault-free ones, each run replayed with every
    faulty node fault-free; challenges only over ``seeds``, and with users' transcripts at rate
    ``rho`` over ``transcript_seeds`` (a prefix of them; the same challenges)."""
    from overlay.wire.constants import TRUST_LINE

    specs = [NodeSpec(f"{b}{i}", "honest" if b == "plain" else b) for b in FAULTS for i in range(per_kind)]
    twin_specs = [NodeSpec(s.name, "honest") for s in specs]
    f: dict[str, float] = {}
    t_seeds = set(seeds if transcript_seeds is None else transcript_seeds)
    rates = (0.0, rho)
    low: dict[float, dict[str, list[int]]] = {r: {b: [] for b in FAULTS} for r in rates}
    untrusted: dict[float, dict[str, int]] = {r: {b: 0 for b in FAULTS} for r in rates}
    missed: dict[str, int] = {b: 0 for b in FAULTS}
    burnt: dict[str, int] = {b: 0 for b in FAULTS}
    scored = 0
    interfered = {r: 0 for r in rates}
    shift = {r: 0 for r in rates}  # the most one plain node's R moved by another's faults (millionths)
    flipped = {r: 0 for r in rates}  # epochs in which another's faults changed whether a plain node is trusted
    sends = replies = node_epochs = 0
    empty = {r: 0 for r in rates}  # epochs whose outcome is not `applied`
    runs = {r: 0 for r in rates}
    for seed in seeds:
        cache: dict[int, Any] = {}
        twin_cache: dict[int, Any] = {}
        for r in rates:
            if r > 0 and seed not in t_seeds:
                continue
            runs[r] += 1
            res = ChainRun(seed, specs, scores, view, epoch_blocks, k, rho=r, cache=cache).run(epochs)
            twin = ChainRun(seed, twin_specs, scores, view, epoch_blocks, k, rho=r, cache=twin_cache).run(epochs)
            empty[r] += sum(s != "applied" for s in res.statuses)
            if r <= 0:
                sends, replies, node_epochs = sends + res.sends, replies + res.replies, node_epochs + res.node_epochs
            else:
                scored += res.scored
            for s in specs:
                kind = s.name.rstrip("0123456789")
                rs = res.reputation[s.name]
                low[r][kind].append(min(rs))
                untrusted[r][kind] += any(x < TRUST_LINE for x in rs)
                if r <= 0:
                    missed[kind] += res.missed[s.name]
                else:
                    burnt[kind] += res.burnt[s.name]
            plain = [s.name for s in specs if s.behaviour == "honest"]
            for e in range(epochs):
                interfered[r] += any(res.reputation[n][e] != twin.reputation[n][e] for n in plain)
                flipped[r] += any((res.reputation[n][e] < TRUST_LINE) != (twin.reputation[n][e] < TRUST_LINE)
                                  for n in plain)
                shift[r] = max(shift[r], *(abs(res.reputation[n][e] - twin.reputation[n][e]) for n in plain))
    n_nodes = len(seeds) * per_kind
    pre = rho_prefix(rho)
    for b in FAULTS:
        f[f"honest_{b}_untrusted_nodes"] = float(untrusted[0.0][b])
        f[f"honest_{b}_min_reputation"] = min(low[0.0][b]) / 1e6
        f[f"honest_{b}_missed_epochs_per_100"] = 100.0 * missed[b] / (n_nodes * epochs)
        f[f"{pre}honest_{b}_untrusted_nodes"] = float(untrusted[rho][b])
        f[f"{pre}honest_{b}_min_reputation"] = min(low[rho][b]) / 1e6
        f[f"{pre}honest_{b}_donors_burnt_per_100_node_epochs"] = 100.0 * burnt[b] / (runs[rho] * per_kind * epochs)
    f["honest_nodes_per_kind"] = float(n_nodes)
    f[f"{pre}honest_nodes_per_kind"] = float(runs[rho] * per_kind)
    f["honest_epochs_changed_by_another_node"] = float(interfered[0.0])
    f[f"{pre}honest_epochs_changed_by_another_node"] = float(interfered[rho])
    f[f"{pre}honest_epochs_trust_changed_by_another_node"] = float(flipped[rho])
    f[f"{pre}honest_max_reputation_change_by_another_node"] = shift[rho] / 1e6
    f["honest_epochs_not_applied"] = float(empty[0.0])
    f[f"{pre}honest_epochs_not_applied"] = float(empty[rho])
    per = VERIFIERS * node_epochs
    f["cost_challenges_sent_per_verifier_node_epoch"] = sends / per
    f["cost_replies_scored_per_verifier_node_epoch"] = replies / per
    f[f"{pre}cost_transcripts_scored_per_verifier_node_epoch"] = scored / (VERIFIERS * runs[rho] * len(specs) * epochs)
    return f


def framing(seeds: Sequence[int], scores: ScoreTable, view: View, epoch_blocks: int, k: int,
            rhos: Sequence[float], grid: Sequence[int] = FRAMERS_GRID, framer_scores: ShortReplies | None = None,
            name: str = "framing", escrowed: bool = False, victim: str = "honest",
            junk: int = 0) -> tuple[dict[str, float], dict[str, Any]]:
    """Part E: an honest node (trusted after WARMUP_EPOCHS honest epochs) facing one-shot framers
    for FRAMING_EPOCHS epochs, its own users donating at each rate of ``rhos``: per rate the
    smallest number of framing identities per epoch (FRAMERS_GRID, searched in order) at which it
    is untrusted within FRAMING_EPOCHS epochs in at least FRAMING_SHARE of the runs. A grid value
    is decided as soon as the runs so far settle it (the rest cannot change which side it is on).
    ``escrowed``: the commitments are escrowed and the victim hands in the replies the framers
    withheld (decision 0037), unless it is down (``victim`` "restart") from their release until the
    close, or a junk flood left the commitment out of the release (``junk``: :class:`ChainRun`'s)."""
    from overlay.wire.constants import TRUST_LINE

    specs = [NodeSpec("victim", victim)]
    epochs = WARMUP_EPOCHS + FRAMING_EPOCHS
    need = math.ceil(FRAMING_SHARE * len(seeds))
    f: dict[str, float] = {}
    detail: dict[str, Any] = {}
    caches: dict[int, dict[int, Any]] = {s: {} for s in seeds}
    for rho in rhos:
        found: int | None = None
        tried: dict[int, dict[str, float]] = {}
        for n in grid:
            hits = runs = framer_counted = framer_burnt = withheld = revealed = lost = hid = 0
            for seed in seeds:
                res = ChainRun(seed, specs, scores, view, epoch_blocks, k, rho=rho, framers=n,
                               frame_from=WARMUP_EPOCHS, cache=caches[seed], framer_scores=framer_scores,
                               escrowed=escrowed, junk=junk).run(epochs)
                runs += 1
                hits += _epochs_to_untrusted(res.reputation["victim"], WARMUP_EPOCHS, TRUST_LINE) is not None
                framer_counted += res.framer_counted
                framer_burnt += res.framer_burnt
                withheld += res.framer_withheld
                revealed += res.node_revealed
                lost += res.node_lost
                hid += res.node_hidden
                if hits >= need or runs - hits > len(seeds) - need:
                    break
            tried[n] = {"runs": runs, "untrusted": hits,
                        "framer_counted_per_epoch": framer_counted / (runs * FRAMING_EPOCHS),
                        "identities_burnt_per_epoch": framer_burnt / (runs * FRAMING_EPOCHS),
                        "withheld_per_epoch": withheld / (runs * FRAMING_EPOCHS),
                        "node_revealed_per_epoch": revealed / (runs * FRAMING_EPOCHS),
                        "node_lost_per_epoch": lost / (runs * FRAMING_EPOCHS),
                        "node_hidden_per_epoch": hid / (runs * FRAMING_EPOCHS)}
            if hits >= need:
                found = n
                break
        key = f"{name}_rho{round(100 * rho)}_"
        last = tried[found if found is not None else grid[-1]]
        f[key + "identities_per_epoch"] = float(found if found is not None else 2 * grid[-1])
        f[key + "identities_burnt_per_epoch"] = last["identities_burnt_per_epoch"]
        f[key + "framer_transcripts_counted_per_epoch"] = last["framer_counted_per_epoch"]
        if escrowed:
            f[key + "withheld_per_epoch"] = last["withheld_per_epoch"]
            f[key + "node_revealed_per_epoch"] = last["node_revealed_per_epoch"]
            f[key + "node_lost_per_epoch"] = last["node_lost_per_epoch"]
        if junk:
            f[key + "node_hidden_per_epoch"] = last["node_hidden_per_epoch"]
        detail[f"rho{rho}"] = {str(n): v for n, v in tried.items()}
    return f, detail


def framing_escrowed(seeds: Sequence[int], scores: ScoreTable, view: View, epoch_blocks: int, k: int,
                     grid: Sequence[int] = FRAMERS_GRID) -> tuple[dict[str, float], dict[str, Any]]:
    """Part E with escrowed commitments (decision 0037, what verifiers take by default): the
    framers as in :func:`framing`, and the victim hands in every reply they withheld
    (``framing_escrow_``); the same with a victim that restarts once in RESTART_EVERY epochs
    (``framing_escrow_restart_``: its store is on disk, so it loses a withheld reply only when it is
    down from the release until the close). At rho = 0 only: the
    victim's own users' donations add honest samples and cannot help the framers. And with a junk
    flood beside the framers (``framing_escrow_junk{J}_``, J of JUNK_FLOODS): J junk withheld
    commitments an epoch, beside which a withheld one left out of the release voids its set
    (decision 0037's "Three more holes", 3; decision 0039 shares the release out by donor); the
    junk itself costs J / 16 void sets an epoch, which the figures do not count."""
    f, detail = framing(seeds, scores, view, epoch_blocks, k, (0.0,), grid, name="framing_escrow", escrowed=True)
    fr, detail["restart"] = framing(seeds, scores, view, epoch_blocks, k, (0.0,), grid, name="framing_escrow_restart",
                                    escrowed=True, victim="restart")
    f.update(fr)
    for junk in JUNK_FLOODS:
        fj, detail[f"junk{junk}"] = framing(seeds, scores, view, epoch_blocks, k, (0.0,), grid,
                                            name=f"framing_escrow_junk{junk}", escrowed=True, junk=junk)
        f.update(fj)
    return f, detail


def boosting(seeds: Sequence[int], scores: ScoreTable, views_: dict[str, View], epoch_blocks: int, k: int,
             rhos: Sequence[float], grid: Sequence[int] = BOOSTERS_GRID) -> tuple[dict[str, float], dict[str, Any]]:
    """Part G: sybil users that keep a cheater trusted (decision 0028). The cheaters challenges
    alone do not catch (the selective cheater of the generator view and of a colluder's memory, at
    part B's forwarder's share; the forwarder is left out: its flagged users' requests count for
    the peer it forwards to, boosted or not) and an honest peer, their users donating at each rate
    of ``rhos``; each cheater has ``n`` booster identities (BOOSTERS_GRID, searched in order). Per rate, and with the
    transcripts' plain mean (``mean``, before decision 0028) or capped by donor (``by_donor``):
    the smallest ``n`` at which some cheater escapes (is not untrusted within UNTRUSTED_WITHIN
    epochs) in more than 1 − UNTRUSTED_SHARE_GOAL of the runs (0: without any), and how many of
    its users' donor sets count for a cheater an epoch at that ``n``. Decided as soon as the runs
    so far settle it."""
    from overlay.wire.constants import TRUST_LINE

    _, chosen = cheater_specs(views_)
    specs = [NodeSpec("honest", "honest")]
    for name in ("generator", "donated_colluder"):
        specs.append(NodeSpec(f"selective_{name}", "selective", views_[name], chosen[name], WARMUP_EPOCHS))
    cheaters = [s.name for s in specs if s.behaviour != "honest"]
    epochs = WARMUP_EPOCHS + UNTRUSTED_WITHIN + 1
    allowed = math.floor((1 - UNTRUSTED_SHARE_GOAL) * len(seeds) + 1e-9)  # escapes the goal allows
    caches: dict[int, dict[int, Any]] = {s: {} for s in seeds}
    f: dict[str, float] = {}
    detail: dict[str, Any] = {}
    honest_min = math.inf
    for rho in rhos:
        for mode in ("mean", "by_donor"):
            found: int | None = None
            tried: dict[int, dict[str, Any]] = {}
            for n in grid:
                escapes = dict.fromkeys(cheaters, 0)
                runs = counted = user_sets = 0
                for seed in seeds:
                    res = ChainRun(seed, specs, scores, views_["donated"], epoch_blocks, k, rho=rho, cache=caches[seed],
                                   by_donor=mode == "by_donor", boosters=n).run(epochs)
                    runs += 1
                    counted += res.booster_counted
                    user_sets += sum(res.user_sets.get(c, 0) for c in cheaters)
                    honest_min = min(honest_min, min(res.reputation["honest"]))
                    for c in cheaters:
                        x = _epochs_to_untrusted(res.reputation[c], WARMUP_EPOCHS, TRUST_LINE)
                        escapes[c] += x is None or x > UNTRUSTED_WITHIN
                    if max(escapes.values()) > allowed or runs == len(seeds):
                        break
                tried[n] = {"runs": runs, "escapes": escapes,
                            "booster_transcripts_counted_per_cheater_epoch":
                                counted / (runs * len(cheaters) * (epochs - WARMUP_EPOCHS)),
                            # users' donor sets counted for a cheater an epoch (every epoch of the run)
                            "user_sets_per_cheater_epoch": user_sets / (runs * len(cheaters) * epochs)}
                if max(escapes.values()) > allowed:
                    found = n
                    break
            key = f"boosting_rho{round(100 * rho)}_{mode}_"
            last = tried[found if found is not None else grid[-1]]
            f[key + "identities"] = float(found if found is not None else 2 * grid[-1])
            f[key + "caught_share_min"] = 1 - max(last["escapes"].values()) / last["runs"]
            f[key + "booster_transcripts_counted_per_cheater_epoch"] = last["booster_transcripts_counted_per_cheater_epoch"]
            f[key + "user_sets_per_cheater_epoch"] = last["user_sets_per_cheater_epoch"]
            detail[f"rho{rho}_{mode}"] = {str(n): v for n, v in tried.items()}
    f["boosting_honest_min_reputation"] = honest_min / 1e6
    return f, detail


def committed_auc(views_: dict[str, View], rho: float, seed: int) -> dict[str, float]:
    """Part F (a): each view's best detector (its scores of the evaluation stream's users' requests)
    as a detector of the requests their users commit (donate at rate ``rho``, a coin flipped before
    sending, among the requests a donor's client may choose): AUC of committed against every other
    user request, and against the other requests a client may choose; the mean over AUC_DRAWS
    seeded coin draws. And the share of users' requests no client may choose (a seed, or over a
    transcript's limits): those a cheater may serve cheaply with no transcript risk; beside it the
    same share under the limits transcripts had before decision 0032 (an audit challenge's)."""
    from overlay.directory.transcripts import fits, opening_problem

    f: dict[str, float] = {}
    for name in VIEWS:
        v = views_[name]
        ok = np.array([fits(MODEL, r.messages, r.params) is None for r in v.user_reqs])
        scores = np.asarray(v.users, dtype=np.float64)
        every, eligible = [], []
        for d in range(AUC_DRAWS):  # the mean over seeded coin draws (one draw's AUC is noisy)
            rng = random.Random(f"committed/{seed}/{name}/{d}")
            lab = np.array([1 if (rng.random() < rho and e) else 0 for e in ok])
            every.append(auc(scores, lab))
            eligible.append(auc(scores[ok], lab[ok]))
        f[f"transcripts_auc_committed_{name}"] = float(np.mean(every))
        f[f"transcripts_auc_committed_eligible_{name}"] = float(np.mean(eligible))
        if name == "donated":
            f["transcripts_users_ineligible_share"] = float(1.0 - ok.mean())
            f["transcripts_users_ineligible_share_challenge_limits"] = float(np.mean(
                [r.params.seed is not None or opening_problem(MODEL, r.messages, r.params) is not None
                 for r in v.user_reqs]))
    return f


def timing_leak(rhos: Sequence[float], epochs: int, epoch_s: float, seed: int) -> dict[str, float]:
    """Part F (b): a verifier colluding with the node tells it when every commitment arrives (not
    its target, nor its content). Commitments arrive network-wide as a Poisson process at
    ``rho × nodes × USER_REQUESTS_PER_S`` (each node's users' requests, donated at ``rho``); the
    node's own users' requests are a Poisson stream at USER_REQUESTS_PER_S, each committed with probability ``rho`` a uniform COMMIT_LEAD_S before it arrives. The
    node's detector: the seconds since the last commitment it heard of (fewer: more likely
    committed). Figures, per network size and rate: its AUC (committed against the rest), and per
    window W the share of its users' committed requests inside W (the transcripts it dodges by
    serving honestly within W of every commitment) and the share of ALL its users' requests
    inside W (what it must serve honestly to dodge that way: the cost)."""
    f: dict[str, float] = {}
    duration = epochs * epoch_s
    per_node = USER_REQUESTS_PER_S
    for nodes in NETWORK_NODES:
        for rho in rhos:
            if rho <= 0:
                continue
            rng = np.random.default_rng([seed, nodes, round(1000 * rho)])
            n_own = rng.poisson(per_node * duration)
            own_t = np.sort(rng.uniform(0.0, duration, n_own))
            committed = rng.random(n_own) < rho
            lead = rng.uniform(*COMMIT_LEAD_S, n_own)
            n_other = rng.poisson(rho * (nodes - 1) * per_node * duration)
            commits = np.sort(np.concatenate([rng.uniform(0.0, duration, n_other), (own_t - lead)[committed]]))
            idx = np.searchsorted(commits, own_t, side="right") - 1
            since = np.where(idx >= 0, own_t - commits[np.maximum(idx, 0)], np.inf)
            key = f"timing_nodes{nodes}_rho{round(100 * rho)}_"
            f[key + "auc"] = auc(-np.minimum(since, 1e9), committed.astype(np.int64))
            for w in LEAK_WINDOWS_S:
                inside = since <= w
                wk = f"w{w:g}s_"
                f[key + wk + "committed_dodged_share"] = float(inside[committed].mean())
                f[key + wk + "served_honestly_share"] = float(inside.mean())
    return f


def run_detectors(seed_train: int, seed_test: int, epochs: int, timing: Timing, k: int,
                  prompts: Sequence[str]) -> tuple[dict[str, float], dict[str, View]]:
    """Part A for every challenge source (:data:`SOURCES`): every detector's AUC, and the
    adversaries' views."""
    users_half, donors_half = split_prompts(prompts, seed_train)
    match = TemplateMatcher()
    f: dict[str, float] = {}
    out: dict[str, View] = {}
    for source in SOURCES:  # sent as the auditor sends them (decisions 0025 and 0026)
        train = stream(seed_train, source, epochs, timing, k, users_half, donors_half, "script_personas")
        test = stream(seed_test, source, epochs, timing, k, users_half, donors_half, "script_personas")
        # the node knows how long it has seen a request's paths: with held paths that is no longer
        # the same as whether they are new (decisions 0025 and 0026)
        aucs, scores, obs = detectors(train, test, timing, match, path_age=True)
        for name, a in aucs.items():
            f[f"auc_{name}_{source}"] = a
        for v in views(source, aucs, scores, obs):
            out[v.name] = v
    for name in (*VIEWS, *PRIVATE_VIEWS):
        f[f"auc_best_{name}"] = out[name].auc
    # what-if: challenge paths built once an epoch per verifier (not per challenge)
    train = stream(seed_train, "donated", epochs, timing, k, users_half, donors_half, paths="epoch")
    test = stream(seed_test, "donated", epochs, timing, k, users_half, donors_half, paths="epoch")
    aucs, _, _ = detectors(train, test, timing, match)
    for name in WHATIF:
        f[f"whatif_epoch_paths_auc_{name}_donated"] = aucs[name]
    f["whatif_epoch_paths_auc_best_donated"] = max(a for d, a in aucs.items() if d not in MEMORY)
    # what-if: donated conversations replayed turn by turn over the same fresh paths
    train = stream(seed_train, "donated", epochs, timing, k, users_half, donors_half, paths="replay")
    test = stream(seed_test, "donated", epochs, timing, k, users_half, donors_half, paths="replay")
    aucs, _, _ = detectors(train, test, timing, match)
    for name in WHATIF_REPLAY:
        f[f"whatif_replay_auc_{name}_donated"] = aucs[name]
    f["whatif_replay_auc_best_donated"] = max(a for d, a in aucs.items() if d not in MEMORY)
    # what-if: decision 0020's personas send challenges as users' sessions (paths retired every epoch)
    train = stream(seed_train, "donated", epochs, timing, k, users_half, donors_half, paths="persona")
    test = stream(seed_test, "donated", epochs, timing, k, users_half, donors_half, paths="persona")
    aucs, _, _ = detectors(train, test, timing, match, path_age=True)
    for name in WHATIF_PERSONA:
        f[f"whatif_persona_auc_{name}_donated"] = aucs[name]
    f["whatif_persona_auc_best_donated"] = max(a for d, a in aucs.items() if d not in MEMORY)
    return f, out


def untrusted_goal(f: dict[str, float], cheaters: Sequence[str], goal: str, pre: str = "") -> dict[str, Any]:
    """A goal entry: every one of ``cheaters`` (figures under ``pre``) untrusted within
    UNTRUSTED_WITHIN epochs in at least UNTRUSTED_SHARE_GOAL of the runs; the worst and the failing."""
    def share(c: str) -> float:
        return f[f"{pre}cheater_{c}_untrusted_within_5_share"]

    worst = min(cheaters, key=share)
    return {"goal": goal, "worst": worst, "value": share(worst),
            "failing": [c for c in cheaters if share(c) < UNTRUSTED_SHARE_GOAL], "met": share(worst) >= UNTRUSTED_SHARE_GOAL}


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    """The ``gentorrent.benches`` entry point: ``(params, figures)``."""
    import time

    from gentorrent.bench.stats import cpu_model
    from overlay.wire.constants import TRUST_LINE
    from verifier.audit import tx as at
    from verifier.audit.auditor import persona_count
    from verifier.audit.transcripts import ROUND_BUDGET

    t_start = time.perf_counter()
    try:
        prompts = load_user_prompts()
        scores = ScoreTable()
    except BenchError as exc:
        raise SystemExit(str(exc)) from None
    missing = {"honest", "degraded", "greedy", "greedy_honest_weights"} - set(scores.kinds)
    if missing:
        raise SystemExit(f"bench audit-evasion: {SCORES_FILE} lacks reply kinds {sorted(missing)}")
    epoch_blocks, k = chain.DEFAULT_EPOCH_BLOCKS, chain.DEFAULT_CHALLENGES_PER_NODE
    timing = Timing(epoch_blocks, chain.COMMIT_BLOCKS)
    detector_epochs = 15 if quick else 120
    cheater_seeds = list(range(1, 4 if quick else 201))
    cheater_t_seeds = cheater_seeds[:1 if quick else 50]
    cheat_epochs = WARMUP_EPOCHS + (6 if quick else 10)
    honest_seeds = list(range(1, 3 if quick else 21))
    honest_t_seeds = honest_seeds[:1 if quick else 10]
    honest_epochs = 30 if quick else HONEST_EPOCHS
    per_kind = 2
    framing_seeds = list(range(1, 2 if quick else 21))
    timing_epochs = max(1, round((6_000 if quick else 120_000) / timing.epoch_s))  # the same hours at any epoch length

    f, views_ = run_detectors(1, 2, detector_epochs, timing, k, prompts)
    t_a = time.perf_counter()
    cf, sweep = run_cheaters(cheater_seeds, cheat_epochs, scores, views_, epoch_blocks, k, RHOS, cheater_t_seeds)
    f.update(cf)
    t_b = time.perf_counter()
    hf, private_sweep = run_private(cheater_seeds, cheat_epochs, scores, views_, epoch_blocks, k)
    f.update(hf)
    mixed_seeds = cheater_seeds[:1 if quick else 100]
    mf, mixed_sweep = run_mixed(mixed_seeds, cheat_epochs, scores, views_, epoch_blocks, k)
    f.update(mf)
    t_h = time.perf_counter()
    f.update(run_honest(honest_seeds, honest_epochs, scores, views_["donated"], epoch_blocks, k, per_kind,
                        RHO_HONEST, honest_t_seeds))
    # C'. honest nodes whose engine computes the verifier's weights in float32 (decision 0023)
    other = ScoreTable.honest_only(OTHER_ARITHMETIC_FILE)
    fo = run_honest(honest_seeds, honest_epochs, other, views_["donated"], epoch_blocks, k, per_kind, 0.0, [])
    for b in FAULTS:
        f[f"honest_other_arithmetic_{b}_untrusted_nodes"] = fo[f"honest_{b}_untrusted_nodes"]
        f[f"honest_other_arithmetic_{b}_min_reputation"] = fo[f"honest_{b}_min_reputation"]
    t_c = time.perf_counter()
    framing_grid = FRAMERS_GRID[3:8:2] if quick else FRAMERS_GRID  # quick: 8, 32, 128
    ff, framing_detail = framing(framing_seeds, scores, views_["donated"], epoch_blocks, k, RHOS, framing_grid)
    f.update(ff)
    for weighted in (True, False):  # framers asking for 4-token replies, with decision 0021's weight and without
        name = "framing_short" if weighted else "framing_short_unweighted"
        ff, framing_detail[name] = framing(framing_seeds, scores, views_["donated"], epoch_blocks, k, (0.0,),
                                           framing_grid, framer_scores=ShortReplies(weighted), name=name)
        f.update(ff)
    ff, framing_detail["escrow"] = framing_escrowed(framing_seeds, scores, views_["donated"], epoch_blocks, k,
                                                    framing_grid)
    f.update(ff)
    boosting_seeds = list(range(1, 3 if quick else 11))
    boosting_grid = (0, 16, 64) if quick else BOOSTERS_GRID
    fg, boosting_detail = boosting(boosting_seeds, scores, views_, epoch_blocks, k,
                                   [*BOOSTING_LOW_RHOS, *(r for r in RHOS if r > 0)], boosting_grid)
    f.update(fg)
    t_d = time.perf_counter()
    f.update(committed_auc(views_, RHO_HONEST, 3))
    f.update(timing_leak(RHOS, timing_epochs, timing.epoch_s, 4))
    t_e = time.perf_counter()

    # D. cost, against main's protocol (the leader sends MAIN_K a node; every verifier scores them)
    f["cost_cpu_s_per_verifier_node_epoch"] = f["cost_replies_scored_per_verifier_node_epoch"] * SCORE_S
    f["main_challenges_sent_per_verifier_node_epoch"] = MAIN_K / VERIFIERS
    f["main_replies_scored_per_verifier_node_epoch"] = float(MAIN_K)
    f["main_cpu_s_per_verifier_node_epoch"] = MAIN_K * SCORE_S
    f["cost_cpu_ratio_vs_main"] = f["cost_cpu_s_per_verifier_node_epoch"] / f["main_cpu_s_per_verifier_node_epoch"]
    # per hour: this protocol's epochs are epoch_blocks long, main's were MAIN_EPOCH_BLOCKS
    f["cost_cpu_s_per_verifier_node_hour"] = f["cost_cpu_s_per_verifier_node_epoch"] * 3600.0 / timing.epoch_s
    f["main_cpu_s_per_verifier_node_hour"] = f["main_cpu_s_per_verifier_node_epoch"] * 3600.0 / (
        MAIN_EPOCH_BLOCKS * BLOCK_S)
    f["cost_cpu_ratio_vs_main_per_hour"] = (f["cost_cpu_s_per_verifier_node_hour"]
                                            / f["main_cpu_s_per_verifier_node_hour"])

    cheaters = [*PLAIN_CHEATERS, *(f"{b}_{v}" for b in DETECTING for v in VIEWS)]
    every = f"untrusted within {UNTRUSTED_WITHIN} epochs in >= {UNTRUSTED_SHARE_GOAL:.0%} of runs"
    goals: dict[str, Any] = {}
    for v in VIEWS:
        goals[f"detector_auc_{v}"] = {"goal": f"best detector's AUC <= {AUC_GOAL}", "value": f[f"auc_best_{v}"],
                                     "detector": views_[v].detector, "met": f[f"auc_best_{v}"] <= AUC_GOAL}
    goals["cheaters_untrusted"] = untrusted_goal(f, cheaters, f"every cheater {every}")
    # part H: the operator's private prompts (decision 0030)
    for v in PRIVATE_VIEWS:
        goals[f"detector_auc_{v}"] = {"goal": f"best detector's AUC <= {AUC_GOAL}", "value": f[f"auc_best_{v}"],
                                     "detector": views_[v].detector, "met": f[f"auc_best_{v}"] <= AUC_GOAL}
    goals["private_cheaters_untrusted"] = untrusted_goal(
        f, [f"{b}_{v}" for b in DETECTING for v in PRIVATE_VIEWS],
        f"challenges from an operator's private prompts only: every detecting cheater {every}")
    # part I: a network short of donations, as built and with the what-if
    mixed = [f"{b}_{v}" for b in DETECTING for v in MIXED_VIEWS]
    goals["mixed_cheaters_untrusted"] = untrusted_goal(
        f, mixed, f"a share of the challenges generated, the rest donated: every detecting cheater {every}")
    honest_untrusted = sum(f[f"honest_{b}_untrusted_nodes"] + f[f"honest_other_arithmetic_{b}_untrusted_nodes"]
                           for b in FAULTS)
    goals["honest_trusted"] = {"goal": f"0 honest nodes (with faults; on the verifier's arithmetic or another) "
                                       f"untrusted over {honest_epochs} epochs",
                               "value": honest_untrusted, "met": honest_untrusted == 0}
    goals["no_interference"] = {"goal": "0 epochs in which one node's outcome changed another's",
                                "value": f["honest_epochs_changed_by_another_node"],
                                "met": f["honest_epochs_changed_by_another_node"] == 0}
    # decision 0037: framers against escrowed commitments, the node handing in what they withhold
    for variant, who in (("framing_escrow", "an honest node"), ("framing_escrow_restart", "an honest node that "
                                                                 f"restarts once in {RESTART_EVERY} epochs")):
        needed = f[f"{variant}_rho0_identities_per_epoch"]
        goals[variant] = {"goal": f"with escrow, no number of one-shot framers up to {framing_grid[-1]} an epoch "
                                  f"sinks {who} (rho = 0)", "value": needed, "met": needed > framing_grid[-1]}
    # with users' transcripts (decision 0015)
    for rho in RHOS:
        if rho <= 0:
            continue
        goals[f"transcripts_rho{round(100 * rho)}_cheaters_untrusted"] = untrusted_goal(
            f, cheaters, f"with users donating {rho:.0%} of their requests as transcripts: every cheater {every}",
            rho_prefix(rho))
    for v in VIEWS:
        a = f[f"transcripts_auc_committed_{v}"]
        goals[f"transcripts_detector_auc_{v}"] = {
            "goal": f"the best challenge detector's AUC for users' committed requests <= {AUC_GOAL}",
            "value": a, "detector": views_[v].detector, "met": a <= AUC_GOAL}
    pre = rho_prefix(RHO_HONEST)
    t_untrusted = sum(f[f"{pre}honest_{b}_untrusted_nodes"] for b in FAULTS)
    goals["transcripts_honest_trusted"] = {
        "goal": f"with transcripts at {RHO_HONEST:.0%}: 0 honest nodes (with faults) untrusted over {honest_epochs} epochs",
        "value": t_untrusted, "met": t_untrusted == 0}
    meddled = f[f"{pre}honest_epochs_trust_changed_by_another_node"] + f[f"{pre}honest_epochs_not_applied"]
    goals["transcripts_no_interference"] = {
        "goal": f"with transcripts at {RHO_HONEST:.0%}: 0 epochs in which one node's faults changed whether another "
                f"is trusted, 0 epochs not applied (the issue's: no epoch aborted by one node; decision 0036: rule 9 "
                f"shares a bounded budget, so another node's faults may move R a little, "
                f"{pre}honest_epochs_changed_by_another_node counts the epochs)",
        "value": meddled, "met": meddled == 0}
    f[f"{pre}cost_transcripts_cpu_s_per_verifier_node_epoch"] = (
        f[f"{pre}cost_transcripts_scored_per_verifier_node_epoch"] * SCORE_S)
    for rho in RHOS:
        if rho > 0:
            n = f[f"boosting_rho{round(100 * rho)}_by_donor_identities"]
            goals[f"transcripts_rho{round(100 * rho)}_boosting"] = {
                "goal": f"with users donating {rho:.0%}: no number of booster identities up to {boosting_grid[-1]} "
                        f"a cheater keeps it trusted (part G, decision 0028)",
                "value": n, "met": n > boosting_grid[-1]}
    for name, g in goals.items():
        f[f"goal_{name}_met"] = 1.0 if g["met"] else 0.0

    params: dict[str, Any] = {
        "quick": quick,
        "cpu": cpu_model(),
        "chain": {"validators": VERIFIERS, "power_each": 10, "epoch_blocks": epoch_blocks, "block_s": BLOCK_S,
                  "commit_blocks": chain.COMMIT_BLOCKS, "report_blocks": timing.report_blocks,
                  "challenges_per_node_per_verifier": k, "max_tries": at.MAX_TRIES, "miss_limit": chain.MISS_LIMIT,
                  "trust_line": TRUST_LINE / 1e6},
        "scores": {"file": str(SCORES_FILE), "measured": scores.measured, "how": scores.how,
                   "settings": scores.settings,
                   "setting_rule": "the measured (temperature, top-p) nearest the challenge's (L1 distance)"},
        "user_prompts": f"{USER_PROMPTS} ({len(prompts)} prompts; halves by a seeded shuffle: users / donors)",
        "users": {"requests_per_s": USER_REQUESTS_PER_S, "requests_per_epoch": user_requests(timing.epoch_s), "session_mean_requests": SESSION_MEAN,
                  "think_mean_s": THINK_MEAN_S, "share_chat": SHARE_CHAT,
                  "share_gateway_history": SHARE_GATEWAY_HISTORY, "share_user_set_params": SHARE_USER_SET,
                  "user_temperatures": USER_TEMPERATURES, "user_max_tokens": USER_MAX_TOKENS,
                  "system_prompt_share": {"chat": SHARE_CHAT_SYSTEM, "gateway": SHARE_GATEWAY_SYSTEM},
                  "path_refresh_s": PATH_REFRESH_S, "paths_per_request": PATHS_PER_REQUEST, "relays": RELAYS,
                  "affinity": AFFINITY, "donate_rate": DONATE_RATE, "donors": DONORS},
        "detectors": {"epochs": detector_epochs, "train_seed": 1, "test_seed": 2,
                      "features": list(FEATURES), "memory_detectors": list(MEMORY),
                      "best": {v: views_[v].detector for v in (*VIEWS, *PRIVATE_VIEWS)},
                      "challenges_per_stream": len(views_["donated"].challenges),
                      "user_requests_per_stream": len(views_["donated"].users)},
        "cheaters": {"runs": len(cheater_seeds), "epochs": cheat_epochs, "warmup_honest_epochs": WARMUP_EPOCHS,
                     "selective_shares": SELECTIVE_TPRS, "max_users_flagged": MAX_FPR, "sweep": sweep,
                     "censored_epochs_value": cheat_epochs - WARMUP_EPOCHS + 1,
                     "leaked": "validator 0 of 4 colludes: its challenges answered honestly, the others' degraded"},
        "honest": {"runs": len(honest_seeds), "epochs": honest_epochs, "nodes_per_kind_per_run": per_kind,
                   "restart": f"one per {RESTART_EVERY} epochs, silent from a random height to a later one of the "
                              "same epoch",
                   "busy_share": BUSY_SHARE, "flood_busy_share": FLOOD_BUSY_SHARE,
                   "retry": "a failed try is retried at a uniform later height of the send window",
                   "other_arithmetic": f"honest_other_arithmetic_*: the honest replies of {OTHER_ARITHMETIC_FILE.name} "
                                       f"({other.how})"},
        "private": {"views": list(PRIVATE_VIEWS), "runs": len(cheater_seeds), "epochs": cheat_epochs,
                    "stand_in": "the donors' half of the users' prompts, never sent to the node before: one user "
                                "turn each, no system prompt ('private'), or the donors' conversations' scripts "
                                "('private_scripts'); parameters from verifier.audit.challenges.draw_params",
                    "sweep": private_sweep},
        "mixed": {"shares_donated": MIXED_SHARES, "views": list(MIXED_VIEWS), "runs": len(mixed_seeds),
                  "epochs": cheat_epochs, "whatif_views": list(WHATIF_MIXED_VIEWS),
                  "detector": "a generated challenge flagged with certainty (the template's public parts), a donated "
                              "one by the donated view's best detector; users' requests scored by that detector",
                  "whatif_unrecognised": "each verifier scores a node's generated challenges as the mean of its "
                                         "other challenges' replies to it, when it sent it any",
                  "sweep": mixed_sweep},
        "pooled": POOLED,
        "scripts": {"max_turns": MAX_SCRIPT_TURNS, "think": "10 blocks + Exp(45 blocks) after the node's reply"},
        "personas": {"per_verifier": persona_count(k),
                     "paths": "every challenge over the paths of one of its verifier's personas (uniform), held from "
                              "the persona's first send to the epoch's end (part A's 'script_personas')"},
        "cost": {"score_s": SCORE_S, "assumption": "every scored reply costs one one-pass verification of "
                 "docs/benchmarks.md 'verify' (877 ms, SmolLM2 Q4_1, one thread, 60-token replies)",
                 "main": f"leader sends k={MAIN_K} a node in {MAIN_EPOCH_BLOCKS}-block epochs; every verifier "
                         f"scores the {MAIN_K} replies"},
        "transcripts": {
            "rhos": RHOS, "rho_honest": RHO_HONEST, "cheater_runs_with_transcripts": len(cheater_t_seeds),
            "honest_runs_with_transcripts": len(honest_t_seeds),
            "users": f"per node and epoch {user_requests(timing.epoch_s)} requests drawn from its view's evaluation "
                     "stream of users' requests (with the detector's score); each donated with probability rho "
                     "when overlay.directory.transcripts.fits allows it (no seed, a transcript's limits: decision 0032)",
            "book": "verifier.audit.transcripts.TranscriptBook: commit at a uniform height of the epoch, signed "
                    "reply, reveal (or no_reply); closed in the next epoch's report window (as verifier/audit/"
                    "auditor.py closes it); one book stands for every honest verifier (same inputs)",
            "scores": "a transcript's score is drawn from the ScoreTable by the reply's kind and the request's "
                      "setting, once: every honest verifier scores the same reply alike",
            "retries": f"a committed request that gets no reply is retried (same id) up to {at.MAX_TRIES} "
                       f"tries within {USER_RETRY_BLOCKS} blocks; then 'no reply' voids the donor's set and burns it",
            "leaked": "its colluding verifier tells it when commitments arrive: it serves committed requests honestly",
            "aborter": "silent on the users' requests it flags (and their retries): a donated one voids its donor's set",
            "forwarder": "forwards the users' requests it flags to the honest peer: those transcripts count for the peer",
            "framing": {"runs": len(framing_seeds), "epochs": FRAMING_EPOCHS, "warmup_honest_epochs": WARMUP_EPOCHS,
                        "share": FRAMING_SHARE, "grid": list(framing_grid), "tau": FRAMER_TAU / 1e6,
                        "framer_params": {"temperature": FRAMER_PARAMS.temperature, "top_p": FRAMER_PARAMS.top_p},
                        "not_found_value": 2 * framing_grid[-1], "search": framing_detail,
                        "escrow": {"release_blocks": RELEASE_BLOCKS, "restart_every": RESTART_EVERY,
                                   "how": "framing_escrow_*: commitments escrowed and certified before the request "
                                          "(decision 0037); a framer's withheld reply is released release_blocks "
                                          "into the next epoch and the victim hands it in unless it is down from "
                                          "then until the book closes the epoch at the next report (its store is on "
                                          "disk; framing_escrow_restart_*: one restart in restart_every epochs); "
                                          "each escrow dealt to one unit (the "
                                          "book's checks, s·B = C_0 and the nonce of s, are the same under any "
                                          "plan; the share check is bench escrow's)"}},
            "by_donor": BY_DONOR,
            "scoring": {"budgeted": BUDGETED, "threads": SCORING_THREADS, "network_nodes": SCORING_NETWORK_NODES,
                        "per_node": ROUND_BUDGET * SCORING_THREADS / SCORING_NETWORK_NODES,
                        "how": "each verifier scores what rules 8 and 9 of verifier.audit.transcripts draw with its own "
                               "randomness (the first draw, then the second for its suspects, remembered) within "
                               "ROUND_BUDGET x threads, among the run's nodes and, up to network_nodes, other honest "
                               "nodes whose users hand in as many transcripts as the run's first honest node's (the "
                               "same requests, honest replies drawn afresh); a reply's length is the measured reply's "
                               "when it ended before its cap, else the request's max_tokens"},
            "boosting": {"runs": len(boosting_seeds), "epochs": WARMUP_EPOCHS + UNTRUSTED_WITHIN + 1,
                         "grid": list(boosting_grid), "commits_per_booster_epoch": BOOST_COMMITS,
                         "not_found_value": 2 * boosting_grid[-1],
                         "booster": "a registered user that commits BOOST_COMMITS users' prompts (a new "
                                    "conversation each, temperature 1, 256 tokens) to its cheater each epoch, "
                                    "which serves them honestly; every reply revealed",
                         "search": boosting_detail},
            "timing": {"network_nodes": NETWORK_NODES, "commit_lead_s": COMMIT_LEAD_S,
                       "windows_s": LEAK_WINDOWS_S, "epochs": timing_epochs,
                       "commit_rate_per_s": {f"nodes{n}_rho{r}": r * n * USER_REQUESTS_PER_S
                                             for n in NETWORK_NODES for r in RHOS if r > 0}},
        },
        "goals": goals,
        "seconds": {"detectors": round(t_a - t_start, 1), "cheaters": round(t_b - t_a, 1), "private_mixed": round(t_h - t_b, 1),
                    "honest": round(t_c - t_h, 1), "framing_boosting": round(t_d - t_c, 1), "timing": round(t_e - t_d, 1)},
    }
    return params, f
