"""Audit challenges (verifier/challenges.py): the prompt space, freshness, parameters drawn like users'."""

from __future__ import annotations

import math
import random

import pytest

from verifier import challenges as ch


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
        texts = {ch.normalise(ch.compose(base[:i] + [j] + base[i + 1:])) for j in range(len(part))}
        assert len(texts) == len(part)


def test_a_generator_never_repeats_a_prompt_even_in_a_tiny_space() -> None:
    tiny = (("",), ("",), ("What about {}?",), ("cats", "dogs", "owls"), ("",), ("",), ("",))
    gen = ch.ChallengeGenerator(rng=random.Random(1), used=["what about OWLS?"], parts=tiny)
    got = {gen.prompt().question for _ in range(2)}
    assert got == {"What about cats?", "What about dogs?"}
    with pytest.raises(ch.ChallengeError, match="no unused prompt"):
        gen.prompt()


def test_prompts_and_parameters_are_natural_and_drawn_like_users() -> None:
    gen = ch.ChallengeGenerator(rng=random.Random(3))
    prompts = [gen.prompt() for _ in range(3000)]
    assert len({p.question for p in prompts}) == 3000
    temps = [p.params.temperature for p in prompts]
    for t in ch.TEMPERATURES:
        assert 800 < temps.count(t) < 1200  # a third each
    assert all(ch.MIN_MAX_TOKENS <= p.params.max_tokens <= ch.MAX_MAX_TOKENS for p in prompts)
    assert {p.params.max_tokens for p in prompts} == set(range(ch.MIN_MAX_TOKENS, ch.MAX_MAX_TOKENS + 1))
    assert all(p.params.top_k == 0 and p.params.top_p in (1.0, 0.9, 0.95) for p in prompts)
    seeded = [p.params.seed for p in prompts if p.params.seed is not None]
    assert 1300 < len(seeded) < 1700 and len(set(seeded)) > 1400
    with_system = [p for p in prompts if len(p.messages) == 2]
    assert 1300 < len(with_system) < 1700
    assert all(p.messages[0].role == "system" for p in with_system)
    assert all(p.messages[-1].role == "user" and p.question.endswith(tuple(".?!")) for p in prompts)
    assert all("  " not in p.question and p.question == p.question.strip() for p in prompts)


def test_two_generators_with_system_randomness_differ() -> None:
    a, b = ch.ChallengeGenerator(), ch.ChallengeGenerator()
    assert [a.prompt().question for _ in range(5)] != [b.prompt().question for _ in range(5)]


def test_compose_leaves_out_empty_parts() -> None:
    zero = [0] * len(ch.PARTS)
    assert ch.compose(zero) == "Can you explain photosynthesis?"
    last = [len(p) - 1 for p in ch.PARTS]
    text = ch.compose(last)
    assert text.startswith(ch.OPENERS[-1] + ch.PERSONAS[-1]) and text.endswith(" " + ch.CLOSINGS[-1])
