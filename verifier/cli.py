"""``gentorrent verifier`` (run), ``gentorrent verifier init`` and ``gentorrent verifier genesis``.

Light on purpose: everything heavy is imported inside the run functions.

A committee by hand (see docs/committee.md)::

    gentorrent verifier init --data-dir v0 --p2p 127.0.0.1:26656 --rpc 127.0.0.1:26657
    gentorrent verifier init --data-dir v1 --p2p 127.0.0.1:26666 --rpc 127.0.0.1:26667
    gentorrent verifier genesis --chain-id my-committee --out genesis.json --install v0 v1
    gentorrent verifier --data-dir v0 &  gentorrent verifier --data-dir v1
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gentorrent.cli import CliError, common_flags, resolve_config, run_async

# verifier/audit/chain.py's defaults, repeated here so that the CLI stays light to import (a test checks them)
_DEFAULT_AUDIT_MODEL = "smollm2-135m-instruct"
_DEFAULT_EPOCH_BLOCKS = 900
_DEFAULT_CHALLENGES = 4
# overlay/directory/transcripts.py's reply window (decision 0040), likewise
_DEFAULT_REPLY_WINDOW = 600
_MIN_REPLY_WINDOW = 10
_MAX_REPLY_WINDOW = 600
# overlay/directory/quota.py's QuotaParams defaults, likewise (tests/unit/test_quota_issuer.py checks them)
_DEFAULT_QUOTA_TOKENS = 6
_DEFAULT_QUOTA_EPOCH_S = 60
_DEFAULT_QUOTA_ISSUERS = 2
_DEFAULT_QUOTA_GRACE_S = 15
_DEFAULT_QUOTA_BURST = 16
_DEFAULT_QUOTA_PRIORITY = 4


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "verifier", help="run a verifier of the committee (a CometBFT validator plus GenTorrent's ABCI application)",
        description="Run a verifier: serve GenTorrent's ABCI application and start and supervise CometBFT on it. "
                    "Set a verifier up first with 'gentorrent verifier init' and 'gentorrent verifier genesis'.",
    )
    common_flags(p)
    p.add_argument("--abci", metavar="ADDR", default=None,
                   help="ABCI listen address: unix:///PATH or tcp://127.0.0.1:PORT (default unix://DATA_DIR/abci.sock); "
                        "loopback or unix only")
    p.add_argument("--audit", action="store_true",
                   help="take part in the committee's audits (docs/committee.md \"Audits\"): each epoch, commit "
                        "a secret plan, challenge the model nodes of --audit-model through the overlay like a user "
                        "(users' donated prompts first, kept in DATA_DIR/audit-pool.msgpack, then "
                        "--challenge-prompts), score their replies and report. Runs a user node of the overlay "
                        "registered with the committee (identity in DATA_DIR/audit-user), loads --audit-model with "
                        "llama.cpp and takes donated prompts (abci_query /audit/donate). Off by default")
    p.add_argument("--audit-model", metavar="ID|PATH", default=None,
                   help="the model this verifier holds, audits and scores with, as a model id (default: "
                        "smollm2-135m-instruct, the default GGUF) or a .gguf path; it is declared in each plan "
                        "commit, and a model is audited while verifiers with more than 2/3 of the power hold it")
    p.add_argument("--audit-listen", metavar="HOST:PORT", default="127.0.0.1:0",
                   help="where the audit user node listens; it registers this address with the committee, so "
                        "relays must reach it (default 127.0.0.1:0: any free loopback port)")
    p.add_argument("--audit-region", default="default", help="the audit user node's region (default: default)")
    p.add_argument("--audit-committee", metavar="HOST:PORT,...", default="",
                   help="the CometBFT RPC addresses of the committee's verifiers (this one's included): the audit user "
                        "registers and takes its usage-quota tokens through them like any user, so that challenges "
                        "carry tokens as users' requests do (a token needs the evaluations of the genesis's "
                        "quota issuers, 2 by default: with this verifier's RPC alone it cannot get any, and its "
                        "challenges go without; default: this verifier's RPC only)")
    p.add_argument("--audit-threads", type=int, default=1, metavar="N",
                   help="llama.cpp threads for scoring (default 1: a verifier shares its host with CometBFT)")
    p.add_argument("--transcript-budget", type=int, default=None, metavar="TOKENS",
                   help="the most work spent scoring users' donated transcripts an epoch, in tokens scored (a "
                        "reply's tokens and a quarter of its prompt's bytes); past it, each model node's share is "
                        "a random part of its transcripts, half of the budget shared equally among the nodes and half "
                        "by their donors (decisions 0033, 0035). "
                        "Default: 49152 per --audit-threads, about 8 minutes of one llama.cpp thread of a 2-core "
                        "cloud machine on users' typical transcripts, 10 on long ones, within a 15-minute epoch "
                        "(docs/benchmarks.md \"transcript-scoring\"). The audits need about 6144 a model node "
                        "(one --audit-threads for every 8 nodes; decisions 0034, 0035); the verifier warns when it "
                        "has less. Raise it only with the capacity to score it (a faster host, more threads)")
    p.add_argument("--take-version1-commits", action="store_true",
                   help="with --audit: also take users' transcript commitments without escrow, from clients of "
                        "before decision 0037. A donor who commits so can withhold its good replies and reveal its "
                        "bad ones, and a few registered identities an epoch can then sink an honest node: use it "
                        "only while such clients are upgraded. Off: they are refused, and escrowed commitments "
                        "(whose withheld replies the model node hands in) are the only ones taken")
    p.add_argument("--challenge-prompts", metavar="FILE", default=None,
                   help="this operator's own secret challenge prompts: JSON Lines, one conversation a line, "
                        '{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]} (replies '
                        "are dropped: the node's own take their places). Each is used once, ever, after users' "
                        "donated prompts and before the built-in template (which a cheating node recognises); the "
                        "used ones are kept in DATA_DIR/audit-corpus-used.msgpack. Keep the file secret: a node "
                        "holding it recognises every challenge from it. Write conversations like those users "
                        "send this model, of several user turns: a node tells single-turn challenges from users' "
                        "conversations by their shape (docs/benchmarks.md \"audit-evasion\" part H: its best "
                        "detector's AUC 0.84 for single turns, 0.56 for conversations; decision 0030). It takes up "
                        "to challenges per node per epoch x audited nodes x epochs prompts (4 x 10 nodes x 96 "
                        "epochs a day of 15 minutes = 3,840 a day), less what donations cover. A file with a line it cannot "
                        "take stops the verifier at start, naming the line")
    p.set_defaults(run=_run)
    verbs = p.add_subparsers(dest="verifier_command", metavar="SUBCOMMAND")

    i = verbs.add_parser("init", help="create this verifier's CometBFT home and keys in DATA_DIR/cometbft",
                         description="Run 'cometbft init' in DATA_DIR/cometbft and configure it for GenTorrent.")
    common_flags(i)
    i.add_argument("--p2p", metavar="HOST:PORT", default="127.0.0.1:26656",
                   help="CometBFT peer-to-peer listen address that other verifiers dial (default 127.0.0.1:26656)")
    i.add_argument("--rpc", metavar="HOST:PORT", default="127.0.0.1:26657",
                   help="CometBFT RPC listen address (default 127.0.0.1:26657)")
    i.add_argument("--moniker", default=None, help="this verifier's name in genesis (default: the data dir's name)")
    i.add_argument("--timeout-commit", default="1s", metavar="DURATION",
                   help="CometBFT's wait after a commit before the next height (default 1s)")
    i.set_defaults(run=_init)

    g = verbs.add_parser("genesis", help="make a committee's genesis from its members' validator keys",
                         description="Write a genesis naming the validator key of every DATA_DIR given; with "
                                     "--install, also copy it into each and make each peer with the others.")
    g.add_argument("data_dirs", nargs="+", metavar="DATA_DIR", help="members' data dirs (after 'verifier init')")
    g.add_argument("--out", required=True, metavar="FILE", help="where to write genesis.json")
    g.add_argument("--chain-id", default="gentorrent-committee", help="the committee's chain id")
    g.add_argument("--power", type=int, default=10, help="voting power of each member (default 10)")
    g.add_argument("--install", action="store_true",
                   help="copy the genesis into each DATA_DIR and set their persistent peers to each other")
    g.add_argument("--audits", action="store_true",
                   help="turn audits on (docs/committee.md \"Audits\"): every verifier run with --audit audits "
                        "the model nodes of the models it holds; without --audits the genesis has no audit section "
                        "and audits are off")
    g.add_argument("--epoch-blocks", type=int, default=_DEFAULT_EPOCH_BLOCKS, metavar="E",
                   help=f"blocks per audit epoch (default {_DEFAULT_EPOCH_BLOCKS}: 15 minutes at 1-s blocks, as long "
                        "as a user's path lives, so that challenges' paths look like users' (decision 0026); "
                        "a network on one machine may take 120)")
    g.add_argument("--challenges-per-node", type=int, default=_DEFAULT_CHALLENGES, metavar="K",
                   help=f"challenges each verifier sends each audited node per epoch, 1-4 (default "
                        f"{_DEFAULT_CHALLENGES})")
    g.add_argument("--reply-window", type=int, default=_DEFAULT_REPLY_WINDOW, metavar="S",
                   help=f"seconds after its commitment a donated request's reply may be signed and still count, "
                        f"{_MIN_REPLY_WINDOW}-{_MAX_REPLY_WINDOW} (default {_DEFAULT_REPLY_WINDOW}, also the most). "
                        "It times the verifiers' release of what donors withheld, which model nodes hand in: an "
                        "epoch must last that release and two of the nodes' polls before its report window (780 s "
                        "at the default, 2.2 times the window under a minute), or framing donors go unanswered "
                        "(docs/committee.md \"Timing\", decision 0040). Too short, and honest donors' slow replies "
                        "count as late and void their sets")
    g.add_argument("--local-network", action="store_true",
                   help="a network on one machine or a private LAN (devnet, tests): loopback and private addresses "
                        "are listed, with no caps per IP or prefix and no proof of work (addresses are still "
                        "probed). Default: a public network, where a registration needs a globally routable "
                        "address, pays a proof of work that grows with the registration rate, and counts against "
                        "caps per IP and per network prefix (docs/committee.md \"Admission\")")
    g.add_argument("--no-address-probes", action="store_true",
                   help="list registrations without dialling their addresses first (test networks whose nodes "
                        "do not listen); never on a real network: anyone could then claim any address")
    g.add_argument("--work-bits", type=int, default=None, metavar="N",
                   help="proof of work a new key pays at a normal registration rate, in bits (public default 6: "
                        "about 2 s of one core; each bit doubles it)")
    _quota_flags(g)
    g.set_defaults(run=_genesis)

    a = verbs.add_parser("approve", help="sign this verifier's approval of a committee change",
                         description="Print this validator's approval (PUBKEY_HEX:SIGNATURE_HEX) of change SEQ: "
                                     "set validator KEY's power (0 removes it). A change applies with approvals "
                                     "from more than 2/3 of the current voting power (see 'verifier change').")
    common_flags(a)
    _change_flags(a)
    a.set_defaults(run=_approve)

    c = verbs.add_parser("change", help="submit a committee change with its approvals",
                         description="Broadcast a committee change (join, leave, power) with the approvals that "
                                     "'verifier approve' printed on the validators, to a verifier's RPC.")
    _change_flags(c)
    c.add_argument("--rpc", required=True, metavar="HOST:PORT", help="a verifier's CometBFT RPC address")
    c.add_argument("approvals", nargs="+", metavar="APPROVAL", help="PUBKEY_HEX:SIGNATURE_HEX, one per approver")
    c.set_defaults(run=_change)


def _quota_flags(g: argparse.ArgumentParser) -> None:
    g.add_argument("--no-quota", action="store_true",
                   help="leave the app_state.quota section out: no verifier issues anonymous usage tokens "
                        "(/quota queries answer QUOTA_OFF), so model nodes cannot ask for them. Default: quotas "
                        "on, with the settings below (docs/committee.md \"Quotas\")")
    g.add_argument("--quota-tokens", type=int, default=_DEFAULT_QUOTA_TOKENS, metavar="N",
                   help=f"evaluations by which every verifier's allowance for one registered user and model grows "
                        f"per quota epoch, 1-100000 (default {_DEFAULT_QUOTA_TOKENS}); a token (one request) takes "
                        "one from each of K verifiers (--quota-issuers), so a user makes at most about N x "
                        "DATA_DIRs / K requests of a model per epoch, after a first burst (--quota-burst)")
    g.add_argument("--quota-burst", type=int, default=_DEFAULT_QUOTA_BURST, metavar="B",
                   help=f"the most a user's allowance at one verifier holds, 1-100000 (default "
                        f"{_DEFAULT_QUOTA_BURST}): what a user who was idle may take at once; the allowance fills "
                        "again at --quota-tokens per epoch (a token bucket, decision 0018)")
    g.add_argument("--quota-priority", type=int, default=_DEFAULT_QUOTA_PRIORITY, metavar="P",
                   help=f"how many of a full allowance's tokens are priority ones, 1-100000 (default "
                        f"{_DEFAULT_QUOTA_PRIORITY}; --quota-burst or more: all): a user keeping to its rate gets "
                        "priority tokens; what a burst takes beyond the top P is standard, served after priority "
                        "tokens and before requests without (decision 0022)")
    g.add_argument("--quota-epoch-s", type=int, default=_DEFAULT_QUOTA_EPOCH_S, metavar="S",
                   help=f"seconds per quota epoch, 10-86400 (default {_DEFAULT_QUOTA_EPOCH_S}): each epoch has its "
                        "own keys and a token is good in its epoch only (plus --quota-grace-s), so short epochs "
                        "keep users from saving tokens up for one large burst")
    g.add_argument("--quota-issuers", type=int, default=None, metavar="K",
                   help=f"distinct verifiers whose evaluations one token carries, 1-8 and at most the number of "
                        f"DATA_DIRs (default {_DEFAULT_QUOTA_ISSUERS}, or 1 for a committee of one): no fewer "
                        "than K verifiers together can mint a token")
    g.add_argument("--quota-grace-s", type=int, default=None, metavar="S",
                   help=f"seconds after its epoch's end a token still redeems (clock skew, a request sent just "
                        f"before the end), under --quota-epoch-s (default {_DEFAULT_QUOTA_GRACE_S}, or half "
                        "the epoch if that is less)")


def _quota_section(args: argparse.Namespace) -> dict[str, int] | None:
    """The genesis's ``app_state.quota`` from the flags (None with --no-quota)."""
    from overlay.directory.quota import QuotaError, QuotaParams

    if args.no_quota:
        return None
    validators = len(args.data_dirs)
    issuers = min(_DEFAULT_QUOTA_ISSUERS, validators) if args.quota_issuers is None else args.quota_issuers
    if issuers > validators:
        raise CliError(f"--quota-issuers {issuers}: a token needs that many verifiers, and the committee has "
                       f"{validators}")
    grace = min(_DEFAULT_QUOTA_GRACE_S, args.quota_epoch_s // 2) if args.quota_grace_s is None else args.quota_grace_s
    try:
        return QuotaParams(args.quota_epoch_s, args.quota_tokens, issuers, grace, args.quota_burst,
                           args.quota_priority).to_json()
    except QuotaError as exc:
        raise CliError(f"--quota-*: {exc.reason}") from None


def _change_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chain-id", required=True, help="the committee's chain id")
    p.add_argument("--key", required=True, metavar="BASE64",
                   help="the validator's Ed25519 public key, base64 (as 'verifier init' prints it)")
    p.add_argument("--power", type=int, required=True, help="its new voting power; 0 removes it")
    p.add_argument("--seq", type=int, required=True,
                   help="the change's number: one above the last (abci_query path \"/validators\" shows it)")


def _change_key(args: argparse.Namespace) -> bytes:
    import base64
    import binascii

    try:
        key = base64.b64decode(args.key, validate=True)
    except binascii.Error:
        key = b""
    if len(key) != 32:
        raise CliError("--key must be a base64 Ed25519 public key (32 bytes)")
    return key


def _approve(args: argparse.Namespace) -> int:
    from verifier.cometbft import CometError, read_validator_key
    from verifier.quorum import approve

    try:
        me = read_validator_key(_data_dir(args))
        pub, sig = approve(me, args.chain_id, args.seq, _change_key(args), args.power)
    except (CometError, ValueError) as exc:
        raise CliError(str(exc)) from None
    print(f"{pub.hex()}:{sig.hex()}")
    return 0


def _change(args: argparse.Namespace) -> int:
    import trio

    from overlay.directory.rpc import Committed, RpcError, broadcast_tx_commit
    from verifier.quorum import make_change, parse_approval

    try:
        raw = make_change(args.seq, _change_key(args), args.power, [parse_approval(a) for a in args.approvals])
    except ValueError as exc:
        raise CliError(str(exc)) from None

    async def send() -> Committed:
        with trio.fail_after(60):
            return await broadcast_tx_commit(args.rpc, raw)

    try:
        done = trio.run(send)
    except RpcError as exc:
        raise CliError(f"the verifier refused the change: {exc}") from None
    except (OSError, ValueError, trio.TooSlowError) as exc:
        raise CliError(f"could not reach the verifier's RPC at {args.rpc}: {exc or type(exc).__name__}") from None
    refused = done.refused()
    if refused is not None:
        stage, answer = refused
        raise CliError(f"the change was refused ({stage} code {answer.code}): {answer.log}")
    print(f"committee change {args.seq} committed at height {done.height}; CometBFT applies it two "
          "heights later")
    return 0


def _data_dir(args: argparse.Namespace) -> str:
    cfg = resolve_config(args)
    return str(cfg.data_dir)


def _init(args: argparse.Namespace) -> int:
    from verifier.cometbft import CometError, init_home

    d = _data_dir(args)
    try:
        info = init_home(d, p2p=args.p2p, rpc=args.rpc, moniker=args.moniker, timeout_commit=args.timeout_commit)
    except CometError as exc:
        raise CliError(str(exc)) from None
    print(f"verifier home: {d}/cometbft")
    print(f"node id:       {info.node_id}")
    print(f"peer address:  {info.peer}")
    print(f"validator:     {info.validator_address} (ed25519 {info.validator_pub_key_b64})")
    return 0


def _genesis(args: argparse.Namespace) -> int:
    import json

    from verifier.admission import AdmissionParams, AdmissionParamsError
    from verifier.audit.chain import AuditParams, AuditParamsError
    from verifier.cometbft import CometError, install_genesis, make_genesis

    rules = AdmissionParams.local() if args.local_network else AdmissionParams()
    if args.work_bits is not None or args.no_address_probes:
        try:
            rules = AdmissionParams(**{**rules.to_json(), "probe": not args.no_address_probes,
                                       "work_bits": rules.work_bits if args.work_bits is None else args.work_bits})
        except AdmissionParamsError as exc:
            raise CliError(f"--work-bits: {exc}") from None

    audit: AuditParams | None = None
    if args.audits:
        try:
            audit = AuditParams(args.epoch_blocks, args.challenges_per_node, args.reply_window)
        except AuditParamsError as exc:
            raise CliError(f"--epoch-blocks/--challenges-per-node/--reply-window: {exc}") from None
    quota = _quota_section(args)
    try:
        genesis = make_genesis(args.data_dirs, chain_id=args.chain_id, power=args.power)
        app_state: dict[str, object] = {"admission": rules.to_json()}
        if audit is not None:
            app_state["audit"] = audit.to_json()
        if quota is not None:
            app_state["quota"] = quota
        genesis["app_state"] = app_state
        with open(args.out, "w") as f:
            json.dump(genesis, f, indent=2)
            f.write("\n")
        if args.install:
            install_genesis(args.data_dirs, genesis)
    except (CometError, OSError) as exc:
        raise CliError(str(exc)) from None
    print(f"wrote {args.out}: chain {args.chain_id}, {len(args.data_dirs)} validators"
          + (" (installed in each data dir)" if args.install else "")
          + (f"; a {rules.network} network (proof of work {rules.work_bits} bits, caps {rules.per_ip} per IP and "
             f"{rules.per_prefix} per prefix, 0 = none; address probes {'on' if rules.probe else 'off'})")
          + ("; audits off" if audit is None else
             f"; audits every {audit.epoch_blocks} blocks, {audit.challenges_per_node} challenges per node from "
             f"each verifier, replies to donated requests within {audit.reply_window_s} s")
          + ("; quotas off" if quota is None else
             f"; quotas of {quota['tokens']} tokens per user, model and {quota['epoch_s']} s epoch from each "
             f"verifier ({quota['burst']} at most at once), {quota['issuers']} issuers per token"))
    return 0


def _run(args: argparse.Namespace) -> int:
    from verifier.abci.server import AbciAddressError
    from verifier.app import StateError
    from verifier.cometbft import CometError
    from verifier.run import BookFileError, CometExited, QuotaFileError, run_verifier

    d = _data_dir(args)
    audit = None
    if args.audit:
        from verifier.audit.loop import AuditSettings

        if args.audit_threads < 1:
            raise CliError("--audit-threads must be at least 1")
        if args.transcript_budget is not None and args.transcript_budget < 1:
            raise CliError("--transcript-budget must be at least 1 (tokens scored a round)")
        committee = tuple(a.strip() for a in args.audit_committee.split(",") if a.strip())
        corpus = None
        if args.challenge_prompts is not None:
            from verifier.audit.corpus import CorpusError, read_corpus

            try:  # read here, once, so that a bad file stops the verifier before it starts
                corpus = read_corpus(args.challenge_prompts)
            except CorpusError as exc:
                raise CliError(f"--challenge-prompts: {exc}") from None
        audit = AuditSettings(model=args.audit_model, listen=args.audit_listen, region=args.audit_region,
                              threads=args.audit_threads, committee=committee, corpus=corpus,
                              transcript_budget=args.transcript_budget, version1_commits=args.take_version1_commits)
    elif args.audit_model:
        raise CliError("--audit-model needs --audit")
    elif args.challenge_prompts is not None:
        raise CliError("--challenge-prompts needs --audit")
    elif args.transcript_budget is not None:
        raise CliError("--transcript-budget needs --audit")
    elif args.take_version1_commits:
        raise CliError("--take-version1-commits needs --audit")
    try:
        run_async(lambda: run_verifier(d, abci=args.abci, audit=audit), long_lived=True)
    except (CometError, AbciAddressError, StateError, BookFileError, QuotaFileError) as exc:
        raise CliError(str(exc)) from None
    except CometExited as exc:
        print(f"gentorrent: {exc}", file=sys.stderr)
        return 1
    return 0
