"""The committee's ABCI application: a thin driver between the ABCI server and :class:`verifier.app.CommitteeApp`.

It translates protobuf requests into plain calls on the core and back, and persists the core's
state at each Commit through :class:`StateStore` (write a temp file, fsync, rename: a crash leaves
either the old state or the new one, never half of one). On restart the stored height and app hash
are what ``Info`` reports, and CometBFT replays the blocks after them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from overlay import crypto
from overlay.directory.constants import ROLE_USER
from overlay.directory.registration import Code
from overlay.donation import DONATE_PATH, KEY_PATH
from overlay.identity import write_private
from verifier.abci.proto.tendermint.abci import types_pb2 as abci
from verifier.abci.proto.tendermint.types import validator_pb2
from verifier.admission import OPEN
from verifier.app import CommitteeApp, Validator
from verifier.audit.pool import MAX_DONATION_BYTES, DonationError, DonationPool

log = logging.getLogger("gentorrent.verifier")

APP_NAME = "gentorrent-committee"
APP_VERSION = 1
STATE_FILE = "app_state.bin"


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
                 signer: crypto.SigningKey | None = None, pool: DonationPool | None = None) -> None:
        """``signer``: this verifier's CometBFT validator key, which signs the lists in its vote
        extensions (:func:`verifier.cometbft.read_validator_key`); None sends empty extensions.
        ``pool``: the prompts users donate to this verifier (``gentorrent verifier --audit``;
        :mod:`verifier.audit.pool`), taken through the ``/audit/donate`` query; None refuses them."""
        self.core = core
        self.store = store
        self.signer = signer
        self.pool = pool

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
            d = self.pool.offer(bytes(data), self.signer.private_bytes(), self._user_key)
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
        return abci.ResponseCommit(retain_height=0)

    # ----------------------------------------------------------------- state sync (not offered)

    def list_snapshots(self, req: abci.RequestListSnapshots) -> abci.ResponseListSnapshots:
        return abci.ResponseListSnapshots()

    def offer_snapshot(self, req: abci.RequestOfferSnapshot) -> abci.ResponseOfferSnapshot:
        return abci.ResponseOfferSnapshot(result=abci.ResponseOfferSnapshot.REJECT)

    def load_snapshot_chunk(self, req: abci.RequestLoadSnapshotChunk) -> abci.ResponseLoadSnapshotChunk:
        return abci.ResponseLoadSnapshotChunk()

    def apply_snapshot_chunk(self, req: abci.RequestApplySnapshotChunk) -> abci.ResponseApplySnapshotChunk:
        return abci.ResponseApplySnapshotChunk(result=abci.ResponseApplySnapshotChunk.ABORT)
