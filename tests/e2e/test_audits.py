"""Audits end to end (issues 14 and 27): 4 real ``gentorrent verifier --audit`` processes (real
CometBFT, short epochs), relays, and two real llama.cpp model nodes serving
``smollm2-135m-instruct``: one honest (the default Q4_1 GGUF), one dishonest (the same GGUF
re-quantized to Q2_K by llama.cpp's quantizer, registered under the default model's id:
:func:`simulations.degraded.dishonest_model`).

One of the four verifiers is Byzantine throughout: ``verifier-3`` runs in this process
(``InProcessVerifier``) so that a test-only hook (``AuditSettings.tamper``, never a flag) rewrites
its reports before it signs them: score 0 for every reply of the honest node (framing it) and 1.0
for every reply of the dishonest one (covering for it). Every verifier sends its own secret plan
of challenges (decision 0013); the chain takes each node's median over the verifiers.

Checks: epochs apply and every verifier reports the same app hash and reputation table; the
dishonest node falls below the 0.4 trust line within 5 applied epochs and is marked untrusted on
the signed model list (it stays listed so the audits reach it); the honest node stays trusted
despite the framing. Then a user chats with ``--donate-transcripts`` (decision 0015): its
committed requests are revealed to the verifiers, which score them and put transcript scores on
the chain. Every wait is bounded; nothing asserts on time.
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from gentorrent.tools.localnet import LocalNet, LocalNetError, cli, free_ports
from overlay.directory.lists import CommitteeClient, load_genesis

# serial: four verifiers, two llama.cpp model nodes and ten relays on the machine's cores judge the
# honest node by whether it answers in time. Scheduled beside the engine bench (2026-11-30, CI of
# 6a4cf4b), its challenges were lost on closed paths and refused as busy until it fell under the
# trust line: a test of the audits, not of how a 2-core machine shares itself out.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

MODEL = "smollm2-135m-instruct"
# at ~0.6-1 s a block: each model node answers 4 verifiers x 2 challenges of up to 256 tokens. At 100 blocks
# (a report window of 16) a challenge sent in the send window's last blocks had about 12 s for a 256-token
# reply that takes 13-15 s on one thread beside a second slot; in a clean-clone CI run (2026-12-02, serial)
# the honest node's replies to two of the three honest verifiers came after their reports in epochs 1 to 3,
# so those epochs were missed and the third scored 0 (MISS_LIMIT). 120 blocks: a report window of 20, and
# the same challenges spread over a fifth more time.
EPOCH_BLOCKS = 120
PER_NODE = 2
PRIVATE_VERIFIER = "verifier-0"  # holds one private conversation (--challenge-prompts)
PRIVATE_TURNS = ("Name a lake high in the Andes.", "How deep is it?")
TRUST_LINE = 400_000
EPOCHS = 5
BYZANTINE = "verifier-3"


class InProcessVerifier:
    """``gentorrent verifier --audit`` run in this process (a thread with its own trio loop), with the
    handle of a :class:`subprocess.Popen` that :class:`LocalNet` uses (poll, terminate, kill, wait)."""

    def __init__(self, data_dir: Path, settings: Any, log_path: Path) -> None:
        self.returncode: int | None = None
        self.data_dir, self.settings, self.log_path = data_dir, settings, log_path
        self._token: Any = None
        self._scope: trio.CancelScope | None = None
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, name="in-process verifier", daemon=True)
        self.thread.start()
        self._ready.wait(60)

    def _main(self) -> None:
        from verifier.run import run_verifier

        handler = logging.FileHandler(self.log_path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger = logging.getLogger("gentorrent")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._scope = scope
                self._ready.set()
                await run_verifier(self.data_dir, audit=self.settings, handle_signals=False)

        try:
            trio.run(main)
            self.returncode = 0
        except BaseException:
            logger.exception("the in-process verifier failed")
            self.returncode = 1
        finally:
            self._ready.set()
            logger.removeHandler(handler)
            handler.close()

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        if self.returncode is None and self._scope is not None:
            trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)

    kill = terminate

    def wait(self, timeout: float | None = None) -> int | None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise subprocess.TimeoutExpired(BYZANTINE, timeout or 0)
        return self.returncode


class AuditNet(LocalNet):
    """A :class:`LocalNet` whose verifiers audit (``--audit``; genesis with an ``audit`` section),
    whose ``model-1`` serves the dishonest model under the honest model's id, and whose
    ``verifier-3`` runs in this process with a tamper hook that frames ``model-0`` and covers for
    ``model-1`` in its reports."""

    def __init__(self, root: Path, dishonest: Path) -> None:
        super().__init__(root, 10, users=("donor",), models=2, model=MODEL, engine="llama.cpp", committee=4,
                         # a node queues up to 60 s rather than refusing "busy": on a loaded 2-core CI machine the
                         # challenges of 4 verifiers held it for over 10 s and refused the donor's chat (exit 5)
                         model_args=("--no-forwarding", "--threads", "1", "--slots", "2", "--max-queue-wait", "60"))
        self.dishonest = dishonest
        self.audit_ports = dict(zip(self.verifiers, free_ports(len(self.verifiers)), strict=True))
        self.tampered = 0

    def tamper(self, report: Any) -> Any:
        """Score 0 for the honest node's replies and 1.0 for the dishonest node's (a Byzantine verifier)."""
        from verifier.audit.tx import ReplyOutcome

        honest, dishonest = (self.entries[m].node_id for m in ("model-0", "model-1"))
        lie = {honest: 0, dishonest: 1_000_000}
        entries = tuple(replace(e, outcome=replace(e.outcome, score=lie[e.node_id]))
                        if isinstance(e.outcome, ReplyOutcome) and e.node_id in lie else e for e in report.entries)
        self.tampered += 1
        return replace(report, entries=entries)

    def spawn(self, name: str) -> None:
        if name != BYZANTINE:
            return super().spawn(name)
        from verifier.audit.loop import AuditSettings

        settings = AuditSettings(model=MODEL, listen=f"127.0.0.1:{self.audit_ports[name]}", tamper=self.tamper,
                                 committee=tuple(self.committee_addresses.split(",")))
        self.procs[name] = InProcessVerifier(self.root / name, settings, self.root / f"{name}.log")  # type: ignore[assignment]
        return None

    def init_committee(self) -> None:
        """Homes and genesis as usual, then the genesis gains ``app_state.audit`` (epochs of
        :data:`EPOCH_BLOCKS`, :data:`PER_NODE` challenges per node and verifier), in every copy.
        Every validator keeps the same power: the Byzantine one holds 1/4."""
        from verifier.audit.chain import AuditParams
        from verifier.cometbft import home_of

        super().init_committee()
        genesis = json.loads(self.genesis_file.read_text())
        genesis["app_state"]["audit"] = AuditParams(EPOCH_BLOCKS, PER_NODE).to_json()
        text = json.dumps(genesis, indent=2) + "\n"
        self.genesis_file.write_text(text)
        for v in self.verifiers:
            (home_of(self.root / v) / "config" / "genesis.json").write_text(text)

    def command(self, name: str) -> list[str]:
        cmd = super().command(name)
        if name in self.verifiers:
            cmd = [*cmd, "--audit", "--audit-model", MODEL, "--audit-listen", f"127.0.0.1:{self.audit_ports[name]}",
                   "--audit-committee", self.committee_addresses, "--log-level", "info"]
            if name == PRIVATE_VERIFIER:  # its operator's private prompts (decision 0030)
                path = self.root / "private-prompts.jsonl"
                path.write_text(json.dumps({"messages": [{"role": "user", "content": PRIVATE_TURNS[0]},
                                                         {"role": "assistant", "content": "Lake Titicaca."},
                                                         {"role": "user", "content": PRIVATE_TURNS[1]}]}) + "\n")
                cmd += ["--challenge-prompts", str(path)]
            return cmd
        if name == "model-1":
            i = cmd.index("--model")
            cmd[i + 1] = str(self.dishonest)
        return cmd

    def decoded(self, verifier: str, path: str) -> tuple[Any, int]:
        """``path``'s value on ``verifier``, unpacked, and its height; :class:`LocalNetError` for a
        non-zero code. (Not an override of :meth:`LocalNet.query`, which the net's own waits use.)"""
        answer = self.query(verifier, path, timeout=10)
        if answer.code:
            raise LocalNetError(f"{verifier} {path}: code {answer.code}: {answer.log}")
        return msgpack.unpackb(answer.value), answer.height


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditNet]:
    from simulations.degraded import dishonest_model

    root = tmp_path_factory.mktemp("audit-net")
    with AuditNet(root, dishonest_model()) as n:
        n.start_committee(timeout=180)
        n.start(timeout=300)
        yield n


def _same_state(net: AuditNet, tries: int = 40) -> tuple[bytes, list[Any]]:
    """Every verifier's ``/info`` app hash and ``/reputation`` table at one height (retried until
    the four answer at the same height)."""
    for _ in range(tries):
        answers = [(net.decoded(v, "/info"), net.decoded(v, "/reputation")) for v in net.verifiers]
        heights = {info[1] for info, rep in answers} | {rep[1] for info, rep in answers}
        if len(heights) == 1:
            hashes = {bytes(info[0][1]) for info, _ in answers}
            tables = [rep[0] for _, rep in answers]
            assert len(hashes) == 1, f"verifiers disagree on the app hash at height {heights}: {hashes}"
            assert all(t == tables[0] for t in tables), tables
            return hashes.pop(), tables[0]
        time.sleep(0.2)
    raise AssertionError("the verifiers never answered at one height")


def _model_list(net: AuditNet) -> dict[bytes, tuple[int | None, bool | None]]:
    """The signed model list as a client receives it: node id -> (reputation, audited)."""
    chain, vals = load_genesis(str(net.genesis_file))
    client = CommitteeClient(net.committee_addresses.split(","), chain, vals)
    return {e.node_id: (e.reputation, e.audited) for e in trio.run(client.refresh).models(MODEL)}


def test_audits_demote_the_dishonest_node_and_keep_the_honest_one_despite_a_byzantine_verifier(
        net: AuditNet) -> None:
    honest, dishonest = (net.entries[m].node_id for m in ("model-0", "model-1"))
    listed = _model_list(net)
    assert listed[honest][0] == listed[dishonest][0] == 500_000  # never audited: R(0)
    applied: set[int] = set()
    history: list[dict[bytes, int]] = []
    deadline = time.monotonic() + (EPOCHS + 3) * EPOCH_BLOCKS * 3.0
    fell_at = None
    last_epoch = -1
    outcomes: dict[int, list[Any]] = {}
    while fell_at is None or len(applied) < 3:
        assert len(applied) <= EPOCHS or fell_at is not None, f"the dishonest node stayed trusted: {history}"
        assert time.monotonic() < deadline, (f"only {len(applied)} epochs applied: {history} {outcomes}; see the "
                                             f"verifier logs in {net.root}")
        view, _ = net.decoded("verifier-0", "/audit")
        for o in view["outcomes"]:
            outcomes[o[0]] = o
            if o[1] == "applied":
                applied.add(o[0])
        if view["epoch"] != last_epoch:
            last_epoch = view["epoch"]
            _, table = _same_state(net)
            rep = {bytes(r[0]): r[1] for r in table}
            history.append(rep)
            assert rep.get(honest, 500_000) >= TRUST_LINE, f"the honest node fell below the line: {history} {outcomes}"
            if fell_at is None and rep.get(dishonest, 500_000) < TRUST_LINE:
                fell_at = len(applied)
        time.sleep(0.5)
    assert fell_at <= EPOCHS, history
    assert net.tampered >= len(applied) - 1, "the Byzantine verifier reported (its lies were on the chain)"
    # The signed model list carries what the chain decided: both nodes listed (the untrusted one
    # too, so audits reach it), with the chain's reputations (retried: the list trails the state
    # by a block, and an epoch may end in between). Whether the always-cheating node is still
    # under the line now is not asserted: it fell under it within EPOCHS (above), and one honest-
    # looking epoch can lift a mean (seen once: 0.467 after falling under 0.4; issue 28's note).
    for _ in range(20):
        _, table = _same_state(net)
        chain = {bytes(r[0]): r[1] for r in table}
        listed = _model_list(net)
        if all(listed[n][0] == chain.get(n, 500_000) for n in (honest, dishonest)):
            break
        time.sleep(0.5)
    assert all(listed[n][0] == chain.get(n, 500_000) for n in (honest, dishonest)), (listed, chain)
    honest_reputation, honest_audited = listed[honest]
    assert honest_reputation is not None and honest_reputation >= TRUST_LINE and honest_audited is True
    assert listed[dishonest][1] is True  # listed, with its reputation, whatever side of the line
    (net.root / "audit-figures.json").write_text(json.dumps({
        "outcomes": [outcomes[e] for e in sorted(outcomes)],
        "reputation_history": [{k.hex()[:8]: v for k, v in h.items()} for h in history]}, indent=1))
    print(f"\naudit figures in {net.root / 'audit-figures.json'}: {len(applied)} epochs applied, dishonest node "
          f"untrusted after {fell_at}; history {[{k.hex()[:6]: v for k, v in h.items()} for h in history]}")


def test_a_donors_transcripts_are_scored_on_the_chain(net: AuditNet) -> None:
    """A user who donates every request (rate 1): each is committed to the four verifiers before it
    is sent (escrowed: commit, then certify; decision 0037) and revealed after with its secret; once a verifier's report of the next epoch is on the chain, it
    closes the donor's set, scores it and submits transcript scores (kind 3), which the epoch's
    outcome counts."""
    config = net.config_toml("donor", net.root / "donor.toml")
    start = net.decoded("verifier-0", "/audit")[0]["epoch"]
    # a vote takes MIN_TRANSCRIPTS (4) transcripts of one node: two chats of 4 and 2 turns (a
    # conversation of up to 4 turns fits an opening's 8 messages), all to the trusted node
    chats = (("Name three rivers in Europe.", "Which is the longest?", "Where does it rise?", "Which seas does it reach?"),
             ("Name two mountains in Asia.", "Which is the higher?"))
    r = None
    for prompts in chats:
        r = subprocess.run(cli("user", "chat", "--config", str(config), "--donate-transcripts",
                               "--donate-transcripts-rate", "1", "--max-tokens", "48", "--log-level", "info",
                               *(x for p in prompts for x in ("--prompt", p))),
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "donate: revealed" in r.stderr, r.stderr[-3000:]  # chat waits for its reveals at exit
        # the devnet's committee has four verifiers of equal power: the client escrows (decision 0037)
        assert "donate: revealed the escrowed transcript" in r.stderr, r.stderr[-3000:]
    assert r is not None
    wait_transcript_scores(lambda: net.decoded("verifier-0", "/audit")[0], start,
                           time.monotonic() + 4 * EPOCH_BLOCKS * 3.0,
                           f"chat log: {r.stderr[-2000:]}; verifier logs in {net.root}")


def wait_transcript_scores(view: Callable[[], dict[str, Any]], start: int, deadline: float, where: str) -> None:
    """Until a verifier's ``/audit`` (``view``) shows transcript scores taken this epoch or in an
    outcome from epoch ``start`` on; fails at ``deadline`` (``time.monotonic``), naming ``where``."""
    while True:
        doc = view()
        seen = [o for o in doc["outcomes"] if o[0] >= start]
        if doc["transcribed"] or any("with transcript scores" in o[2] for o in seen):
            return
        assert time.monotonic() < deadline, f"no transcript scores on the chain since epoch {start}: {seen}; {where}"
        time.sleep(1.0)


def audit_reports(net: AuditNet, first: int) -> tuple[list[Any], int]:
    """Every audit report on the chain from height ``first`` on, decoded as the chain decodes it,
    and the height read up to."""
    from overlay.directory.rpc import call_sync
    from verifier.audit import tx as at

    rpc = net.committee_addresses.split(",")[0]
    top = int(call_sync(rpc, "status")["sync_info"]["latest_block_height"])
    out = []
    for h in range(first, top + 1):
        for raw in call_sync(rpc, "block", {"height": str(h)})["block"]["data"]["txs"] or ():
            data = base64.b64decode(raw)
            if data.startswith(at.AUDIT_TAG) and isinstance(tx := at.decode_audit_tx(data, net.chain_id),
                                                            at.AuditReport):
                out.append(tx)
    return out, top


def test_a_donated_conversation_is_sent_as_a_script_of_its_user_turns(net: AuditNet) -> None:
    """A user of the OpenAI gateway with ``--donate-prompts`` (rate 1) sends a conversation of two
    user turns with the reply it got: the gateway donates it to one verifier (its user turns, not
    the reply: decision 0027, pinned by tests/unit/test_donate.py); that verifier's next plan
    challenges a model node with it, one that did not serve the donor (decision 0029), and its
    report, once on the chain, holds the script: both turns, no assistant message, the user's
    parameters."""
    config = net.config_toml("donor", net.root / "donor-serve.toml")
    port = free_ports(1)[0]
    log_path = net.root / "donor-serve.log"
    first = int(net.decoded("verifier-0", "/audit")[1])
    turns = ("Name a large lake in Africa.", "Which countries does it touch?")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cli("user", "serve", "--config", str(config), "--port", str(port), "--donate-prompts",
                                    "--donate-rate", "1", "--log-level", "info"),
                                stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while b"READY http" not in log_path.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        body = {"model": MODEL, "max_tokens": 32, "messages": [
            {"role": "user", "content": turns[0]}, {"role": "assistant", "content": "Lake Victoria."},
            {"role": "user", "content": turns[1]}]}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as answer:
            assert answer.status == 200
            served = answer.headers["x-gentorrent-node"].split(",")
        deadline = time.monotonic() + 180  # donations wait 0-60 s, so they are not timed to the request
        while b"a prompt was donated" not in log_path.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.5)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # the next plan draws it (donated prompts first); its report comes at that epoch's end
    deadline = time.monotonic() + 4 * EPOCH_BLOCKS * 3.0
    found: list[Any] = []
    while not found:
        assert time.monotonic() < deadline, f"no report on the chain carries the donated turns; logs in {net.root}"
        time.sleep(5.0)
        reports, top = audit_reports(net, first)
        found = [e for rep in reports for e in rep.entries if any(m.content == turns[1] for m in e.opening.messages)]
        first = top + 1
    (entry,) = found  # a donated prompt is used once
    assert [(m.role, m.content) for m in entry.opening.messages] == [("user", t) for t in turns]  # not the reply
    assert entry.opening.model == MODEL and entry.opening.params.max_tokens == 32  # the user's parameters
    assert entry.node_id.hex() not in served  # never the node that read it (decision 0029)


def test_an_operators_private_conversation_is_sent_once_as_a_script(net: AuditNet) -> None:
    """``verifier-0`` runs with ``--challenge-prompts`` naming a file of one conversation (two user
    turns and a reply): a plan of that verifier challenges a node with it (after users' donations,
    before the built-in generator: decision 0030), its report on the chain holds the script (both
    user turns, not the reply), it is used once, and the verifier keeps its keys as used."""
    from verifier.audit.corpus import USED_FILE, read_corpus

    deadline = time.monotonic() + 4 * EPOCH_BLOCKS * 3.0
    first, found = 1, []
    while True:
        reports, top = audit_reports(net, first)
        found += [e for rep in reports for e in rep.entries if any(m.content == PRIVATE_TURNS[1]
                                                                   for m in e.opening.messages)]
        if found:
            break
        assert time.monotonic() < deadline, f"no report on the chain carries the private turns; logs in {net.root}"
        first = top + 1
        time.sleep(5.0)
    (entry,) = found  # used once
    assert [(m.role, m.content) for m in entry.opening.messages] == [("user", t) for t in PRIVATE_TURNS]
    assert entry.opening.model == MODEL
    corpus = read_corpus(net.root / "private-prompts.jsonl")
    assert corpus.left() == 1
    corpus.take_used((net.root / PRIVATE_VERIFIER / USED_FILE).read_bytes())
    assert corpus.left() == 0  # the verifier wrote its keys as used
