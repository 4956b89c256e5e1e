"""Audit challenges: prompts, and sampling parameters drawn like the project's clients send them
(decision 0013 §3; docs/committee.md "Audits").

A challenge should look like any user's request to the model node it is sent to.

- **Prompts** come first from users' donations (:mod:`verifier.audit.pool`: users' own prompts,
  multi-turn kept, with their own parameters), then from the verifier operator's private prompts
  (:mod:`verifier.audit.corpus`, ``--challenge-prompts``: secret, each used once, parameters
  from :func:`draw_params`). When a verifier holds neither, the built-in generator here is the
  fallback, and it is **recognisable**: its prompts are composed from seven
  independent parts, each picked uniformly, ``opener`` (:data:`OPENERS`), ``persona``
  (:data:`PERSONAS`), ``question`` (:data:`QUESTIONS`: a template taking a topic), ``topic``
  (:data:`TOPICS`), ``audience`` (:data:`AUDIENCES`), ``form`` (:data:`FORMS`) and ``closing``
  (:data:`CLOSINGS`)::

      "{opener}{persona}{question(topic)} {audience} {form} {closing}"   (empty parts left out)

  :data:`PROMPT_SPACE` = the product of the seven list lengths = **2,641,766,400** distinct
  prompts (12 × 21 × 28 × 195 × 20 × 12 × 8). The space is large, so a node cannot learn the
  prompts in advance, but the lists are in this public repository: a node that has read them can
  tell such a prompt from a user's by its shape and answer it honestly while cheating users (the
  audit-evasion bench measures it; docs/threat-model.md). The verifier logs when it falls back
  to the generator. A :class:`ChallengeGenerator` never hands out the same prompt twice.
- **System prompt** (generator): none in half the challenges, otherwise one of
  :data:`SYSTEM_PROMPTS` (chat users pass ``--system`` or not).
- **Sampling parameters** (generator; donations carry their own), :func:`draw_params`: what the
  project's clients send, defaults included, and no value a client cannot send:

  - :data:`CHAT_SHARE` (45 %): ``gentorrent user chat``'s defaults unchanged
    (:data:`CHAT_DEFAULTS`: temperature 0.7, top-p 1, no top-k, 256 tokens, no seed);
  - :data:`GATEWAY_SHARE` (35 %): the OpenAI-compatible gateway's defaults unchanged
    (:data:`GATEWAY_DEFAULTS`: temperature 1, top-p 1, no top-k, 256 tokens, no seed);
  - the rest (20 %): one of those two with one value a user set: a temperature
    (:data:`USER_TEMPERATURES`, greedy included; the chat's ``--temperature``, the gateway's
    ``temperature`` within 0..2), a ``max_tokens`` (:data:`USER_MAX_TOKENS`), a seed (a
    familiar one, :data:`USER_SEEDS`, or a random 32-bit one, as programs make them), or,
    through the gateway only (the chat has no top-p flag), a top-p (:data:`USER_TOP_P`).

Everything here is I/O-free given its random source: ``rng`` (default :class:`random.SystemRandom`,
which a verifier uses: the prompts must not be predictable) picks the parts; ``urandom`` (default
:func:`os.urandom`) makes the commitment salts.
"""

from __future__ import annotations

import itertools
import math
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from overlay.directory.transcripts import MAX_SEED  # the limit an opening checks
from overlay.wire.messages import ChatMessage, SamplingParams

K = TypeVar("K", str, bytes)

if TYPE_CHECKING:  # tx imports overlay.wire.crypto primitives; kept out of the prompt core's import
    from verifier.audit.tx import Opening

OPENERS = (
    "", "Quick question: ", "Hi! ", "Hello, ", "I was wondering: ", "Can you help me? ", "Out of curiosity, ",
    "Please help: ", "Hey there. ", "Something I keep thinking about: ", "Good morning! ", "A question for you: ",
)
PERSONAS = (
    "", "I'm a retired teacher. ", "I'm a first-year student. ", "I run a small bakery. ", "I'm a nurse on night shifts. ",
    "I'm learning to code. ", "I'm a parent of two. ", "I work in a warehouse. ", "I'm new to this city. ",
    "I'm a hobby gardener. ", "I'm preparing for an exam. ", "I'm a journalist. ", "I volunteer at a library. ",
    "I'm an amateur cyclist. ", "I'm a software tester. ", "I'm writing a novel. ", "I'm a farmer. ",
    "I'm a music student. ", "I'm a bus driver. ", "I'm planning a trip. ", "I'm a science teacher. ",
)
QUESTIONS = (
    "Can you explain {}?", "What are the main advantages and drawbacks of {}?", "Give me some practical tips about {}.",
    "Write a short poem about {}.", "How would you describe {} to someone who has never heard of it?",
    "What is a common misconception about {}?", "Why does {} matter?", "What should a beginner know about {}?",
    "Summarise the history of {}.", "What are the most important facts about {}?",
    "How has {} changed over the last fifty years?", "What questions should I ask about {}?",
    "Tell me a surprising fact about {}.", "How do experts think about {}?",
    "What mistakes do people make with {}?", "Compare {} with something from everyday life.",
    "What would the world look like without {}?", "How can I learn more about {}?",
    "What is the science behind {}?", "Write a short story that involves {}.",
    "What are the ethical questions around {}?", "Give me a simple analogy for {}.",
    "Which jobs involve {}?", "What are the costs of {}?", "How do I get started with {}?",
    "What is the future of {}?", "Describe a typical day that involves {}.", "Argue for and against {}.",
)
TOPICS = (
    "photosynthesis", "public libraries", "learning a second language", "electric bicycles", "the water cycle",
    "compound interest", "volcanoes", "remote work", "honey bees", "composting at home",
    "the printing press", "sleep hygiene", "black holes", "vaccines", "recycling plastics", "the stock market",
    "jazz music", "chess openings", "the Roman Empire", "solar panels", "wind turbines", "coral reefs",
    "the human immune system", "password managers", "open source software", "sourdough bread",
    "marathon training", "urban gardening", "the moon landing", "earthquakes", "tides", "rainforests",
    "bird migration", "the internet", "credit scores", "inflation", "public transport", "tea ceremonies",
    "origami", "board games", "classical architecture", "the periodic table", "DNA", "antibiotics",
    "the French Revolution", "meditation", "podcasts", "electric cars", "nuclear power", "glaciers",
    "deserts", "coffee", "chocolate", "knitting", "birdwatching", "astronomy", "the Olympic Games",
    "sign language", "braille", "the metric system", "time zones", "calendars", "map making", "lighthouses",
    "bridges", "skyscrapers", "the postal service", "newspapers", "radio", "photography", "film making",
    "animation", "comic books", "poetry", "opera", "ballet", "street art", "museums", "zoos",
    "national parks", "camping", "rock climbing", "sailing", "scuba diving", "beekeeping", "cheese making",
    "fermentation", "vegetarian cooking", "food allergies", "hydration", "posture", "running shoes",
    "yoga", "swimming", "team sports", "video games", "virtual reality", "3D printing", "robots",
    "drones", "satellites", "weather forecasting", "climate change", "air pollution", "water purification",
    "wetlands", "forests", "mushrooms", "ferns", "cacti", "orchids", "houseplants", "cats", "dogs",
    "horses", "octopuses", "whales", "penguins", "ants", "spiders", "butterflies", "frogs", "dinosaurs",
    "fossils", "the ice ages", "the Silk Road", "ancient Egypt", "the Vikings", "the Renaissance",
    "the industrial revolution", "trade unions", "elections", "taxes", "budgeting", "saving for retirement",
    "renting a flat", "moving house", "job interviews", "writing a CV", "public speaking", "negotiation",
    "time management", "procrastination", "habits", "memory", "dreams", "emotions", "friendship",
    "volunteering", "parenting", "grandparents", "pets in cities", "noise", "light pollution", "traffic",
    "cycling lanes", "trains", "airports", "passports", "languages of India", "Japanese cuisine",
    "Italian cooking", "spices", "bread baking", "tomatoes", "potatoes", "rice", "olive oil", "honey",
    "salt", "sugar", "vitamins", "first aid", "fire safety", "home insulation", "heat pumps",
    "rainwater harvesting", "batteries", "semiconductors", "encryption", "spam email", "online privacy",
    "search engines", "spreadsheets", "databases", "programming languages", "algorithms", "prime numbers",
    "probability", "geometry", "fractions", "statistics", "logic puzzles", "crosswords", "magic tricks",
)
AUDIENCES = (
    "", "Keep it simple.", "Assume I know nothing.", "I'm fairly advanced.", "Explain it like I'm ten.",
    "Please be precise.", "Use plain language.", "I prefer concrete examples.", "Be friendly.",
    "I'm in a hurry.", "Make it fun.", "Be honest about the uncertainties.", "Avoid jargon.",
    "I like numbers.", "Think step by step.", "Keep a neutral tone.", "Write for a newsletter.",
    "It's for a school project.", "It's for a talk I'm giving.", "My friend asked me this.",
)
FORMS = (
    "", "Answer in two sentences.", "Use a short list.", "Keep it under fifty words.", "Give one example.",
    "End with a question for me.", "Use three bullet points.", "Answer in one paragraph.",
    "Start with a one-line summary.", "Include a number or two.", "Keep it short.", "Finish with a tip.",
)
CLOSINGS = (
    "", "Thanks!", "Thank you.", "Cheers.", "Much appreciated.", "Thanks in advance.", "I'd appreciate it.",
    "Thanks a lot!",
)
SYSTEM_PROMPTS = (
    "You are a helpful assistant.", "You are a friendly and concise assistant.",
    "You are a knowledgeable tutor.", "Answer clearly and briefly.",
)
PARTS = (OPENERS, PERSONAS, QUESTIONS, TOPICS, AUDIENCES, FORMS, CLOSINGS)
PROMPT_SPACE = math.prod(len(p) for p in PARTS)

# What the project's clients send when the user sets nothing (user_client/cli.py `user chat`;
# user_client/openai_api.py, the gateway behind `user serve`).
CHAT_DEFAULTS = SamplingParams(temperature=0.7, top_p=1.0, top_k=0, max_tokens=256, seed=None)
GATEWAY_DEFAULTS = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=256, seed=None)
CHAT_SHARE, GATEWAY_SHARE = 0.45, 0.35  # the rest: one of them with one value a user set
# Values a user sets, all within what both clients accept (the gateway takes temperature 0..2,
# top_p in (0, 1], max_tokens 1..4096, seed 0..2^32-1; the chat has no top-p flag) and within a
# challenge's limits (verifier/audit/tx.py: max_tokens at most 1024).
USER_TEMPERATURES = (0.0, 0.0, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.2)  # greedy the most common choice
USER_TOP_P = (0.8, 0.9, 0.9, 0.95, 0.95)
USER_MAX_TOKENS = (64, 100, 128, 150, 200, 300, 500, 512, 1000, 1024)
USER_SEEDS = (0, 1, 7, 42, 123, 1234, 2024, 12345)
MAX_DRAWS = 1000  # attempts to find an unused prompt before giving up (the space is 10^9: never reached)
# What a generator remembers as used, oldest forgotten first: the most a plan holds (32 nodes x 4
# challenges, 8 user turns each) over the epochs the chain voids a revealed prompt for
# (chain.PROMPT_EPOCHS = 64); tests/unit/test_challenges.py ties these to those constants. Bounded,
# so a verifier's audit loop that runs for months does not grow without end.
MAX_USED_KEYS = 64 * 32 * 4 * 8
MAX_USED_TEXTS = 64 * 32 * 4


class ChallengeError(Exception):
    """No challenge could be made (the generator ran out of fresh prompts: a bug or a tiny space)."""


def compose(choice: Sequence[int], parts: Sequence[Sequence[str]] = PARTS) -> str:
    """The prompt for one choice of part indices (one per entry of ``parts``, :data:`PARTS` by
    default, in order)."""
    opener, persona, question, topic, audience, form, closing = (
        part[i] for part, i in zip(parts, choice, strict=True))
    text = f"{opener}{persona}{question.format(topic)}"
    for extra in (audience, form, closing):
        if extra:
            text += " " + extra
    return text


def normalise(text: str) -> str:
    """As the prompt key sees a prompt: stripped, casefolded, whitespace runs as one space."""
    return " ".join(text.casefold().split())


def draw_params(rng: random.Random) -> SamplingParams:
    """Sampling parameters as the project's clients send them (module docstring): a client's
    defaults unchanged in 80 % of the draws, one user-set value in the rest."""
    u = rng.random()
    if u < CHAT_SHARE:
        return CHAT_DEFAULTS
    if u < CHAT_SHARE + GATEWAY_SHARE:
        return GATEWAY_DEFAULTS
    gateway = rng.random() < GATEWAY_SHARE / (CHAT_SHARE + GATEWAY_SHARE)
    base = GATEWAY_DEFAULTS if gateway else CHAT_DEFAULTS
    knob = rng.random()
    if gateway and knob < 0.15:  # only the gateway takes a top-p
        return replace(base, top_p=rng.choice(USER_TOP_P))
    if knob < 0.55:
        return replace(base, temperature=rng.choice(USER_TEMPERATURES))
    if knob < 0.8:
        return replace(base, max_tokens=rng.choice(USER_MAX_TOKENS))
    seed = rng.choice(USER_SEEDS) if rng.random() < 0.5 else rng.randint(0, MAX_SEED)
    return replace(base, seed=seed)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One challenge's plaintext before it gets a salt: the chat messages and sampling parameters."""

    messages: tuple[ChatMessage, ...]
    params: SamplingParams

    @property
    def question(self) -> str:
        return self.messages[-1].content


def _remember(seen: dict[K, None], items: Iterable[K], most: int) -> None:
    """Add ``items`` to ``seen`` as its newest (insertion order), then forget the oldest past ``most``."""
    for item in items:
        seen.pop(item, None)
        seen[item] = None
    for old in list(itertools.islice(seen, max(0, len(seen) - most))):
        del seen[old]


class ChallengeGenerator:
    """Fresh challenges from the built-in prompt parts (the fallback when no donated prompt is
    held; recognisable, see the module docstring), never the same prompt twice from one generator.

    ``used`` (normalised prompt texts, or anything :meth:`mark_used` accepts) seeds what counts
    as used. ``rng`` picks prompts and parameters; ``urandom(16)`` makes salts; ``parts`` are the
    prompt parts (:data:`PARTS`; tests pass a tiny space). It remembers the latest
    ``max_keys`` prompt keys and ``max_texts`` texts (:data:`MAX_USED_KEYS`,
    :data:`MAX_USED_TEXTS`), the oldest forgotten first."""

    def __init__(self, *, rng: random.Random | None = None, urandom: Callable[[int], bytes] = os.urandom,
                 used: Iterable[str] = (), parts: Sequence[Sequence[str]] = PARTS,
                 max_keys: int = MAX_USED_KEYS, max_texts: int = MAX_USED_TEXTS) -> None:
        self.rng = rng or random.SystemRandom()
        self.parts = parts
        self.urandom = urandom
        self.max_keys, self.max_texts = max_keys, max_texts
        self._used: dict[str, None] = {}  # insertion order: the oldest first
        self._used_keys: dict[bytes, None] = {}
        self.mark_used(texts=used)

    def mark_used(self, *, texts: Iterable[str] = (), keys: Iterable[bytes] = ()) -> None:
        """Never hand out these prompts (texts) or prompt keys (:meth:`Opening.prompt_key`), while
        they are among the latest remembered."""
        _remember(self._used, (normalise(t) for t in texts), self.max_texts)
        _remember(self._used_keys, keys, self.max_keys)

    def is_used(self, key: bytes) -> bool:
        """Whether this prompt key (:meth:`Opening.prompt_key`) was handed out or marked used."""
        return key in self._used_keys

    def prompt(self) -> Prompt:
        """A fresh question with a system prompt half the time, and its sampling parameters."""
        for _ in range(MAX_DRAWS):
            text = compose([self.rng.randrange(len(p)) for p in self.parts], self.parts)
            norm = normalise(text)
            if norm in self._used:
                continue
            _remember(self._used, (norm,), self.max_texts)
            messages: tuple[ChatMessage, ...] = (ChatMessage("user", text),)
            if self.rng.random() < 0.5:
                messages = (ChatMessage("system", self.rng.choice(SYSTEM_PROMPTS)), *messages)
            return Prompt(messages, draw_params(self.rng))
        raise ChallengeError(f"no unused prompt in {MAX_DRAWS} draws from a space of {PROMPT_SPACE}")

    def opening(self, model: str) -> Opening:
        """A fresh challenge for ``model``: prompt, parameters and a random 16-byte salt."""
        from verifier.audit.tx import Opening

        for _ in range(MAX_DRAWS):
            p = self.prompt()
            o = Opening(salt=self.urandom(16), model=model, messages=p.messages, params=p.params)
            key = o.prompt_key()
            if key not in self._used_keys:
                _remember(self._used_keys, (key,), self.max_keys)
                return o
        raise ChallengeError("every drawn prompt's key was already used")
