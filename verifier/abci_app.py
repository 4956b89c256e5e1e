"""The committee's ABCI application: a thin driver between the ABCI server and :class:`verifier.app.CommitteeApp`.

It translates protobuf requests into plain calls on the core and back, and persists the core's
state at each Commit through :class:`StateStore` (write a temp file, fsync, rename: a crash leaves
either the old state or the new one, never half of one). On restart the stored height and app hash
are what ``Info`` reports, and CometBFT replays the blocks after them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from overlay.directory import quota
from overlay.directory import transcripts as wire
from overlay.directory.donation import DONATE_PATH, KEY_PATH
from overlay.directory.registration import Code
from overlay.wire import crypto
from overlay.wire.clock import Clock, SystemClock
from overlay.wire.constants import ROLE_MODEL, ROLE_USER
from overlay.wire.identity import write_private
from verifier.abci.proto.tendermint.abci import types_pb2 as abci
from verifier.abci.proto.tendermint.types import validator_pb2
from verifier.admission import OPEN
from verifier.app import CommitteeApp, Validator
from verifier.audit import escrow_intake
from verifier.audit.escrow_intake import book_code
from verifier.audit.pool import MAX_DONATION_BYTES, DonationError, DonationPool
from verifier.audit.transcripts import WINDOW_MS, KeyOf, TranscriptBook, transcript_of
from verifier.quota import MAX_KEY_QUERY_BYTES, Issuer

log = logging.getLogger("gentorrent.verifier")
_M = TypeVar("_M", "wire.Commit", "wire.Reveal")

APP_NAME = "gentorrent-committee"
APP_VERSION = 1
STATE_FILE = "app_state.bin"
_QUOTA_LIMITS = {quota.KEY_PATH: MAX_KEY_QUERY_BYTES, quota.ISSUE_PATH: quota.MAX_ISSUE_BYTES,
                 quota.REDEEM_PATH: quota.MAX_REDEEM_BYTES}
VERSION1_REFUSED = ("this verifier takes no commitment without escrow: its donor could hide its good replies "
                    "(decision 0037); escrow it (/audit/transcript_escrow_commit, then /audit/transcript_certify), "
                    "as `gentorrent user` does with --committee")
_ESCROW_LIMITS = {wire.ESCROW_COMMIT_PATH: wire.MAX_ESCROW_COMMIT_BYTES, wire.CERTIFY_PATH: wire.MAX_CERTIFICATE_BYTES,
                  wire.NODE_REVEAL_PATH: wire.MAX_REVEAL_BYTES,
                  wire.RELEASED_PATH: max(escrow_intake.RELEASED_QUERY_LEN)}


class StateStore:
    """The core's committed state in ``data_dir/app_state.bin``."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(data_dir)
        self.path = self.dir / STATE_FILE

    def load(self) -> CommitteeApp:
        """The persisted app, or a fresh one if nothing was ever committed here.

        Raises :class:`verifier.app.StateError` if the file is corrupt: delete the data dir's
        ``app_state.bin`` *and* CometBFT's data to resync from the committee.
        """
        if not self.path.exists():
            return CommitteeApp()
        return CommitteeApp.restore(self.path.read_bytes())

    def save(self, snapshot: bytes) -> None:
        write_private(self.path, snapshot)


class CommitteeAbciApp:
    """Implements :class:`verifier.abci.server.Application` over a :class:`CommitteeApp`."""

    def __init__(self, core: CommitteeApp, store: StateStore | None = None,
                 signer: crypto.SigningKey | None = None, pool: DonationPool | None = None,
                 transcripts: TranscriptBook | None = None, clock: Clock | None = None,
                 issuer: Issuer | None = None, version1_commits: bool = False) -> None:
        """``signer``: this verifier's CometBFT validator key, which signs the lists in its vote
        extensions (:func:`verifier.cometbft.read_validator_key`); None sends empty extensions.
        ``pool``: the prompts users donate to this verifier (``gentorrent verifier --audit``;
        :mod:`verifier.audit.pool`), taken through the ``/audit/donate`` query; None refuses them.
        ``transcripts``: the book of users' committed transcripts (:mod:`verifier.audit.transcripts`,
        shared with the audit loop, which closes its epochs), fed through the
        ``/audit/transcript_commit`` and ``/audit/transcript_reveal`` queries; None refuses them.
        ``clock`` (default :class:`~overlay.wire.clock.SystemClock`: queries come from CometBFT, outside
        any test's trio clock) stamps when a commitment arrived and tells the quota epoch.
        ``issuer``: this verifier's quota issuer (:mod:`verifier.quota`; the genesis has an
        ``app_state.quota`` section), which answers the ``/quota/*`` queries; None refuses them.
        ``version1_commits`` (``gentorrent verifier --take-version1-commits``): also take
        commitments without escrow, which let a donor hide its good replies (decision 0037); off,
        ``/audit/transcript_commit`` is refused."""
        self.core = core
        self.store = store
        self.signer = signer
        self.pool = pool
        self.transcripts = transcripts
        self.clock: Clock = clock or SystemClock()
        self.issuer = issuer
        self.version1_commits = version1_commits
        self._models: tuple[tuple[int, int], frozenset[str]] = ((-1, 0), frozenset())  # (state seen, its models)
        self._epoch_seen: dict[int, int] = {}  # audit epoch -> when this verifier first saw it (ms, its clock)
        self._epoch_seed: dict[int, bytes] = {}  # audit epoch -> its seed (ranks the epoch before's release)
        self._release: dict[int, list[wire.ReleasedItem]] = {}  # epoch -> what it releases, once due

    # ----------------------------------------------------------------- info / genesis

    def info(self, req: abci.RequestInfo) -> abci.ResponseInfo:
        height, app_hash = self.core.info()
        log.info("Info: CometBFT %s asks; we are at height %d", req.version, height)
        return abci.ResponseInfo(data=APP_NAME, version="1", app_version=APP_VERSION,
                                 last_block_height=height, last_block_app_hash=app_hash)

    def init_chain(self, req: abci.RequestInitChain) -> abci.ResponseInitChain:
        vals = []
        for v in req.validators:
            kind = v.pub_key.WhichOneof("sum")
            if kind is None:
                raise ValueError("a genesis validator has no public key")
            vals.append(Validator(kind, getattr(v.pub_key, kind), v.power))
        app_hash = self.core.init_chain(req.chain_id, vals, bytes(req.app_state_bytes))
        audit = self.core.committed.audit
        rules = self.core.committed.admission
        if rules == OPEN:
            log.warning("InitChain: the genesis has no app_state.admission section: registration is OPEN (any "
                        "address, no proof of work, no caps, no address probes). Make public committees' genesis "
                        "with `gentorrent verifier genesis` (decision 0014)")
        else:
            log.info("InitChain: a %s network: proof of work %d bits, caps %d per IP and %d per prefix (0: none), "
                     "address probes %s", rules.network, rules.work_bits, rules.per_ip, rules.per_prefix,
                     "on" if rules.probe else "off")
        log.info("InitChain: chain %s with %d validators; %s", req.chain_id, len(vals),
                 "audits off (no app_state.audit in genesis)" if audit is None else
                 f"audits on: epochs of {audit.params.epoch_blocks} blocks, "
                 f"{audit.params.challenges_per_node} challenges per node from each verifier")
        return abci.ResponseInitChain(app_hash=app_hash)

    def query(self, req: abci.RequestQuery) -> abci.ResponseQuery:
        if req.path in (KEY_PATH, DONATE_PATH):
            code, why, value = self.donation(req.path, req.data)
            return abci.ResponseQuery(code=int(code), log=why, value=value, height=self.core.height)
        if req.path in (wire.COMMIT_PATH, wire.REVEAL_PATH):
            code, why = self.transcript(req.path, bytes(req.data))
            return abci.ResponseQuery(code=int(code), log=why, height=self.core.height)
        if req.path in _ESCROW_LIMITS:
            code, why, value = self.escrow_query(req.path, bytes(req.data))
            return abci.ResponseQuery(code=int(code), log=why, value=value, height=self.core.height)
        if req.path in _QUOTA_LIMITS:
            code, why, value = self.quota_query(req.path, bytes(req.data))
            return abci.ResponseQuery(code=int(code), log=why, value=value, height=self.core.height)
        result, value = self.core.query(req.path, req.data)
        return abci.ResponseQuery(code=int(result.code), log=result.log, key=req.data, value=value,
                                  height=self.core.height)

    def donation(self, path: str, data: bytes) -> tuple[Code, str, bytes]:
        """The donation queries, answered from this verifier's own keys and pool (never from the
        chain's state, which every verifier shares):

        - ``/audit/donate_key``: this verifier's Ed25519 validator public key, which donations are
          sealed to;
        - ``/audit/donate`` (data: a sealed donation, at most 16 KiB): code 0 when the pool took it,
          else the code and reason of :class:`verifier.audit.pool.DonationError`.

        Both answer AUDITS_OFF when this verifier keeps no pool (it does not run ``--audit``) or
        the chain has no audits."""
        if len(data) > MAX_DONATION_BYTES:
            return Code.OVERSIZE, f"a donation of {len(data)} bytes; at most {MAX_DONATION_BYTES}", b""
        if self.pool is None or self.signer is None:
            return Code.AUDITS_OFF, "this verifier takes no donated prompts (it does not run --audit)", b""
        if self.core.committed.audit is None:
            return Code.AUDITS_OFF, "this committee's genesis has no audit section", b""
        if path == KEY_PATH:
            return Code.OK, "", self.signer.public_bytes
        try:
            d = self.pool.offer(bytes(data), self.signer.private_bytes(), self._user_key, self._network_of)
        except DonationError as exc:
            log.info("donation refused: %s", exc)
            return exc.code, exc.reason, b""
        held = self.pool.count(donor=d.donor)
        log.info("donation taken from user node %s for %s (%d of theirs held, %d in the pool)", d.donor.hex()[:8],
                 d.model, held, len(self.pool))
        return Code.OK, f"taken; {held} of your prompts are waiting to be used", b""

    def _user_key(self, node_id: bytes) -> bytes | None:
        """The registered Ed25519 key of ``node_id`` if it is a current user node (committed state)."""
        rec = self.core.committed.nodes.get(node_id)
        return rec.ed25519_public if rec is not None and rec.entry.role == ROLE_USER else None

    def _network_of(self, node_id: bytes) -> str | None:
        """The network prefix of ``node_id``'s registered address (``"net 192.0.2.0/24"``;
        :func:`verifier.admission.cap_keys`), None if it has none that parses."""
        from overlay.directory.registration import TxError
        from verifier.admission import cap_keys

        rec = self.core.committed.nodes.get(node_id)
        if rec is None:
            return None
        try:
            return cap_keys(rec.entry.address)[1]
        except TxError:
            return None

    def _model_key(self, node_id: bytes, model: str) -> bytes | None:
        """The registered Ed25519 key of ``node_id`` if it is a current model node serving ``model``."""
        rec = self.core.committed.nodes.get(node_id)
        ok = rec is not None and rec.entry.role == ROLE_MODEL and rec.entry.model_id == model
        return rec.ed25519_public if ok and rec is not None else None

    def quota_query(self, path: str, data: bytes) -> tuple[Code, str, bytes]:
        """The quota queries (issue 31; :mod:`overlay.directory.quota` is the format), answered by
        this verifier's issuer (:mod:`verifier.quota`) from its own keys, counts and clock:

        - ``/quota/key`` (data: ``encode_key_query(model, epoch)``): the issuer's signed key record;
        - ``/quota/issue`` (data: a registered user's signed issue request): the ``Issued`` answer;
        - ``/quota/redeem`` (data: a token's redeem for this issuer): code 0 when spent now.

        Sizes are checked first (OVERSIZE); QUOTA_OFF when this verifier has no issuer (its genesis
        has no quota section); else the issuer's code and reason, never an exception."""
        limit = _QUOTA_LIMITS[path]
        if len(data) > limit:
            return Code.OVERSIZE, f"{len(data)} bytes; at most {limit}", b""
        if self.issuer is None:
            return Code.QUOTA_OFF, "this committee's genesis has no quota section", b""
        now = self.clock.unix()
        if path == quota.KEY_PATH:
            return self.issuer.key_query(data, now)
        if path == quota.ISSUE_PATH:
            code, why, value = self.issuer.issue(data, now, self._user_key, self._model_listed)
        else:
            code, why = self.issuer.redeem(data, now)
            value = b""
        if code:
            log.info("quota %s refused: %s (%d): %s", path.rsplit("/", 1)[-1], code.name, int(code), why)
        return code, why, value

    def _model_listed(self, model: str) -> bool:
        """Whether a current model node serves ``model`` (committed state; the set of models is made
        once per committed state, not per query)."""
        st = self.core.committed
        seen = (self.core.height, id(st))  # a commit moves the height; the id tells InitChain's state from none
        if self._models[0] != seen:
            self._models = (seen, frozenset(r.entry.model_id for r in st.nodes.values() if r.entry.role == ROLE_MODEL))
        return model in self._models[1]

    def transcript(self, path: str, data: bytes) -> tuple[Code, str]:
        """The transcript queries (decision 0015; :mod:`overlay.directory.transcripts` is the format), answered
        from this verifier's own book, key and clock:

        - ``/audit/transcript_commit`` (data: a signed commit, in the clear): only with
          ``version1_commits``: the commitment is noted in the book for the audit epoch the
          committed state is in, at this verifier's clock (:func:`take_commit`); else refused
          (code 9, :data:`VERSION1_REFUSED`): commitments are escrowed (:meth:`escrow_query`);
        - ``/audit/transcript_reveal`` (data: a sealed reveal): the transcript, or "no reply", for
          one of the donor's commitments (:func:`take_reveal`).

        Code 0 when taken, else the code and the reason (a refused reveal may have voided the
        donor's set: the reason says so). AUDITS_OFF when this verifier keeps no book (it does not
        run ``--audit``) or the chain has no audits."""
        limit = wire.MAX_COMMIT_BYTES if path == wire.COMMIT_PATH else wire.MAX_REVEAL_BYTES
        if len(data) > limit:
            return Code.OVERSIZE, f"{len(data)} bytes; at most {limit}"
        if self.transcripts is None or self.signer is None:
            return Code.AUDITS_OFF, "this verifier takes no transcripts (it does not run --audit)"
        audit = self.core.committed.audit
        if audit is None:
            return Code.AUDITS_OFF, "this committee's genesis has no audit section"
        if path == wire.COMMIT_PATH and not self.version1_commits:
            code, why = Code.UNSUPPORTED_VERSION, VERSION1_REFUSED
        elif path == wire.COMMIT_PATH:
            code, why = take_commit(self.transcripts, data, self.signer.public_bytes, self._user_key, audit.epoch,
                                    int(self.clock.unix() * 1000))
        else:
            code, why = take_reveal(self.transcripts, data, self.signer.private_bytes(), self.signer.public_bytes,
                                    self._user_key, self._model_key, window_ms=audit.params.reply_window_ms())
        if code:
            log.info("transcript %s refused: %s", "commit" if path == wire.COMMIT_PATH else "reveal", why)
        return code, why

    def escrow_query(self, path: str, data: bytes) -> tuple[Code, str, bytes]:
        """The queries of escrowed commitments (decision 0037; :mod:`verifier.audit.escrow_intake`),
        answered from this verifier's own book, key and clock and the committed validator set:

        - ``/audit/transcript_escrow_commit`` (data: a signed escrowed commit): held, and the value
          is this verifier's signed acceptance, when its shares check;
        - ``/audit/transcript_certify`` (data: a certificate): the commitment takes part in its set;
        - ``/audit/transcript_node_reveal`` (data: a model node's sealed reveal);
        - ``/audit/transcript_released`` (data: :func:`~overlay.directory.transcripts.released_query`):
          a page of an epoch's released shares, once epoch ``e + 1`` is the chain's release delay
          old here (:func:`~overlay.directory.transcripts.release_delay_s` of its reply window).

        Users' clients make the first two (``user_client.transcripts``), model nodes the last two
        (``model_node.reveals``)."""
        if len(data) > _ESCROW_LIMITS[path]:
            return Code.OVERSIZE, f"{len(data)} bytes; at most {_ESCROW_LIMITS[path]}", b""
        if self.transcripts is None or self.signer is None:
            return Code.AUDITS_OFF, "this verifier takes no transcripts (it does not run --audit)", b""
        audit = self.core.committed.audit
        if audit is None:
            return Code.AUDITS_OFF, "this committee's genesis has no audit section", b""
        now_ms = int(self.clock.unix() * 1000)
        self._note_epoch(audit.epoch, audit.seed, now_ms)
        validators = {v.public_key: v.power for v in self.core.committed.validators}
        book = self.transcripts
        window_ms = audit.params.reply_window_ms()
        delay_ms = wire.release_delay_s(audit.params.reply_window_s) * 1000
        value = b""
        if path == wire.ESCROW_COMMIT_PATH:
            code, why, value = escrow_intake.take_escrow_commit(book, data, self.signer, self._user_key, validators,
                                                                audit.epoch, now_ms)
        elif path == wire.CERTIFY_PATH:
            code, why = escrow_intake.take_certificate(book, data, self._user_key, validators, audit.epoch, now_ms)
        elif path == wire.NODE_REVEAL_PATH:
            code, why = escrow_intake.take_node_reveal(book, data, self.signer.private_bytes(), self.signer.public_bytes,
                                                       self._model_key, self._model_key, window_ms=window_ms)
        else:
            code, why, value = escrow_intake.released_page(
                self._release_list(book, data, audit.epoch, now_ms, delay_ms), data, audit.epoch, self._epoch_seen,
                now_ms, delay_ms=delay_ms)
        if code:  # a node asks for a release every tenth of the reply window until it is due: not worth a line each
            log.log(logging.DEBUG if code == Code.TOO_EARLY else logging.INFO, "%s refused: %s", path, why)
        return code, why, value

    # ----------------------------------------------------------------- mempool

    def check_tx(self, req: abci.RequestCheckTx) -> abci.ResponseCheckTx:
        result = self.core.check_tx(req.tx)
        if not result.ok:
            log.debug("CheckTx rejected a %d-byte tx: %s (%d): %s", len(req.tx), result.code.name,
                      int(result.code), result.log)
        return abci.ResponseCheckTx(code=int(result.code), log=result.log)

    # ----------------------------------------------------------------- consensus

    def prepare_proposal(self, req: abci.RequestPrepareProposal) -> abci.ResponsePrepareProposal:
        votes = [(v.validator.address, v.vote_extension) for v in req.local_last_commit.votes
                 if v.block_id_flag == validator_pb2.BLOCK_ID_FLAG_COMMIT]
        txs = self.core.prepare_proposal(list(req.txs), req.max_tx_bytes, req.time.seconds, req.height, votes)
        return abci.ResponsePrepareProposal(txs=txs)

    def process_proposal(self, req: abci.RequestProcessProposal) -> abci.ResponseProcessProposal:
        ok = self.core.process_proposal(list(req.txs), req.time.seconds, req.height, req.hash)
        if not ok:
            log.warning("ProcessProposal: rejecting block %d from %s: it holds an invalid transaction",
                        req.height, req.proposer_address.hex())
        status = abci.ResponseProcessProposal.ACCEPT if ok else abci.ResponseProcessProposal.REJECT
        return abci.ResponseProcessProposal(status=status)

    def extend_vote(self, req: abci.RequestExtendVote) -> abci.ResponseExtendVote:
        ext = b"" if self.signer is None else self.core.extend_vote(req.height, self.signer, req.hash, list(req.txs),
                                                                    req.time.seconds)
        return abci.ResponseExtendVote(vote_extension=ext)

    def verify_vote_extension(self, req: abci.RequestVerifyVoteExtension) -> abci.ResponseVerifyVoteExtension:
        ok = self.core.verify_vote_extension(req.height, req.hash, req.validator_address, req.vote_extension)
        if not ok:
            log.warning("VerifyVoteExtension: validator %s signed other lists at height %d; rejecting its vote",
                        req.validator_address.hex(), req.height)
        status = abci.ResponseVerifyVoteExtension.ACCEPT if ok else abci.ResponseVerifyVoteExtension.REJECT
        return abci.ResponseVerifyVoteExtension(status=status)

    def finalize_block(self, req: abci.RequestFinalizeBlock) -> abci.ResponseFinalizeBlock:
        results, app_hash = self.core.finalize_block(req.height, req.time.seconds, list(req.txs), req.hash)
        updates = [abci.ValidatorUpdate(pub_key={"ed25519": v.public_key}, power=v.power) for v in self.core.updates]
        for v in self.core.updates:
            log.info("FinalizeBlock %d: validator %s power %d", req.height, v.public_key.hex()[:16], v.power)
        return abci.ResponseFinalizeBlock(
            tx_results=[abci.ExecTxResult(code=int(r.code), log=r.log) for r in results], app_hash=app_hash,
            validator_updates=updates)

    def commit(self, req: abci.RequestCommit) -> abci.ResponseCommit:
        snapshot = self.core.commit()
        if self.store is not None:
            self.store.save(snapshot)
        if self.core.committed.audit is not None:
            audit = self.core.committed.audit
            self._note_epoch(audit.epoch, audit.seed, int(self.clock.unix() * 1000))
        return abci.ResponseCommit(retain_height=0)

    def _note_epoch(self, epoch: int, seed: bytes, now_ms: int) -> None:
        """When this verifier first saw audit ``epoch`` (the release of ``epoch - 1``'s shares waits
        on it; after a restart, when it first saw it again) and its seed (which ranks them)."""
        if epoch not in self._epoch_seen:
            self._epoch_seen = {e: t for e, t in self._epoch_seen.items() if e > epoch - 4}
            self._epoch_seed = {e: t for e, t in self._epoch_seed.items() if e > epoch - 4}
            self._release = {e: t for e, t in self._release.items() if e > epoch - 4}
            self._epoch_seen[epoch], self._epoch_seed[epoch] = now_ms, seed

    def _release_list(self, book: TranscriptBook, data: bytes, now_epoch: int, now_ms: int,
                      delay_ms: int) -> list[wire.ReleasedItem]:
        """What this verifier releases of ``book``'s epoch ``data`` names, chosen once, when first
        due (:func:`~verifier.audit.escrow_intake.release_list`); nothing before."""
        epoch = int.from_bytes(data[:8], "big")
        if epoch not in self._release and escrow_intake.release_due(epoch, now_epoch, self._epoch_seen, now_ms,
                                                                      delay_ms=delay_ms):
            self._release[epoch] = escrow_intake.release_list(book, epoch, self._epoch_seed[epoch + 1])
        return self._release.get(epoch, [])

    # ----------------------------------------------------------------- state sync (not offered)

    def list_snapshots(self, req: abci.RequestListSnapshots) -> abci.ResponseListSnapshots:
        return abci.ResponseListSnapshots()

    def offer_snapshot(self, req: abci.RequestOfferSnapshot) -> abci.ResponseOfferSnapshot:
        return abci.ResponseOfferSnapshot(result=abci.ResponseOfferSnapshot.REJECT)

    def load_snapshot_chunk(self, req: abci.RequestLoadSnapshotChunk) -> abci.ResponseLoadSnapshotChunk:
        return abci.ResponseLoadSnapshotChunk()

    def apply_snapshot_chunk(self, req: abci.RequestApplySnapshotChunk) -> abci.ResponseApplySnapshotChunk:
        return abci.ResponseApplySnapshotChunk(result=abci.ResponseApplySnapshotChunk.ABORT)


# --------------------------------------------------------------------------- transcripts (I/O-free)

def _opened(what: str, data: bytes, decode: Callable[[bytes], _M], verifier_pk: bytes,
            user_key: Callable[[bytes], bytes | None]) -> tuple[_M, None] | tuple[None, tuple[Code, str]]:
    """``decode(data)``, addressed to this verifier, from a registered user whose key signed it."""
    try:
        msg = decode(data)
    except wire.TranscriptError as exc:
        return None, (Code.UNSUPPORTED_VERSION if exc.unsupported_version else Code.MALFORMED, exc.reason)
    if msg.verifier != verifier_pk:
        return None, (Code.INVALID_FIELD, f"this {what} names another verifier's key; make one for each verifier "
                                          "with the key its /audit/donate_key answers")
    public = user_key(msg.donor)
    if public is None:
        return None, (Code.UNKNOWN_NODE, f"donor {msg.donor.hex()[:16]} is not a registered user node of this "
                                         "committee")
    try:
        if isinstance(msg, wire.Commit):
            wire.verify_commit(msg, public)
        else:
            wire.verify_reveal(msg, public)
    except wire.TranscriptError as exc:
        return None, (Code.BAD_SIGNATURE, exc.reason)
    return msg, None


def take_commit(book: TranscriptBook, data: bytes, verifier_pk: bytes, user_key: Callable[[bytes], bytes | None],
                epoch: int, now_ms: int) -> tuple[Code, str]:
    """A donor's commit (:func:`overlay.directory.transcripts.decode_commit`) into ``book`` for ``epoch`` at
    ``now_ms``: from a registered user (``user_key``), signed by it, to this verifier
    (``verifier_pk``), sent within :data:`~overlay.directory.transcripts.MAX_SKEW_MS` of ``now_ms`` (an old
    commit replayed would stand unrevealed and burn its donor). ``(code, reason)``; never raises."""
    c, refused = _opened("commit", data, wire.decode_commit, verifier_pk, user_key)
    if c is None:
        assert refused is not None
        return refused
    late = escrow_intake.skewed(c.sent_ms, now_ms)
    if late is not None:
        return Code.INVALID_FIELD, f"the commit: {late}"
    why = book.commit(c.donor, c.value, epoch, now_ms)
    if why is not None:
        return book_code(why), why
    return Code.OK, "committed: reveal the transcript (or that no reply came) before the next epoch's report"


def take_reveal(book: TranscriptBook, sealed: bytes, seed32: bytes, verifier_pk: bytes,
                user_key: Callable[[bytes], bytes | None], key_of: KeyOf, *,
                window_ms: int = WINDOW_MS) -> tuple[Code, str]:
    """A donor's sealed reveal (:func:`overlay.directory.transcripts.unseal`, then
    :func:`~overlay.directory.transcripts.decode_reveal`) into ``book``: a transcript for
    :meth:`~verifier.audit.transcripts.TranscriptBook.reveal` (``key_of``: a model node's
    registered key, if it serves the model; a node's signed "busy" too, decision 0044) or "no reply" for
    :meth:`~verifier.audit.transcripts.TranscriptBook.no_reply`. ``(code, reason)``; never raises."""
    try:
        plain = wire.unseal(seed32, sealed)
    except wire.TranscriptError as exc:
        return Code.MALFORMED, exc.reason
    r, refused = _opened("reveal", plain, wire.decode_reveal, verifier_pk, user_key)
    if r is None:
        assert refused is not None
        return refused
    b = r.body
    if isinstance(b, wire.NoReply):
        why = book.no_reply(r.donor, b.value)
        if why is not None:
            return book_code(why), why
        return Code.OK, "noted: a committed request got no reply, so this epoch's set of yours counts for nothing"
    why = book.reveal(r.donor, transcript_of(b), key_of, window_ms=window_ms)
    if why is not None:
        return book_code(why), why
    if b.busy:
        return Code.OK, ("taken: the node's signed busy refusal; this commitment is no sample, and the rest of its "
                         "set counts")
    return Code.OK, "taken: the transcript counts once every commitment of its epoch is revealed"
