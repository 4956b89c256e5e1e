"""``gentorrent bench quotas``: what anonymous usage quotas cost and what they buy (issue 31,
decisions 0017 and 0018).

1. **Cost per token** (CPU time, this process, ``time.process_time``): the user's blinding and
   unblinding with proof check (for one issuer), the issuer's evaluation of a batch of
   :data:`BATCH` (with the request's signature check and budget), the issuer's redemption check,
   the model node's local screen of a token; against a plain Ed25519 signature and verification
   in the same run. Real code: :class:`overlay.directory.quota.Blinding`,
   :class:`verifier.quota.Issuer`, :func:`model_node.quota.parse`.
2. **Added time to first token** (real clock): the same requests, one at a time, to an echo model
   node over the in-memory overlay, with tokens (a real :class:`~overlay.directory.wallet.Wallet`
   fetching blind from real issuers, a real :class:`~model_node.quota.Redeemer` redeeming at them)
   and without (no wallet, no redeemer). The verifiers' RPC is a function call here
   (:data:`RPC_NOTE`): the figure is the protocol's CPU and scheduling cost, not a network's round
   trip, which adds one round trip to the slowest of ``issuers`` verifiers: measured apart, as
   ``abci_query`` round trips to one real ``gentorrent verifier`` on loopback (:func:`rpc_round_trip`).
3. **A flood** (trio's mock clock: times are the schedule's, not this machine's speed): honest
   users send at a steady rate to one echo model node whose capacity is the honest load plus
   headroom, while a fifth user does what the mode says (:data:`MODES`): nothing (``noflood``),
   send as an honest user at exactly its fair share (``fairshare``: the floor any quota that grants
   fair shares leaves), flood at 10× its fair share spending every token its allowance gives and
   sending without one otherwise, as a modified client would (``tokens``), the same flood taking
   priority tokens only, never standard ones (``priority``, decision 0022), the same flood with its
   tokens saved up until its allowance is full and then spent at once (``hoard``), or the flood
   with quotas off (``notokens``). Figures: the honest users' TTFT p50/p99 and the share of their
   requests refused as busy, pooled over :data:`FLOOD_SEEDS`; the goal is an honest p99 with the
   flood within 1.5× of the one without. The modes of :data:`MANY_MODES` are played again with the
   same honest load from :data:`MANY` users (figures ``..._users21``): a fair share is then a
   smaller part of the node.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio
import trio.testing

from gentorrent.bench.stats import cpu_model, percentile

MODEL = "echo"
CHAIN = "bench-quotas"
BATCH = 16
RPC_NOTE = "in-process function call (no HTTP, no CometBFT): the verifiers' RPC round trip is not included"
# the flood: one echo model node, 2 slots, 20 pieces of 0.05 s a reply (1 s a request: 2 requests/s)
SLOTS = 2
PIECES = 20
PIECE_S = 0.05
CAPACITY = SLOTS / (PIECES * PIECE_S)  # the node's requests/s
HONEST_LOAD = 1.0  # the honest users' requests/s in all: half the node's capacity
HONEST = 4
HONEST_RATE = HONEST_LOAD / HONEST  # requests/s each
FAIR = CAPACITY / (HONEST + 1)  # each user's fair share of the node, requests/s
#: the many-users runs: the same honest load spread over this many users (a fifth user's fair
#: share is then 1/21 of the node, not 1/5)
MANY = 20
MANY_MODES = ("noflood", "fairshare", "tokens", "priority", "hoard")
FLOOD_FACTOR = 10
EPOCH_S = 60  # the flood's quota epoch: its tokens are each user's fair share of it
GRACE_S = 10
BURST = 8  # the allowance's depth: a third of a minute's fair share
PRIORITY = 4  # of which priority tokens: the top half (decision 0022)
FLOOD_SEEDS = (5, 6, 7)  # the honest users' arrivals and the epochs' phase of each run (the quick run: the first)
UNIX_ANCHOR = 1_800_000_000.0  # the flood runs' Unix time at trio time 0 less the phase (an epoch start)


def _cpu_ms(fn: Callable[[], object], n: int) -> float:
    t = time.process_time()
    for _ in range(n):
        fn()
    return 1000 * (time.process_time() - t) / n


# --------------------------------------------------------------------------- 1. cost per token

def costs(n: int) -> dict[str, float]:
    from model_node.quota import parse
    from overlay.directory import quota
    from overlay.wire import crypto
    from overlay.wire.identity import Identity
    from verifier.quota import Issuer

    params = quota.QuotaParams(epoch_s=600, tokens=10**5, issuers=1, burst=10**5)
    signer = crypto.SigningKey.generate()
    issuer = Issuer(os.urandom(32), signer, CHAIN, params)
    user = Identity.generate()
    now = 1_800_000_000.0
    epoch = params.epoch_at(now)
    record = quota.decode_key_record(issuer.key_record(MODEL, epoch))
    batches = max(1, n // BATCH)
    nonces = [quota.new_nonces(BATCH) for _ in range(batches)]
    t = time.process_time()
    blindings = [quota.Blinding(ns) for ns in nonces]
    blind_ms = 1000 * (time.process_time() - t) / (batches * BATCH)
    requests = [quota.encode_issue(user, CHAIN, quota.IssueRequest(user.node_id, signer.public_bytes, MODEL, epoch,
                                                                   b.blinded)) for b in blindings]
    t = time.process_time()
    answers = [issuer.issue(r, now, lambda _: user.ed25519_public, lambda _: True) for r in requests]
    issue_ms = 1000 * (time.process_time() - t) / (batches * BATCH)
    assert all(code == 0 for code, _, _ in answers), answers[0]
    t = time.process_time()
    outputs = [b.finalize(quota.decode_issued(value), record.key) for b, (_, _, value) in zip(blindings, answers,
                                                                                               strict=True)]
    finalize_ms = 1000 * (time.process_time() - t) / (batches * BATCH)
    tokens = [quota.Token(MODEL, epoch, nonce, ((signer.public_bytes, out),))
              for ns, outs in zip(nonces, outputs, strict=True) for nonce, out in zip(ns, outs, strict=True)]
    raws = [quota.encode_token(tok) for tok in tokens]
    redeems = [tok.redeem(signer.public_bytes) for tok in tokens]
    t = time.process_time()
    codes = [issuer.redeem(r, now)[0] for r in redeems]
    redeem_ms = 1000 * (time.process_time() - t) / len(redeems)
    assert all(c == 0 for c in codes)
    t = time.process_time()
    for raw in raws:
        parse(raw, MODEL)
    screen_ms = 1000 * (time.process_time() - t) / len(raws)
    message = os.urandom(64)
    sig = signer.sign(message)
    sign_ms = _cpu_ms(lambda: signer.sign(message), 4 * n)
    verify_ms = _cpu_ms(lambda: crypto.ed25519_verify(signer.public_bytes, sig, message), 4 * n)
    return {
        "user_blind_ms_per_token": blind_ms, "user_finalize_ms_per_token": finalize_ms,
        "issuer_issue_ms_per_token": issue_ms, "issuer_redeem_ms_per_token": redeem_ms,
        "node_screen_ms_per_token": screen_ms, "ed25519_sign_ms": sign_ms, "ed25519_verify_ms": verify_ms,
        "issuer_issue_ratio_vs_ed25519_sign": issue_ms / sign_ms,
        "issuer_redeem_ratio_vs_ed25519_verify": redeem_ms / verify_ms,
    }


# --------------------------------------------------------------------------- shared: issuers behind an RPC

class Issuers:
    """``n`` real issuers (:class:`verifier.quota.Issuer`) answering the quota queries as
    :meth:`verifier.abci_app.CommitteeAbciApp.quota_query` routes them, every user registered,
    every model listed; times from trio's clock (the mock clock in the flood)."""

    def __init__(self, n: int, params: Any) -> None:
        from overlay.wire import crypto
        from verifier.quota import Issuer

        self.keys = [crypto.SigningKey.generate() for _ in range(n)]
        self.issuers = [Issuer(os.urandom(32), k, CHAIN, params) for k in self.keys]
        self.addresses = [f"10.9.0.{i + 1}:26657" for i in range(n)]
        self.users: dict[bytes, bytes] = {}

    async def rpc(self, address: str, method: str, params: dict[str, str]) -> Any:
        import base64

        from overlay.directory import quota
        from overlay.wire.clock import TrioClock

        await trio.lowlevel.checkpoint()
        issuer = self.issuers[self.addresses.index(address)]
        path = params["path"].strip('"')
        data = bytes.fromhex(params["data"][2:]) if "data" in params else b""
        now = TrioClock().unix()
        value = b""
        if path == quota.KEY_PATH:
            code, why, value = issuer.key_query(data, now)
        elif path == quota.ISSUE_PATH:
            code, why, value = issuer.issue(data, now, self.users.get, lambda _: True)
        else:
            code, why = issuer.redeem(data, now)
        return {"response": {"code": int(code), "log": why, "value": base64.b64encode(value).decode()}}

    def wallet(self, user: Any, top_only: bool = False, **kwargs: Any) -> Any:
        """A real wallet for ``user`` (registered here); ``top_only``: one that never takes standard
        tokens (:func:`_top_only_wallet`)."""
        from overlay.directory.wallet import Wallet

        self.users[user.identity.node_id] = user.identity.ed25519_public
        cls = _top_only_wallet() if top_only else Wallet
        return cls(user.identity, lambda: self.addresses, CHAIN, lambda: [k.public_bytes for k in self.keys],
                   rpc=self.rpc, **kwargs)

    def redeemer(self) -> Any:
        from model_node.quota import Redeemer

        return Redeemer(MODEL, lambda: self.addresses, CHAIN, rpc=self.rpc)


def _top_only_wallet() -> Any:
    """A modified client's wallet that takes priority tokens only (decision 0022): what the top of its
    allowances holds, never a standard token; with none to be had, its flood goes without (the
    flooder's best play: every token it spends is served first)."""
    from overlay.directory.quota import Allowance
    from overlay.directory.wallet import Wallet

    class TopOnly(Wallet):
        def _usable(self, allowance: Allowance, now: float) -> int:
            return allowance.top(now)

        def _ready(self, allowance: Allowance, now: float) -> float:
            return allowance.top_at(1, now)

    return TopOnly


async def _first_token(client: Any, text: str, max_tokens: int) -> float:
    """Seconds (trio's clock) from the request's start to its first chunk."""
    from overlay.wire.messages import ChatMessage, SamplingParams

    t0 = trio.current_time()
    first = None
    async for _ in client.request(MODEL, [ChatMessage("user", text)], SamplingParams(max_tokens=max_tokens),
                                  chunk_timeout=120):
        if first is None:
            first = trio.current_time() - t0
    assert first is not None
    return first


# --------------------------------------------------------------------------- 2. added TTFT

def added_ttft(n: int) -> dict[str, float]:
    from model_node.testing import echo_node
    from overlay.directory.quota import QuotaParams
    from overlay.testing import start_overlay

    async def play(tokens: bool) -> list[float]:
        # every token a priority one: the protocol's cost, one batch of 16 at a time (a user past the top of
        # its bucket fetches one standard token per request instead: decision 0022)
        issuers = Issuers(4, QuotaParams(epoch_s=600, tokens=1000, issuers=2, burst=1000, priority=1000))
        async with trio.open_nursery() as nursery:
            factory = echo_node(redeemer=issuers.redeemer() if tokens else None)
            net = await start_overlay(nursery, 15, models=[factory])
            user = net.client
            assert user.client is not None and user.paths is not None
            with trio.fail_after(60):
                await user.paths.wait_ready(user.client.n)
            if tokens:
                user.client.quota = issuers.wallet(user)
            for _ in range(3):  # warm-up (the first batch of tokens is fetched here)
                await _first_token(user.client, "warm up the paths", 2)
            out = [await _first_token(user.client, f"question {i} here", 2) for i in range(n)]
            nursery.cancel_scope.cancel()
        return out

    with_tokens: list[float] = []
    without: list[float] = []
    for _ in range(2):  # alternating, twice
        without += trio.run(play, False)
        with_tokens += trio.run(play, True)
    a, b = statistics.median(with_tokens), statistics.median(without)
    return {"ttft_p50_with_tokens_ms": 1000 * a, "ttft_p50_without_tokens_ms": 1000 * b,
            "ttft_added_p50_ms": 1000 * (a - b),
            "ttft_mean_with_tokens_ms": 1000 * statistics.fmean(with_tokens),
            "ttft_mean_without_tokens_ms": 1000 * statistics.fmean(without)}


def rpc_round_trip(n: int) -> dict[str, float]:
    """What the in-process RPC above leaves out: ``abci_query`` round trips of ``/quota/key`` (the
    cheapest quota query) to a real ``gentorrent verifier`` (CometBFT RPC over loopback HTTP), one
    verifier started for this. A redemption asks its issuers at once: it adds about one of these
    (the slowest issuer's)."""
    import tempfile
    from pathlib import Path

    from gentorrent.tools.localnet import LocalNet
    from overlay.directory import quota
    from overlay.directory.rpc import abci_query

    async def ask(address: str) -> list[float]:
        data = quota.encode_key_query(MODEL, quota.QuotaParams().epoch_at(time.time()))  # the genesis default
        out = []
        for _ in range(n + 3):
            t = time.perf_counter()
            answer = await abci_query(address, quota.KEY_PATH, data)
            out.append(time.perf_counter() - t)
            assert answer.code == 0, answer.log
        return out[3:]  # warm-up

    with tempfile.TemporaryDirectory(prefix="gentorrent-bench-quotas-") as d:
        with LocalNet(Path(d), 0, models=0, committee=1) as net:
            net.start_committee(timeout=120)
            times = sorted(trio.run(ask, net.rpc_address(net.verifiers[0])))
    return {"rpc_round_trip_p50_ms": 1000 * percentile(times, 50), "rpc_round_trip_p99_ms": 1000 * percentile(times, 99)}


# --------------------------------------------------------------------------- 3. the flood

MODES = {  # mode -> (quotas on, what the fifth user does)
    "noflood": (True, "idle"),  # quotas on, the fifth user sends nothing
    "fairshare": (True, "fair"),  # quotas on, the fifth user an honest one at exactly its fair share
    "tokens": (True, "flood"),  # quotas on, the fifth user floods at 10x (every token it can get, then none)
    "priority": (True, "flood_top"),  # the same flood, taking priority tokens only (never standard ones)
    "hoard": (True, "hoard"),  # quotas on, the flood, its tokens saved up and spent at once (the bucket's worst)
    "notokens": (False, "flood"),  # quotas off, the same flood
}


class _Hoard:
    """The hoarding flooder's token source: its wallet's tokens only when a burst is released
    (``allow``), so that its allowance fills up between bursts; without a token otherwise."""

    def __init__(self, wallet: Any) -> None:
        self.wallet, self.allow = wallet, 0

    async def token(self, model: str) -> bytes:
        if self.allow <= 0:
            return b""
        self.allow -= 1
        got: bytes = await self.wallet.token(model)
        return got


def flood(mode: str, duration: float, seeds: Sequence[int], epoch_s: int = EPOCH_S,
          burst: int = BURST, honest: int = HONEST, priority: int = PRIORITY) -> dict[str, float]:
    """Flood runs (module docstring, part 3) on trio's mock clock, one per seed (the honest users'
    arrivals), pooled: the honest users' TTFTs and busy refusals, and what the fifth user got.
    ``mode``: a key of :data:`MODES`; ``honest``: how many honest users share
    :data:`HONEST_LOAD` (the fair share is the node's capacity over them and the other user;
    figures of a count other than :data:`HONEST` are named ``..._users{honest + 1}``)."""
    from overlay.directory.quota import QuotaParams

    quotas, fifth = MODES[mode]
    fair = CAPACITY / (honest + 1)
    params = QuotaParams(epoch_s=epoch_s, tokens=math.ceil(fair * epoch_s), issuers=1, grace_s=GRACE_S, burst=burst,
                         priority=priority)
    out: dict[str, Any] = {"honest_ttft": [], "honest_busy": 0, "honest_sent": 0, "flood_sent": 0,
                           "flood_answered": 0}
    for seed in seeds:
        trio.run(_flood_run, params, quotas, fifth, duration, seed, out, honest,
                 clock=trio.testing.MockClock(autojump_threshold=0))
    ttft = sorted(out["honest_ttft"])
    name = mode if honest == HONEST else f"{mode}_users{honest + 1}"
    return {
        f"honest_ttft_p50_ms_{name}": 1000 * percentile(ttft, 50),
        f"honest_ttft_p99_ms_{name}": 1000 * percentile(ttft, 99),
        f"honest_busy_frac_{name}": out["honest_busy"] / max(1, out["honest_sent"]),
        f"flood_answered_frac_{name}": out["flood_answered"] / max(1, out["flood_sent"]),
        f"honest_requests_{name}": float(out["honest_sent"]),
    }


async def _flood_run(params: Any, quotas: bool, fifth: str, duration: float, seed: int, out: dict[str, Any],
                     honest: int) -> None:
    from model_node.testing import echo_node
    from overlay.anon.client import AnonError
    from overlay.testing import start_overlay
    from overlay.wire import clock

    # Unix time is anchored per run (not to this machine's clock): quota epochs start at a phase of
    # the run that the seed sets, so a run is the same wherever and whenever it is played
    phase = random.Random(seed).uniform(0, params.epoch_s)
    clock._UNIX_OFFSET.set(UNIX_ANCHOR + phase - trio.current_time())
    issuers = Issuers(1, params)
    async with trio.open_nursery() as nursery:
        factory = echo_node(delay=PIECE_S, slots=SLOTS, max_queue=8, max_queue_wait=10.0,
                            redeemer=issuers.redeemer() if quotas else None)
        net = await start_overlay(nursery, max(15, honest + 1), clients=honest + 1, models=[factory])
        for u in net.users[:honest + 1]:
            assert u.client is not None and u.paths is not None
            with trio.fail_after(120):
                await u.paths.wait_ready(u.client.n)
            if quotas:  # a flooder's wallet, as a modified client's, sends without a token when it has none
                flooder = u is net.users[0] and fifth != "fair"
                u.client.quota = issuers.wallet(u, top_only=flooder and fifth == "flood_top", send_when_used_up=flooder)
        end = trio.current_time() + duration
        text = " ".join(f"w{i}" for i in range(PIECES))

        async def one(client: Any, kind: str) -> None:
            try:
                ttft = await _first_token(client, text, PIECES)
                if kind == "honest":
                    out["honest_ttft"].append(ttft)
                else:
                    out["flood_answered"] += 1
            except AnonError:
                if kind == "honest":
                    out["honest_busy"] += 1

        async def sender(client: Any, rate: float, kind: str, i: int) -> None:
            rng = random.Random(seed * 1000 + i)  # each sender its own arrivals: the honest ones alike in every mode
            async with trio.open_nursery() as inner:
                while trio.current_time() < end:
                    await trio.sleep(rng.expovariate(rate))
                    out[f"{kind}_sent"] += 1
                    inner.start_soon(one, client, kind)

        async with trio.open_nursery() as senders:
            for i, u in enumerate(net.users[1:honest + 1], start=1):
                senders.start_soon(sender, u.client, HONEST_LOAD / honest, "honest", i)
            client = net.users[0].client
            fair = CAPACITY / (honest + 1)
            if fifth == "fair":
                senders.start_soon(sender, client, fair, "flood", 0)
            elif fifth in ("flood", "flood_top", "hoard"):
                senders.start_soon(sender, client, FLOOD_FACTOR * fair, "flood", 0)
            if fifth == "hoard" and quotas:
                senders.start_soon(_hoard, client, params, end)
        nursery.cancel_scope.cancel()


async def _hoard(client: Any, params: Any, end: float) -> None:
    """The hoarder: its flood goes without tokens while its allowance fills; once full (every
    ``burst`` x ``per_token_s`` s), the next ``burst`` flood requests take its tokens at once."""
    hoard = _Hoard(client.quota)
    client.quota = hoard
    while trio.current_time() + params.burst * params.per_token_s < end:
        await trio.sleep(params.burst * params.per_token_s)
        hoard.allow = params.burst


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    figures = costs(64 if quick else 2048)
    figures.update(added_ttft(3 if quick else 40))
    figures.update(rpc_round_trip(10 if quick else 200))
    duration = 30.0 if quick else 240.0
    seeds = FLOOD_SEEDS[:1] if quick else FLOOD_SEEDS
    for mode in MODES:
        figures.update(flood(mode, duration, seeds))
    base = figures["honest_ttft_p99_ms_noflood"]
    for mode in ("fairshare", "tokens", "priority", "hoard", "notokens"):
        figures[f"honest_ttft_p99_ratio_{mode}_vs_noflood"] = figures[f"honest_ttft_p99_ms_{mode}"] / base
    figures["honest_ttft_p99_ratio_tokens_vs_fairshare"] = (figures["honest_ttft_p99_ms_tokens"]
                                                            / figures["honest_ttft_p99_ms_fairshare"])
    many = f"users{MANY + 1}"
    for mode in MANY_MODES:
        figures.update(flood(mode, duration, seeds, honest=MANY))
    for mode in MANY_MODES[1:]:
        figures[f"honest_ttft_p99_ratio_{mode}_vs_noflood_{many}"] = (figures[f"honest_ttft_p99_ms_{mode}_{many}"]
                                                                     / figures[f"honest_ttft_p99_ms_noflood_{many}"])
    params = {
        "cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "voprf": "voprf 0.2.0 (RFC 9497, ristretto255-SHA512)",
        "batch": BATCH, "rpc": RPC_NOTE, "added_ttft": "echo node, in-memory overlay (15 users), n=4 k=3 cloves, "
        "4 issuers, 2 a token; medians of 2 alternating runs each way",
        "flood": {"clock": "trio MockClock (times are the schedule's)", "node": f"echo, {SLOTS} slots, "
                  f"{PIECES} pieces of {PIECE_S} s a reply, max queue 8, max wait 10 s",
                  "honest_users": HONEST, "honest_rate_per_s": HONEST_RATE, "fair_share_per_s": round(FAIR, 3),
                  "many_users": {"honest_users": MANY, "honest_rate_per_s": HONEST_LOAD / MANY,
                                 "fair_share_per_s": round(CAPACITY / (MANY + 1), 4), "modes": list(MANY_MODES),
                                 "figures": f"named ..._users{MANY + 1}"},
                  "flood_rate_per_s": round(FLOOD_FACTOR * FAIR, 3), "duration_s": duration,
                  "seeds": list(seeds), "pooled": "each mode's runs (one per seed) pooled before percentiles",
                  "quota": f"epoch {EPOCH_S} s, tokens = fair share x epoch (a token every {1 / FAIR:g} s), "
                           f"burst {BURST} (the top {PRIORITY} priority), grace {GRACE_S} s, 1 issuer a token",
                  "modes": {m: f"quotas {'on' if q else 'off'}, fifth user: {f}" for m, (q, f) in MODES.items()}},
    }
    return params, figures
