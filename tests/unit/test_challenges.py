"""Audit challenges (verifier/audit/challenges.py): the prompt space, freshness, parameters drawn like the
project's clients send them (decision 0013 §3)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from overlay.wire.messages import ChatMessage, SamplingParams
from user_client.openai_api import DEFAULT_MAX_TOKENS
from verifier.audit import challenges as ch
from verifier.audit import tx as at


def test_the_prompt_space_holds_over_a_billion_prompts_as_the_docstring_says() -> None:
    assert ch.PROMPT_SPACE == math.prod(len(p) for p in ch.PARTS) == 2_641_766_400
    assert ch.PROMPT_SPACE >= 10**9
    assert f"{ch.PROMPT_SPACE:,}" in (ch.__doc__ or "")
    for part in ch.PARTS:  # no two choices of one part read the same once normalised
        assert len({ch.normalise(x) for x in part}) == len(part)
    assert all("{}" in q for q in ch.QUESTIONS)


def test_different_choices_give_different_normalised_prompts() -> None:
    rng = random.Random(7)
    seen: dict[str, tuple[int, ...]] = {}
    for _ in range(50_000):
        choice = tuple(rng.randrange(len(p)) for p in ch.PARTS)
        text = ch.normalise(ch.compose(choice))
        assert seen.setdefault(text, choice) == choice, (text, choice, seen[text])
    # and every value of each part, with the others fixed, changes the text
    base = [0] * len(ch.PARTS)
    for i, part in enumerate(ch.PARTS):
        texts = {ch.normalise(ch.compose([*base[:i], j, *base[i + 1:]])) for j in range(len(part))}
        assert len(texts) == len(part)


def test_a_generator_never_repeats_a_prompt_even_in_a_tiny_space() -> None:
    tiny = (("",), ("",), ("What about {}?",), ("cats", "dogs", "owls"), ("",), ("",), ("",))
    gen = ch.ChallengeGenerator(rng=random.Random(1), used=["what about OWLS?"], parts=tiny)
    got = {gen.prompt().question for _ in range(2)}
    assert got == {"What about cats?", "What about dogs?"}
    with pytest.raises(ch.ChallengeError, match="no unused prompt"):
        gen.prompt()


def test_what_a_generator_remembers_is_bounded_by_what_the_chain_voids() -> None:
    """A verifier's audit loop may run for months: its generator forgets the oldest used keys and
    texts, never fewer than a plan's most over the epochs the chain voids a revealed prompt for."""
    from verifier.audit import chain

    assert ch.MAX_USED_KEYS == chain.PROMPT_EPOCHS * at.MAX_AUDITED_NODES * at.MAX_CHALLENGES_PER_NODE * at.MAX_TURNS
    assert ch.MAX_USED_TEXTS == chain.PROMPT_EPOCHS * at.MAX_AUDITED_NODES * at.MAX_CHALLENGES_PER_NODE
    gen = ch.ChallengeGenerator(rng=random.Random(1), max_keys=3, max_texts=2)
    gen.mark_used(keys=[bytes([i]) * 16 for i in range(5)], texts=["a", "b", "c"])
    assert [gen.is_used(bytes([i]) * 16) for i in range(5)] == [False, False, True, True, True]
    gen.mark_used(keys=[bytes([2]) * 16, bytes([5]) * 16])  # a key marked again is the newest
    assert [gen.is_used(bytes([i]) * 16) for i in range(6)] == [False, False, True, False, True, True]
    for _ in range(50):
        gen.opening("m")
    assert len(gen._used_keys) == 3 and len(gen._used) == 2


def test_prompts_are_natural_and_fresh() -> None:
    gen = ch.ChallengeGenerator(rng=random.Random(3))
    prompts = [gen.prompt() for _ in range(3000)]
    assert len({p.question for p in prompts}) == 3000
    with_system = [p for p in prompts if len(p.messages) == 2]
    assert 1300 < len(with_system) < 1700
    assert all(p.messages[0].role == "system" for p in with_system)
    assert all(p.messages[-1].role == "user" and p.question.endswith(tuple(".?!")) for p in prompts)
    assert all("  " not in p.question and p.question == p.question.strip() for p in prompts)


def test_parameters_follow_what_the_clients_send_defaults_included() -> None:
    rng = random.Random(4)
    params = [ch.draw_params(rng) for _ in range(20_000)]
    n = len(params)
    chat, gateway = params.count(ch.CHAT_DEFAULTS), params.count(ch.GATEWAY_DEFAULTS)
    assert 0.43 < chat / n < 0.47 and 0.33 < gateway / n < 0.37  # defaults unchanged: 45 % and 35 %
    # the clients' own defaults, as their code has them
    assert (ch.CHAT_DEFAULTS.temperature, ch.CHAT_DEFAULTS.max_tokens, ch.CHAT_DEFAULTS.seed) == (0.7, 256, None)
    assert SamplingParams().temperature == ch.CHAT_DEFAULTS.temperature  # what `user chat` sends unless told
    assert ch.GATEWAY_DEFAULTS.temperature == 1.0 and ch.GATEWAY_DEFAULTS.max_tokens == DEFAULT_MAX_TOKENS
    assert sum(p.max_tokens == 256 for p in params) / n > 0.9  # the default length is most of them
    # no value a client cannot send: the chat has no top-p flag, the gateway takes these ranges
    assert {p.top_p for p in params} <= {1.0, *ch.USER_TOP_P} and all(0 < p.top_p <= 1 for p in params)
    assert all(p == replace(ch.GATEWAY_DEFAULTS, top_p=p.top_p) for p in params if p.top_p < 1.0)  # gateway only
    assert all(p.top_k == 0 for p in params)
    assert all(0.0 <= p.temperature <= 2.0 and type(p.temperature) is float for p in params)
    assert all(1 <= p.max_tokens <= at.MAX_TOKENS for p in params)
    assert all(p.seed is None or 0 <= p.seed <= 2**32 - 1 for p in params)
    # a user's own choices appear, greedy among them
    assert any(p.temperature == 0.0 for p in params) and any(p.seed is not None for p in params)
    assert any(p.top_p < 1.0 for p in params) and any(p.max_tokens != 256 for p in params)
    changed = [p for p in params if p not in (ch.CHAT_DEFAULTS, ch.GATEWAY_DEFAULTS)]
    assert 0.17 < len(changed) / n < 0.21
    # every draw is a challenge the chain takes
    for i, p in enumerate(params[:500]):
        at.Opening(bytes(16), "m", (ChatMessage("user", f"q{i}"),), p).check()


def test_user_chat_and_the_gateway_send_the_defaults_the_generator_copies() -> None:
    """The shares above copy these clients: if their defaults change, so must challenges.py."""
    from gentorrent.cli import build_parser
    from user_client.openai_api import parse_chat

    assert parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).params == ch.GATEWAY_DEFAULTS
    chat = build_parser().parse_args(["user", "chat", "--model", "m"])
    assert SamplingParams(temperature=chat.temperature, max_tokens=chat.max_tokens, seed=chat.seed) == \
        ch.CHAT_DEFAULTS


def test_two_generators_with_system_randomness_differ() -> None:
    a, b = ch.ChallengeGenerator(), ch.ChallengeGenerator()
    assert [a.prompt().question for _ in range(5)] != [b.prompt().question for _ in range(5)]


def test_compose_leaves_out_empty_parts() -> None:
    zero = [0] * len(ch.PARTS)
    assert ch.compose(zero) == "Can you explain photosynthesis?"
    last = [len(p) - 1 for p in ch.PARTS]
    text = ch.compose(last)
    assert text.startswith(ch.OPENERS[-1] + ch.PERSONAS[-1]) and text.endswith(" " + ch.CLOSINGS[-1])
