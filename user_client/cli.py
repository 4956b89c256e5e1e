"""``gentorrent user ...``: chat, serve, relay. Imports nothing heavy until run."""

from __future__ import annotations

import argparse

from gentorrent.cli import common_flags

DEFAULT_PORT = 8741  # `gentorrent user serve`
DEFAULT_MAX_BODY = 1 << 20  # 1 MiB: more than MAX_PROMPT_CHARS of JSON-escaped ASCII fits
DEFAULT_MAX_CONCURRENT = 32
DEFAULT_BODY_TIMEOUT = 10.0  # seconds for a request body to arrive whole
API_KEY_ENV = "GENTORRENT_API_KEY"
# settings of the commands that send prompts (gentorrent/config.py): which model nodes, and donations
USER_SETTINGS = ("allow_unaudited", "donate_prompts", "donate_rate", "donate_transcripts", "donate_transcripts_rate")
USE_NOTE = ("Prompts go only to trusted model nodes (committee reputation 0.4 or more) of models the committee's "
            "verifiers audit; --allow-unaudited also uses models no verifier with enough voting power holds, never "
            "untrusted nodes. With a --registry or --peers file no committee says whether a model is audited "
            "(unknown), and its nodes are used (local testing). --donate-prompts (off by default) donates, after "
            "a complete reply and with probability --donate-rate (0.25), the request's system prompt, its latest 8 "
            "user turns (no replies) and sampling parameters to one verifier chosen at random, 0-60 s later, for "
            "its audit challenges: the chosen verifier learns your node id, your IP address, the prompt and which "
            "model nodes the conversation was sent to, so that it never challenges them with it (not the reply). "
            "--donate-transcripts (off by default) donates, for a share --donate-transcripts-rate (0.1) "
            "of requests drawn before they are sent, the request and its signed reply to every verifier of the "
            "committee, committed to before the request leaves: every verifier learns your node id, your IP "
            "address, the prompt, the reply and which model node served it (and if a reveal misses verifiers that "
            "together could rebuild its escrowed secret, the model node learns after the epoch that the request "
            "was donated; the client waits up to 10 s for its reveals when it stops, a second Ctrl-C stops at once).")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    user = sub.add_parser(
        "user",
        help="run a user node: chat, serve an OpenAI-compatible API, or only relay",
        description="A user node sends prompts anonymously and relays cloves for other users.",
    )
    cmds = user.add_subparsers(dest="user_command", metavar="SUBCOMMAND", required=True)

    chat = cmds.add_parser(
        "chat", help="chat with an LLM through the anonymous overlay",
        description=(
            "Interactive chat through the anonymous overlay. This user node keeps N proxy paths of 3 "
            "relays each and sends every turn as n S-IDA cloves, one per path; any k rebuild it. It "
            "relays for other users while it runs. Type /help for commands, /quit or Ctrl-D to leave. "
            "With --prompt, or a prompt piped on standard input, it answers and exits: the reply on stdout; "
            "exit status 0 ok, 2 usage, 3 too few proxy paths, 4 no model node answered, 5 the model node "
            "answered with an error, 6 a reply failed verification, 7 the model is not audited by the committee's "
            "verifiers (--allow-unaudited), 1 other. " + USE_NOTE
        ),
    )
    common_flags(chat, "model", "committee", "committee_genesis", "advertise", "registry", "registry_keys", "peers",
                 "region", "listen", "cloves", "threshold",
                 "proxies", "path_refresh", *USER_SETTINGS)
    chat.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                      help="send this turn (repeatable), print the replies and exit; without it, a prompt piped "
                           "on standard input is sent the same way")
    chat.add_argument("--system", default=None, help="system prompt for the conversation")
    chat.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default: 0.7)")
    chat.add_argument("--top-p", type=float, default=1.0,
                      help="nucleus sampling: sample from the smallest set of tokens whose probability reaches P, "
                           "0 < P <= 1 (default: 1, no cut)")
    chat.add_argument("--max-tokens", type=int, default=256, help="longest reply in tokens (default: 256)")
    chat.add_argument("--seed", type=int, default=None, help="sampling seed, for repeatable replies")
    chat.add_argument("--context-tokens", type=int, default=2048,
                      help="the model's context window: older turns are left out to fit it (default: 2048)")
    chat.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each reply chunk")
    chat.add_argument("--paths-timeout", type=float, default=60.0,
                      help="seconds to wait for the proxy paths at start (default: 60)")
    chat.add_argument("--verbose", action="store_true",
                      help="non-interactive mode: also print each prompt and the status lines on stderr")
    chat.set_defaults(run=_run_chat)

    serve = cmds.add_parser(
        "serve", help="serve an OpenAI-compatible API on 127.0.0.1 backed by the overlay",
        description=(
            "A local OpenAI-compatible HTTP API (GET /v1/models, POST /v1/chat/completions, POST "
            "/v1/completions, streamed or not) whose every call goes anonymously through the overlay, "
            "like 'user chat'; follow-ups of a conversation go back to the model node that served it. "
            "Point any OpenAI client at http://127.0.0.1:PORT/v1 (any API key, unless --api-key sets one). Prints "
            "'READY <url>' once listening. Runs until Ctrl-C. A model the committee does not audit is answered "
            "503 model_unaudited unless --allow-unaudited. Against web pages you visit: a request whose Host "
            "header does not name the gateway (localhost, 127.0.0.1, [::1], the --host address, or an "
            "--allow-host name) is refused 421 bad_host (DNS rebinding); a browser request from another web "
            "origin is refused 403 cross_origin (unless --allow-origin lists it); a POST body must be sent as "
            "Content-Type: application/json (415 otherwise). " + USE_NOTE
        ),
    )
    common_flags(serve, "committee", "committee_genesis", "advertise", "registry", "registry_keys", "peers", "region",
                 "listen", "cloves", "threshold", "proxies",
                 "path_refresh", *USER_SETTINGS)
    _serve_flags(serve)
    serve.set_defaults(run=_run_serve)

    relay = cmds.add_parser(
        "relay", help="run a user node that only relays for others",
        description=(
            "Start a user node that listens on --listen, authenticates every peer by its node key, "
            "relays onion paths and cloves for other users, answers pings and status requests, and "
            "pings the nodes of its directory (the verifier committee's signed lists with --committee, "
            "where it registers itself; a signed --registry file; or an unsigned --peers list for local "
            "testing). Prints 'READY <node id> <address>' once listening. Runs until Ctrl-C."
        ),
    )
    common_flags(relay, "listen", "committee", "committee_genesis", "advertise", "registry", "registry_keys", "peers",
                 "region", "ping_interval")
    relay.set_defaults(run=_run_relay)


def _run_relay(args: argparse.Namespace) -> int:
    from user_client.relay_node import run_relay

    return run_relay(args)


def _run_chat(args: argparse.Namespace) -> int:
    from user_client.chat import run_chat

    return run_chat(args)


def _run_serve(args: argparse.Namespace) -> int:
    from user_client.gateway import run_serve

    return run_serve(args)


def _serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="HTTP address to listen on (default: 127.0.0.1; anything beyond loopback needs "
                        "--listen-public)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default: {DEFAULT_PORT}; 0 = any free)")
    p.add_argument("--listen-public", action="store_true",
                   help="allow --host to be a non-loopback address: anyone who reaches it can use your user "
                        "node (only the holders of the key with --api-key)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every call, /v1/models included (401 "
                        f"invalid_api_key otherwise); 1-1024 printable ASCII characters, no spaces. Default: the "
                        f"{API_KEY_ENV} environment variable if set, else no key (fine on loopback). Prefer the "
                        f"variable: a command line is visible to other local users. The key is never logged")
    p.add_argument("--allow-host", action="append", default=None, metavar="HOST",
                   help="also answer requests whose Host header names HOST (a DNS name or IP literal, no port; "
                        "repeatable or comma-separated), e.g. the LAN name of a --listen-public gateway. "
                        "By default only the --host address and, for a loopback or wildcard --host, localhost, "
                        "127.0.0.1 and [::1]")
    p.add_argument("--allow-origin", action="append", default=None, metavar="ORIGIN",
                   help="let web pages of ORIGIN (scheme://host[:port], e.g. http://localhost:3000; repeatable "
                        "or comma-separated) call the gateway from a browser: they get CORS headers, so they can "
                        "read the answers. By default a request from any origin but the gateway's own is refused "
                        "403 cross_origin and no page elsewhere can read an answer")
    p.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT, metavar="SECONDS",
                   help=f"seconds for a request body to arrive whole before answering 408 body_timeout "
                        f"(default: {DEFAULT_BODY_TIMEOUT:g}); a call takes a --max-concurrent slot only once "
                        "its body is in")
    p.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY,
                   help=f"largest request body in bytes (default: {DEFAULT_MAX_BODY})")
    p.add_argument("--max-concurrent", type=int, default=DEFAULT_MAX_CONCURRENT,
                   help=f"calls in flight before answering 429 (default: {DEFAULT_MAX_CONCURRENT})")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for each reply chunk before trying another model node (default: 60)")
    p.add_argument("--paths-timeout", type=float, default=10.0,
                   help="seconds a call waits for enough proxy paths before answering 503 (default: 10)")
