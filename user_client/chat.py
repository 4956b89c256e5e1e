"""``gentorrent user chat``: a chat whose every prompt goes through the overlay.

The chat runs a full user node (it relays for others too), keeps N proxy paths, and sends
each turn — with the conversation so far — as n S-IDA cloves. Reply text is printed as each
chunk arrives, and only once the chunk has passed its check: the anonymous client yields
nothing that does not match the reply's hash chain and its model node's signature
(:meth:`~overlay.anon.client.AnonClient.request`). After each reply a status line (standard error)
names the model node that served it — after a failover, each node and the part it wrote,
each part signed by its own node — whether the complete reply verified, the time to first
token and the token count. A chunk that fails its check ends the reply with "REPLY REFUSED"
(the text printed before it was verified; nothing after it is shown). Follow-ups prefer the
model node that answered last (session affinity).

Interactive when standard input is a terminal: ``/help``, ``/new`` (forget the conversation),
``/model NAME`` (switch model), ``/quit``. The history sent is trimmed, oldest turns first
(the system prompt stays), to fit ``--context-tokens`` minus ``--max-tokens``: assistant
turns count the tokens the model node sent, other text counts one token per 3 characters
(a conservative estimate: the user node has no tokenizer).

Only trusted model nodes of models the committee audits are used (:func:`overlay.net.peers.usable`);
``--allow-unaudited`` also uses nodes of models no verifier with enough voting power holds (the
committee's model list marks them). ``--donate-prompts`` donates some complete requests to the
committee's audits (:mod:`user_client.donate`); pending donations are dropped when the chat exits.
``--donate-transcripts`` donates some requests with their signed replies to every verifier
(:mod:`user_client.transcripts`): committed before they are sent, revealed after; the chat waits
a few seconds at exit for reveals still out, at Ctrl-C too (a second one stops at once).

Non-interactive (scriptable) when ``--prompt TEXT`` is given (repeatable: one turn each) or
standard input is not a terminal (all of it is one prompt): the replies go to standard output
and nothing else does. Exit status (:data:`EXIT_CODES`): 0 every reply arrived and verified;
2 bad usage or configuration; 3 too few proxy paths (are enough relays up?); 4 no model node
answered in time; 5 the model node answered with an error; 6 a reply failed verification
(discarded); 7 the model is not audited by the committee's verifiers (pass --allow-unaudited);
8 your usage quota of the model is used up for now (the message says when the next token comes;
decisions 0017, 0018); 1 anything else; 130 interrupted.

With a committee that issues usage-quota tokens, every request carries one, fetched blind from
the verifiers (:mod:`overlay.directory.wallet`): model nodes serve requests with a token first.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

import trio

from overlay.anon.client import AnonError, ReplyUnverified, usable_nodes
from overlay.anon.paths import PathError
from overlay.wire.constants import REPUTATION_SCALE
from overlay.wire.failures import Failure
from overlay.wire.messages import ChatMessage, ReplyChunk, SamplingParams
from user_client.donate import Donor
from user_client.transcripts import DonatingClient, TranscriptDonor, reveal_before_stopping

EXIT_OK = 0
EXIT_OTHER = 1
EXIT_USAGE = 2
EXIT_PATHS = 3
EXIT_NO_MODEL_NODE = 4
EXIT_MODEL_ERROR = 5
EXIT_UNVERIFIED = 6
EXIT_UNAUDITED = 7
EXIT_QUOTA = 8
EXIT_INTERRUPTED = 130
EXIT_CODES = {
    EXIT_OK: "every reply arrived and its signature verified",
    EXIT_OTHER: "another failure (see the message)",
    EXIT_USAGE: "bad usage or configuration",
    EXIT_PATHS: "too few proxy paths could be built: are enough relays up?",
    EXIT_NO_MODEL_NODE: "no model node answered in time",
    EXIT_MODEL_ERROR: "the model node answered with an error",
    EXIT_UNVERIFIED: "a reply failed verification and was discarded",
    EXIT_UNAUDITED: "the model is not audited by the committee's verifiers (pass --allow-unaudited to use it anyway)",
    EXIT_QUOTA: "your usage quota of the model is used up for now (the message says when the next token comes)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C, SIGTERM)",
}
CHARS_PER_TOKEN = 3  # conservative: real tokenizers average 3.5-4.5 characters per token on English

HELP = """commands:
  /help         this text
  /new          start a new conversation (forget the history and the model node)
  /model NAME   switch to model NAME (the registry lists which model nodes serve what)
  /quit         leave (Ctrl-D too)
anything else is sent as your next turn."""


#: The exit status of each kind of failed request (:class:`~overlay.wire.failures.Failure`).
EXIT_FOR = {
    Failure.NO_PATHS: EXIT_PATHS,
    Failure.SILENT: EXIT_NO_MODEL_NODE,
    Failure.LOST: EXIT_NO_MODEL_NODE,
    Failure.NO_MODEL_NODE: EXIT_NO_MODEL_NODE,
    Failure.NODE_ERROR: EXIT_MODEL_ERROR,
    Failure.BUSY: EXIT_MODEL_ERROR,
    Failure.ALL_BUSY: EXIT_MODEL_ERROR,
    Failure.INVALID: EXIT_MODEL_ERROR,
    Failure.SPENT: EXIT_MODEL_ERROR,
    Failure.UNVERIFIED: EXIT_UNVERIFIED,
    Failure.UNAUDITED: EXIT_UNAUDITED,
    Failure.QUOTA: EXIT_QUOTA,
}


def exit_status(exc: BaseException) -> int:
    """The exit status that says what failed (see :data:`EXIT_CODES`): by the failure's kind
    (:data:`EXIT_FOR`), never by its message."""
    if isinstance(exc, PathError):
        return EXIT_PATHS
    if isinstance(exc, AnonError):
        return EXIT_FOR.get(exc.kind, EXIT_OTHER)
    return EXIT_OTHER


class Client(Protocol):
    """What a chat needs of :class:`~overlay.anon.client.AnonClient` (tests pass a fake)."""

    def request(self, model: str, messages: list[ChatMessage] | tuple[ChatMessage, ...],
                params: SamplingParams | None = None, *, node: bytes | None = None,
                chunk_timeout: float = 60.0, sent_to: set[bytes] | None = None) -> AsyncIterator[ReplyChunk]: ...


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered turn: the reply and how it came. ``node`` served the end of it;
    ``parts`` lists ``(node, characters)`` in order, one per node that wrote part of it (more
    than one after a failover). ``verified``: the complete reply arrived, every part checked
    against its node's signature. ``seen_by``: every model node that has read the conversation so
    far, this turn included (in ascending order), which a donation of it names (decision 0029)."""

    text: str
    node: bytes
    verified: bool
    first_token_s: float
    tokens: int
    parts: tuple[tuple[bytes, int], ...] = ()
    sent: tuple[ChatMessage, ...] = ()  # the messages the request carried (the window of the history)
    seen_by: tuple[bytes, ...] = ()


class ChatSession:
    """One conversation: history, the model, the model node that served it (affinity) and the
    model nodes that have read it (:attr:`seen`).

    ``context_tokens``: the model's context window; the history sent is trimmed to fit it
    with ``params.max_tokens`` to spare (see the module docstring)."""

    def __init__(self, client: Client, model: str, params: SamplingParams, system: str | None, *,
                 context_tokens: int = 2048, now: Callable[[], float] = time.perf_counter) -> None:
        self.client = client
        self.model = model
        self.params = params
        self.system = system
        self.context_tokens = context_tokens
        self.now = now
        self.history: list[ChatMessage] = []
        self._tokens: list[int] = []  # per history message: known or estimated tokens
        self.node: bytes | None = None
        self.seen: set[bytes] = set()
        self.new()

    def new(self) -> None:
        """Forget the conversation (keep the system prompt), the model node and who has read it."""
        self.history = [ChatMessage("system", self.system)] if self.system else []
        self._tokens = [self.estimate(self.system)] if self.system else []
        self.node = None
        self.seen = set()

    def switch(self, model: str) -> None:
        """Talk to ``model`` from now on; the history is kept, the node is chosen afresh."""
        self.model = model
        self.node = None

    @staticmethod
    def estimate(text: str) -> int:
        return -(-len(text) // CHARS_PER_TOKEN) + 4  # + a few for the chat template's role markers

    def window(self) -> list[ChatMessage]:
        """The history to send: the system prompt and as many of the latest turns as fit."""
        budget = self.context_tokens - self.params.max_tokens
        first = 1 if self.system else 0
        used = sum(self._tokens[:first])
        start = len(self.history)
        while start > first and used + self._tokens[start - 1] <= budget:
            start -= 1
            used += self._tokens[start]
        # never start on an assistant reply: a window begins with a user turn
        while start < len(self.history) - 1 and self.history[start].role == "assistant":
            start += 1
        return self.history[:first] + self.history[start:]

    async def turn(self, text: str, out: TextIO, chunk_timeout: float) -> Turn:
        """Send ``text`` with the history that fits; write the reply to ``out`` as it decodes; the
        client waits up to ``chunk_timeout`` seconds for each reply chunk (it fails over after).
        On failure the turn is forgotten and :class:`~overlay.anon.client.AnonError` raised; the
        nodes it was sent to stay in :attr:`seen` (they read the history)."""
        self.history.append(ChatMessage("user", text))
        self._tokens.append(self.estimate(text))
        window = self.window()
        if window[-1] is not self.history[-1]:
            self.history.pop()
            self._tokens.pop()
            raise AnonError(f"the prompt alone (about {self.estimate(text)} tokens) does not fit the context of "
                            f"{self.context_tokens} tokens with {self.params.max_tokens} to spare for the reply; "
                            "shorten it or lower --max-tokens")
        parts: list[str] = []
        writers: list[tuple[bytes, int]] = []
        served_by: bytes | None = None
        verified = False
        tokens = 0
        t0 = self.now()
        first: float | None = None
        try:
            async with aclosing(_generator(self.client.request(self.model, window, self.params, node=self.node,
                                                               chunk_timeout=chunk_timeout,
                                                               sent_to=self.seen))) as chunks:
                async for chunk in chunks:
                    self.seen.add(chunk.node)  # a member the node it was sent to forwarded it to read it too
                    if first is None and chunk.text:
                        first = self.now() - t0
                    parts.append(chunk.text)
                    if not writers or writers[-1][0] != chunk.node:
                        writers.append((chunk.node, 0))
                    writers[-1] = (chunk.node, writers[-1][1] + len(chunk.text))
                    served_by = chunk.node
                    tokens += len(chunk.token_ids)
                    verified = chunk.done  # every chunk yielded passed its check; done: the reply is complete
                    out.write(chunk.text)
                    out.flush()
        except AnonError:
            self.history.pop()
            self._tokens.pop()
            raise
        out.write("\n")
        out.flush()
        if served_by is None:
            self.history.pop()
            self._tokens.pop()
            raise AnonError("the reply ended before any chunk arrived")
        self.node = served_by  # follow-ups go to the node that signed this reply
        reply = "".join(parts)
        self.history.append(ChatMessage("assistant", reply))
        self._tokens.append(tokens + 4)
        return Turn(reply, served_by, verified, first if first is not None else self.now() - t0, tokens,
                    tuple(writers), tuple(window), tuple(sorted(self.seen)))


async def _generator(chunks: AsyncIterator[ReplyChunk]) -> AsyncGenerator[ReplyChunk, None]:
    """``chunks`` as an async generator whose ``aclose`` closes ``chunks`` too (when it can)."""
    try:
        async for c in chunks:
            yield c
    finally:
        if isinstance(chunks, AsyncGenerator):
            await chunks.aclose()


def trust_label(reputation: int | None) -> str:
    """How a model node's trust reads: the committee's reputation (fixed point, 10^6 = 1.0; users
    are sent only to nodes at 0.4 or more), or that no committee vouches for it."""
    if reputation is None:
        return "trust unknown (no committee)"
    return f"trust {reputation / REPUTATION_SCALE:.2f}"


def describe(turn: Turn, trust: Callable[[bytes], int | None] = lambda _: None) -> str:
    """The status line after a reply. ``trust(node)``: the node's reputation on the committee's
    signed model list (None when the directory is not a committee's)."""
    check = "signature verified" if turn.verified else "NOT verified"
    if len(turn.parts) > 1:
        who = "model nodes " + " then ".join(f"{n.hex()[:8]} ({chars} characters; {trust_label(trust(n))})"
                                             for n, chars in turn.parts)
        check = "each part's signature verified" if turn.verified else "NOT verified"
        return f"[{who} (failover) · {check} · first token {turn.first_token_s:.2f} s · {turn.tokens} tokens]"
    return (f"[model node {turn.node.hex()[:8]} · {trust_label(trust(turn.node))} · {check} · first token "
            f"{turn.first_token_s:.2f} s · {turn.tokens} tokens]")


def reputation_of(models: Sequence[Any], node: bytes) -> int | None:
    """The reputation the directory's entry for ``node`` carries (None: not listed, or no committee)."""
    entry = next((e for e in models if e.node_id == node), None)
    rep: int | None = getattr(entry, "reputation", None)
    return rep


def model_problem(models: Sequence[Any], model: str, allow_unaudited: bool) -> AnonError | None:
    """Why a prompt for ``model`` cannot be sent to any of ``models`` (the nodes listed for it):
    none listed, none trusted, or (:class:`~overlay.anon.client.ModelUnaudited`) an unaudited model
    without ``allow_unaudited``; ``None`` when one can be used."""
    try:
        usable_nodes(models, model, allow_unaudited)
    except AnonError as exc:
        return exc
    return None


def command(session: ChatSession, line: str, models: Callable[[str], Sequence[Any]],
            allow_unaudited: bool = False) -> tuple[bool, str]:
    """Run a ``/command``: (keep going?, what to print). ``models(name)`` lists nodes serving it;
    ``allow_unaudited``: whether a model the committee does not audit may be switched to."""
    name, _, arg = line.strip().partition(" ")
    arg = arg.strip()
    if name in ("/quit", "/exit"):
        return False, ""
    if name == "/help":
        return True, HELP
    if name == "/new":
        session.new()
        return True, "[new conversation]"
    if name == "/model":
        if not arg:
            return True, f"[model: {session.model}; /model NAME switches]"
        if not models(arg):
            return True, f"[no model node in the registry serves {arg!r}; staying with {session.model}]"
        problem = model_problem(models(arg), arg, allow_unaudited)
        if problem is not None:
            return True, f"[{problem}; staying with {session.model}]"
        session.switch(arg)
        return True, f"[model: {arg}]"
    return True, f"[unknown command {name}; /help lists them]"


SPINNER_S = 0.25  # seconds between two updates of the count of ready paths on the terminal


async def wait_paths(paths: Any, n: int, *, show: bool) -> None:
    """Wait for ``n`` ready proxy paths, showing how many are ready on stderr when ``show``. The
    caller bounds the wait (a cancel scope)."""
    if not show:
        await paths.wait_ready(n)
        return
    from rich.console import Console

    with Console(stderr=True).status("building proxy paths") as spinner:
        while True:
            spinner.update(f"building proxy paths of 3 relays each: {len(paths.ready_paths())}/{n} ready")
            with trio.move_on_after(SPINNER_S):
                await paths.wait_ready(n)
                return


def check_donation_settings(cfg: Any) -> None:
    """:class:`~gentorrent.cli.CliError` for a ``--donate-rate`` or ``--donate-transcripts-rate`` outside 0..1."""
    from gentorrent.cli import CliError

    if not 0.0 <= cfg.donate_rate <= 1.0:
        raise CliError(f"--donate-rate must be within 0..1, got {cfg.donate_rate:g}")
    if not 0.0 <= cfg.donate_transcripts_rate <= 1.0:
        raise CliError(f"--donate-transcripts-rate must be within 0..1, got {cfg.donate_transcripts_rate:g}")


def check_donation_committee(cfg: Any, committee: object | None) -> None:
    """:class:`~gentorrent.cli.CliError` for a donation flag without a committee to donate to."""
    from gentorrent.cli import CliError

    for flag, on in (("--donate-prompts", cfg.donate_prompts), ("--donate-transcripts", cfg.donate_transcripts)):
        if on and committee is None:
            raise CliError(f"{flag} donates to the committee's verifiers: it needs --committee")


def make_donor(cfg: Any, identity: Any, addresses: Sequence[str], validators: Callable[[], Sequence[bytes]]) -> Donor:
    """The donor of ``--donate-prompts`` (:mod:`user_client.donate`), to the committee at ``addresses``
    whose validator keys ``validators()`` returns (the set the node holds now)."""
    return Donor(identity, addresses, validators, rate=cfg.donate_rate)


def make_transcript_donor(cfg: Any, identity: Any, addresses: Sequence[str],
                          validators: Callable[[], Sequence[bytes]],
                          powers: Callable[[], Mapping[bytes, int]] | None = None) -> TranscriptDonor:
    """The donor of ``--donate-transcripts`` (:mod:`user_client.transcripts`), to every verifier
    of the committee at ``addresses`` whose validator keys ``validators()`` returns; with
    ``powers()`` (those keys' voting powers) its commitments are escrowed (decision 0037)."""
    return TranscriptDonor(identity, addresses, validators, powers=powers, rate=cfg.donate_transcripts_rate)


def check_chat_settings(cfg: Any, args: argparse.Namespace) -> None:
    """:class:`~gentorrent.cli.CliError` for a chat that cannot run as configured."""
    from gentorrent.cli import CliError

    if not cfg.model:
        raise CliError("which model? pass --model ID (the registry lists which model nodes serve what)")
    if not 1 <= cfg.threshold <= cfg.cloves <= 16 or cfg.proxies < cfg.cloves:
        raise CliError("need 1 <= threshold (k) <= cloves (n) <= 16 and proxies (N) >= cloves")
    if not 1 <= args.max_tokens < args.context_tokens:
        raise CliError("need 1 <= --max-tokens < --context-tokens")
    if not 0.0 < args.top_p <= 1.0:
        raise CliError("--top-p must be within (0, 1]")
    check_donation_settings(cfg)


def prompts(args: argparse.Namespace) -> tuple[bool, list[str]]:
    """``(interactive?, the prompts to send)``: interactive when no ``--prompt`` is given and standard
    input is a terminal; otherwise the ``--prompt`` turns, or all of standard input as one."""
    from gentorrent.cli import CliError

    interactive = args.prompt is None and sys.stdin.isatty()
    turns: list[str] = list(args.prompt or [])
    if args.prompt is None and not interactive:
        text = sys.stdin.read().strip()
        if not text:
            raise CliError("no prompt: standard input was empty (pass --prompt TEXT or pipe a prompt)")
        turns = [text]
    return interactive, turns


class ChatRun:
    """One ``user chat`` once its user node is set up: it serves the node (registered with the
    committee, if any), starts the donors, waits for the proxy paths, then holds the turns.
    ``status`` is the exit status (:data:`EXIT_CODES`)."""

    def __init__(self, args: argparse.Namespace, cfg: Any, user: Any, session: ChatSession, *, registry: Any,
                 committee: Any, listen: tuple[str, int], interactive: bool, turns: list[str]) -> None:
        self.args, self.cfg, self.user, self.session = args, cfg, user, session
        self.registry, self.committee, self.listen = registry, committee, listen
        self.interactive, self.turns = interactive, turns
        self.quiet = not interactive and not args.verbose
        self.status = EXIT_OK
        self.donor: Donor | None = None
        self.transcripts: TranscriptDonor | None = None

    def note(self, text: str) -> None:
        """Progress on standard error (none when the chat is scripted and not ``--verbose``)."""
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    async def main(self) -> None:
        async with trio.open_nursery() as nursery:
            if await self.start(nursery) and await self.paths_ready():
                # the turns, then the reveals still out (a commitment left unrevealed burns the
                # donor); the first Ctrl-C ends the turns, a second the wait
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as stops:
                    if await reveal_before_stopping(self.converse, stops, self.transcripts, self.note):
                        self.status = EXIT_INTERRUPTED
            nursery.cancel_scope.cancel()

    async def start(self, nursery: trio.Nursery) -> bool:
        """Serve the user node and start the donors; whether the model may be used (the error said
        and ``status`` set if not)."""
        from overlay.directory.membership import node_entry, serve_member

        cfg = self.cfg
        _, member = await nursery.start(  # registered, its lists from the committee (live)
            serve_member, self.user, *self.listen, self.committee, self.registry,
            lambda address: node_entry(self.user.identity, cfg.advertise or address, cfg.region))
        if member is not None:
            from overlay.directory.wallet import member_wallet

            self.user.client.quota = member_wallet(self.user.identity, member, data_dir=cfg.data_path)
            await self.start_donors(nursery, member)
        problem = model_problem(self.registry.models(cfg.model), cfg.model, cfg.allow_unaudited)
        if problem is not None:
            print(f"gentorrent: error: {problem}", file=sys.stderr, flush=True)
            self.status = exit_status(problem)
            return False
        return True

    async def start_donors(self, nursery: trio.Nursery, member: Any) -> None:
        """With a committee: the donors of ``--donate-prompts`` and ``--donate-transcripts``."""
        from gentorrent.cli import CliError

        cfg = self.cfg
        if not self.registry.models(cfg.model):
            raise CliError(f"no model node in the committee's lists serves {cfg.model!r}")
        identity = self.user.identity

        def validators() -> list[bytes]:
            return [v.public_key for v in member.client.validators]

        if cfg.donate_prompts:
            self.donor = make_donor(cfg, identity, member.settings.addresses, validators)
            await nursery.start(self.donor.run)
        client = self.session.client
        if isinstance(client, DonatingClient):
            self.transcripts = client.donor = make_transcript_donor(cfg, identity, member.settings.addresses,
                                                                    validators, member.powers)
            await nursery.start(self.transcripts.run)

    async def paths_ready(self) -> bool:
        """Wait up to ``--paths-timeout`` for the proxy paths a prompt needs; whether they came
        (the error said and ``status`` set if not)."""
        cfg, paths = self.cfg, self.user.paths
        if not self.interactive:
            self.note(f"[building {cfg.proxies} proxy paths of 3 relays each...]")
        with trio.move_on_after(self.args.paths_timeout) as waited:
            await wait_paths(paths, cfg.cloves, show=self.interactive)
        if waited.cancelled_caught:
            print(f"gentorrent: error: {paths.too_few(cfg.cloves, self.args.paths_timeout)}", file=sys.stderr)
            self.status = EXIT_PATHS
            return False
        self.note(f"[{len(paths.ready_paths())} paths ready; prompts go as {cfg.cloves} cloves, any "
                  f"{cfg.threshold} rebuild them; model {self.session.model}; /help for commands]")
        return True

    async def converse(self) -> None:
        """Every turn, until the prompts run out (or the user leaves); a scripted chat stops at the
        first failed one."""
        while (text := await self.next_prompt()) is not None:
            if not await self.ask(text) and not self.interactive:
                break

    async def next_prompt(self) -> str | None:
        """The next prompt to send (``None``: no more): the next ``--prompt``, or the user's next line
        (running ``/commands`` on the way)."""
        if not self.interactive:
            if not self.turns:
                return None
            text = self.turns.pop(0)
            self.note(f"you> {text}")
            return text
        while True:
            line = await trio.to_thread.run_sync(_read_line, abandon_on_cancel=True)
            if line is None:
                return None
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                go_on, said = command(self.session, text, self.registry.models, self.cfg.allow_unaudited)
                if said:
                    print(said, flush=True)
                if not go_on:
                    return None
                continue
            sys.stdout.write("model> ")
            return text

    async def ask(self, text: str) -> bool:
        """One turn, its status line, and maybe its donation; whether it succeeded (the failure
        said and ``status`` set if not)."""
        session = self.session
        try:
            turn = await session.turn(text, sys.stdout, self.args.timeout)
        except ReplyUnverified as exc:
            print(f"\n[REPLY REFUSED: it failed verification: {exc}. The text above was verified; "
                  "nothing after it is shown]" if self.interactive
                  else f"gentorrent: error: REPLY REFUSED, it failed verification: {exc}",
                  file=sys.stderr, flush=True)
            self.status = self.status or EXIT_UNVERIFIED
            return False
        except AnonError as exc:
            print(f"\n[request failed: {exc}]" if self.interactive else f"gentorrent: error: {exc}",
                  file=sys.stderr, flush=True)
            self.status = self.status or exit_status(exc)
            return False
        self.note(describe(turn, lambda n: reputation_of(self.registry.models(session.model), n)))
        if not turn.verified:
            self.status = self.status or EXIT_UNVERIFIED
        elif self.donor is not None:  # a complete reply: maybe donate its request, later (fire and forget)
            self.donor.offer(session.model, turn.sent, session.params, seen_by=turn.seen_by)
        return True


def run_chat(args: argparse.Namespace) -> int:
    from gentorrent.cli import CliError, resolve_config, run_async
    from overlay.directory.membership import directory
    from overlay.net.transport import TLSTransport
    from overlay.usernode import UserNode
    from overlay.wire.identity import load_or_create
    from user_client.relay_node import listen_address

    cfg = resolve_config(args)
    check_chat_settings(cfg, args)
    interactive, turns = prompts(args)
    identity = load_or_create(cfg.data_path)
    registry, committee, _ = directory(cfg)
    if committee is None and not registry.models(cfg.model):
        raise CliError(f"no model node in the registry serves {cfg.model!r}")
    check_donation_committee(cfg, committee)
    listen = listen_address(cfg)
    user = UserNode(identity, TLSTransport(identity), registry, region=cfg.region, n=cfg.cloves,
                    k=cfg.threshold, paths=cfg.proxies, refresh=cfg.path_refresh, ping_interval=0,
                    registered_only=committee is not None)
    assert user.client is not None and user.paths is not None
    user.client.allow_unaudited = cfg.allow_unaudited
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                            seed=args.seed)
    client = DonatingClient(user.client) if cfg.donate_transcripts else user.client  # its donor: once registered
    session = ChatSession(client, cfg.model, params, args.system, context_tokens=args.context_tokens)
    chat = ChatRun(args, cfg, user, session, registry=registry, committee=committee, listen=listen,
                   interactive=interactive, turns=turns)
    try:
        run_async(chat.main)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return chat.status


def _read_line() -> str | None:
    try:
        sys.stdout.write("you> ")
        sys.stdout.flush()
        line = sys.stdin.readline()
    except (EOFError, KeyboardInterrupt):
        return None
    return line if line else None
