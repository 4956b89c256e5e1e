"""``gentorrent user chat``: a chat REPL whose every prompt goes through the overlay.

The chat runs a full user node (it relays for others too), keeps N proxy paths,
and sends each turn — with the conversation so far — as n S-IDA cloves. Reply
chunks are printed as soon as k cloves of each arrive. Follow-ups prefer the
model node that answered before (session affinity).

``--prompt TEXT`` (repeatable) sends those turns and exits instead of reading
standard input: scripts and the devnet demo use it.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import trio

from overlay.anon import AnonClient, AnonError
from overlay.cli import CliError, resolve_config, run_async
from overlay.identity import load_or_create
from overlay.messages import ChatMessage, SamplingParams
from overlay.registry import from_config
from overlay.transport import TLSTransport
from overlay.usernode import UserNode
from user_client.relay import listen_address


class ChatSession:
    """One conversation: history plus the model node that served it (affinity)."""

    def __init__(self, client: AnonClient, model: str, params: SamplingParams, system: str | None) -> None:
        self.client = client
        self.model = model
        self.params = params
        self.history: list[ChatMessage] = [ChatMessage("system", system)] if system else []
        self.node: bytes | None = None

    async def turn(self, text: str, out: TextIO, timeout: float) -> str:
        self.history.append(ChatMessage("user", text))
        parts: list[str] = []
        served_by = None
        try:
            async for chunk in self.client.request(self.model, self.history, self.params, node=self.node,
                                                   timeout=timeout):
                parts.append(chunk.text)
                served_by = chunk.node
                out.write(chunk.text)
                out.flush()
        except AnonError:
            self.history.pop()
            raise
        out.write("\n")
        out.flush()
        # The last chunk's signature was verified: follow-ups go to the node that signed it.
        self.node = served_by
        reply = "".join(parts)
        self.history.append(ChatMessage("assistant", reply))
        return reply


def run_chat(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    if not cfg.model:
        raise CliError("which model? pass --model ID (the registry lists which model nodes serve what)")
    if not 1 <= cfg.threshold <= cfg.cloves <= 16 or cfg.proxies < cfg.cloves:
        raise CliError("need 1 <= threshold (k) <= cloves (n) <= 16 and proxies (N) >= cloves")
    identity = load_or_create(cfg.data_path)
    registry = from_config(cfg)
    if not registry.models(cfg.model):
        raise CliError(f"no model node in the registry serves {cfg.model!r}")
    host, port = listen_address(cfg)
    user = UserNode(identity, TLSTransport(identity), registry, region=cfg.region, n=cfg.cloves,
                    k=cfg.threshold, paths=cfg.proxies, refresh=cfg.path_refresh, ping_interval=0)
    assert user.client is not None
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    session = ChatSession(user.client, cfg.model, params, args.system)
    status = 0

    async def main() -> None:
        nonlocal status
        async with trio.open_nursery() as nursery:
            await nursery.start(user.serve, host, port)
            print(f"[building {cfg.proxies} proxy paths of 3 relays each...]", file=sys.stderr, flush=True)
            assert user.paths is not None
            try:
                await user.paths.wait_ready(cfg.cloves, 60.0)
            except Exception as exc:  # noqa: BLE001 - any failure to build paths ends the chat with its message
                print(f"gentorrent: error: {exc}", file=sys.stderr)
                status = 1
                nursery.cancel_scope.cancel()
                return
            print(f"[{len(user.paths.ready_paths())} paths ready; prompts go as {cfg.cloves} cloves, "
                  f"any {cfg.threshold} rebuild them]", file=sys.stderr, flush=True)
            turns = args.prompt
            interactive = turns is None
            while True:
                if interactive:
                    line = await trio.to_thread.run_sync(_read_line, abandon_on_cancel=True)
                    if line is None:
                        break
                    text = line.strip()
                    if not text:
                        continue
                    if text in ("/quit", "/exit"):
                        break
                else:
                    if not turns:
                        break
                    text = turns.pop(0)
                    print(f"you> {text}", flush=True)
                sys.stdout.write("model> ")
                try:
                    await session.turn(text, sys.stdout, args.timeout)
                    assert session.node is not None
                    print(f"[reply signed by model node {session.node.hex()[:8]}; follow-ups go there]",
                          file=sys.stderr, flush=True)
                except AnonError as exc:
                    print(f"\n[request failed: {exc}]", file=sys.stderr, flush=True)
                    status = 1
            nursery.cancel_scope.cancel()

    try:
        run_async(main)
    except KeyboardInterrupt:
        pass
    return status


def _read_line() -> str | None:
    try:
        sys.stdout.write("you> ")
        sys.stdout.flush()
        line = sys.stdin.readline()
    except (EOFError, KeyboardInterrupt):
        return None
    return line if line else None
