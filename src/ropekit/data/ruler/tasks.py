"""RULER's 13 tasks: exact templates, answer prefixes, budgets, metrics and sample generators.

Templates, answer prefixes and ``tokens_to_generate`` are RULER's (NVIDIA/RULER
``scripts/data/synthetic/constants.py``); the task table is ``scripts/synthetic.yaml``; the generators follow
``niah.py``, ``variable_tracking.py``, ``common_words_extraction.py``, ``freq_words_extraction.py`` and
``qa.py`` of current ``main`` (docs/methods-reference.md §10). Each generator maps a *haystack size*
(the "knob": noise lines, essay words, distractor needles, words, coded words or documents) and a random
generator to one :class:`Prompt`; :mod:`.fit` chooses the knob so the prompt fits the length.

Deliberate differences from RULER, each to keep a sample well defined:

* **Per-sample randomness.** RULER draws from one global ``random`` stream and shuffles the needle order, the
  CWE word list, the FWE vocabulary/text and the QA documents with a *fixed* ``Random(seed)`` (the same
  permutation pattern in every sample; docs/methods-reference.md §10). Here every draw of a sample comes from that sample's own
  generator, so samples are not byte-identical to RULER's; the same seed reproduces them byte for byte.
* **Distinct draws where a collision would mislabel a sample**: needle keys (and the distractor needles' keys
  in niah_multikey_2/3) never repeat a queried key, values of one sample are distinct, variable names are
  distinct and never ``VAR``. An ``adjective-noun`` key is drawn as a uniform adjective and a uniform noun,
  which is RULER's ``random.choice`` over the sorted set of all pairs up to the handful of pairs the set merges.
* **Empty haystacks allowed**: the knob may go down to 0 (needles or the chain alone) so that short lengths
  still give a prompt; RULER's smallest is one ``incremental``. Where fewer noise lines than chain statements
  remain, vt splits the lines into sentences (RULER's paper-era fallback).
* **vt's one-shot example** is re-randomised in one simultaneous, word-bounded pass (RULER's sequential
  ``str.replace`` can rename a name twice or inside another name).
* **Sentence splitting** of the essay haystack uses :func:`ropekit.data.prose.split_sentences` (a rule-based
  splitter) instead of NLTK punkt, and the essay is the Python documentation prose
  (:data:`~ropekit.data.prose.PROSE_SOURCE`) standing in for Paul Graham's essays.
* **CWE's one-shot example in chat mode** is a user turn and an assistant turn (the answer prefix's leading space
  dropped), where RULER pastes the fully chat-wrapped example, its answer left open, as raw text before the real
  prompt (``ropekit.eval.ruler.fit``). Base-model prompts are RULER's byte for byte.
"""

from __future__ import annotations

import abc
import math
import random
import re
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.special import zeta

from ..prose import PROSE_SOURCE, prose_paragraphs, split_sentences
from ..words import ADJECTIVES, NOUNS, WORDS_SOURCE, common_word_list, large_word_list
from .qa_data import QA_FILES, QAData

# ---- RULER's strings (constants.py), verbatim --------------------------------------------------------
NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
NIAH_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE_LINE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: "
)
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
)
CWE_ANSWER_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
    "\n\nThe following are given documents.\n\n{context}\n\n"
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
    "\n\nQuestion: {query}"
)
QA_ANSWER_PREFIX = " Answer:"
QA_DOCUMENT = "Document {i}:\n{document}"

#: RULER's essay insertion depths: ``np.round(np.linspace(0, 100, 40))`` (no value lies near a .5 tie).
DEPTHS = tuple(round(100 * i / 39) for i in range(40))

#: RULER switches its frequency settings and noise ``incremental`` below this length.
SHORT_LENGTH = 4096


@dataclass(frozen=True)
class TaskSpec:
    """One of RULER's 13 tasks (``synthetic.yaml``): family, generation budget, metric and settings."""

    name: str
    family: str  # niah | vt | cwe | fwe | qa
    tokens_to_generate: int
    metric: str  # string_match_all | string_match_part
    haystack: str  # noise | essay | needle | words | coded | documents
    settings: dict[str, Any] = field(default_factory=dict)


def _niah(name, haystack, k, v, num_k=1, num_v=1, num_q=1):
    return TaskSpec(name, "niah", 128, "string_match_all", haystack,
                    {"type_needle_k": k, "type_needle_v": v, "num_needle_k": num_k, "num_needle_v": num_v, "num_needle_q": num_q})


#: RULER's 13 tasks in its own order (the order of its tables and of the summary).
TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        _niah("niah_single_1", "noise", "words", "numbers"),
        _niah("niah_single_2", "essay", "words", "numbers"),
        _niah("niah_single_3", "essay", "words", "uuids"),
        _niah("niah_multikey_1", "essay", "words", "numbers", num_k=4),
        _niah("niah_multikey_2", "needle", "words", "numbers"),
        _niah("niah_multikey_3", "needle", "uuids", "uuids"),
        _niah("niah_multivalue", "essay", "words", "numbers", num_v=4),
        _niah("niah_multiquery", "essay", "words", "numbers", num_k=4, num_q=4),
        TaskSpec("vt", "vt", 30, "string_match_all", "noise", {"num_chains": 1, "num_hops": 4}),
        TaskSpec("cwe", "cwe", 120, "string_match_all", "words", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10, "num_fewshot": 1}),
        TaskSpec("fwe", "fwe", 50, "string_match_all", "coded", {"alpha": 2.0, "coded_wordlen": 6}),
        TaskSpec("qa_1", "qa", 32, "string_match_part", "documents", {"dataset": "squad"}),
        TaskSpec("qa_2", "qa", 32, "string_match_part", "documents", {"dataset": "hotpotqa"}),
    )
}


@dataclass
class Prompt:
    """One generated sample before chat wrapping and tokenisation.

    ``user`` is the filled task template (with vt's one-shot example in front), ``answer_prefix`` is appended
    after it (after the chat template's assistant tag when chat is on), ``shots`` are cwe's few-shot turns as
    (user text, assistant text with its answer prefix), ``references`` the gold answers.
    """

    user: str
    answer_prefix: str
    references: list[str]
    shots: list[tuple[str, str]] = field(default_factory=list)
    fewshot: int = 0
    haystack: str = ""

    def base_text(self) -> str:
        """RULER's ``base`` template (no chat): few-shot turns as ``user + assistant + "\\n"``, then the task text
        and the answer prefix."""
        return "".join(u + a + "\n" for u, a in self.shots) + self.user + self.answer_prefix


def singular(text: str) -> str:
    """RULER's rewrite of a niah template when exactly one value is asked for (num_q × num_v == 1)."""
    return text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")


class Generator(abc.ABC):
    """Samples of one task at one length; subclasses say how a knob value and a generator make a prompt.

    The knob is RULER's haystack size: noise lines (niah_single_1, vt), essay words (niah essay tasks),
    distractor needles (niah_multikey_2/3), distinct words (cwe), coded words N (fwe), documents (qa).
    ``min_knob`` is the smallest haystack that can be built, ``incremental`` RULER's step at this length,
    ``max_fewshot`` how many in-context examples RULER prepends (dropped by :mod:`.fit` only when even the
    smallest haystack cannot fit with them).
    """

    min_knob = 0
    max_fewshot = 0

    def __init__(self, spec: TaskSpec, length: int, seed: int, count_tokens: Callable[[str], int]):
        self.spec = spec
        self.length = length
        self.seed = seed
        self.count_tokens = count_tokens

    @property
    @abc.abstractmethod
    def incremental(self) -> int:
        """RULER's step of the haystack knob for this task family."""

    @property
    def max_knob(self) -> int | None:
        return None

    @abc.abstractmethod
    def build(self, knob: int, rng: random.Random, fewshot: int, index: int) -> Prompt:
        """One sample with haystack size ``knob`` (each task family defines it)."""

    def valid(self, knob: int) -> bool:
        """Whether a sample with this knob is well posed (fwe: the three answers are strictly the most frequent)."""
        return True

    def upper_estimate(self, measure: Callable[[int], int]) -> int:
        """RULER's search ceiling: 3 × length / (tokens per unit, measured at one ``incremental``)."""
        inc = self.incremental
        per_unit = max(measure(inc), 1) / inc
        return max(int(self.length / per_unit * 3), 2 * inc, self.min_knob)


# ---- niah ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def depth_cut(n_sentences: int, depth: int) -> int:
    """The sentence after which a needle goes at ``depth`` percent, as RULER's niah.py computes it:
    ``int(len(document_sents) * (depth / 100))``, the fraction first. In floating point that is not
    ``n * depth / 100``: 300 sentences at depth 41 give 122 here and 123 the other way."""
    return int(n_sentences * (depth / 100))


def _essay_words() -> tuple[str, ...]:
    return tuple(" ".join(prose_paragraphs()).split())


def essay_text(n_words: int) -> str:
    """:func:`ropekit.data.prose.prose_text` (RULER's essay: the first n whitespace words, cycled), with the
    word list split once instead of on every probe of the length search."""
    words = _essay_words()
    reps, rest = divmod(n_words, len(words))
    return " ".join(words * reps + words[:rest]) if reps else " ".join(words[:rest])


def _draw(kind: str, rng: random.Random) -> str:
    if kind == "numbers":  # RULER: 7 digits
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(kind)


def _draw_new(kind: str, rng: random.Random, used: set[str]) -> str:
    while True:
        item = _draw(kind, rng)
        if item not in used:
            used.add(item)
            return item


class NiahGenerator(Generator):
    """``niah.py``: needles ``One of the special magic {v} for {key} is: {value}.`` in a noise, essay or needle haystack.

    ``essay(n_words, rng)`` replaces the essay haystack's text (default: RULER's, the essay's first ``n_words``
    words, :func:`essay_text`); the built-in base model's training documents use the training split there, so
    it never reads the evaluation's essay.
    """

    def __init__(self, spec: TaskSpec, length: int, seed: int, count_tokens: Callable[[str], int],
                 essay: Callable[[int, random.Random], str] | None = None):
        super().__init__(spec, length, seed, count_tokens)
        self.essay = essay or (lambda n_words, rng: essay_text(n_words))

    @property
    def incremental(self) -> int:
        if self.spec.haystack == "essay":
            return 500
        return 5 if self.length < SHORT_LENGTH else 25

    def build(self, knob: int, rng: random.Random, fewshot: int, index: int) -> Prompt:
        s = self.spec.settings
        type_k, type_v = s["type_needle_k"], s["type_needle_v"]
        num_k = max(s["num_needle_k"], s["num_needle_q"])
        used: set[str] = set()
        keys, values, needles = [], [], []
        for _ in range(num_k):
            key = _draw_new(type_k, rng, used)
            keys.append(key)
            vals = [_draw_new(type_v, rng, used) for _ in range(s["num_needle_v"])]
            values.append(vals)
            needles.extend(NIAH_NEEDLE.format(type_needle_v=type_v, key=key, value=v) for v in vals)
        rng.shuffle(needles)

        if self.spec.haystack == "essay":
            sentences = split_sentences(self.essay(knob, rng)) if knob else []
            cuts = [0] + sorted(depth_cut(len(sentences), d) for d in rng.sample(DEPTHS, len(needles))) + [len(sentences)]
            parts = []
            for i in range(1, len(cuts)):
                parts.append(" ".join(sentences[cuts[i - 1]:cuts[i]]))
                if i - 1 < len(needles):
                    parts.append(needles[i - 1])
            context = " ".join(parts)
            label = PROSE_SOURCE
        else:
            if self.spec.haystack == "noise":
                lines = [NOISE_LINE] * knob
            else:  # distractor needles: same types, keys never equal to a real key
                lines = [NIAH_NEEDLE.format(type_needle_v=type_v, key=_draw_new(type_k, rng, used), value=_draw(type_v, rng))
                         for _ in range(knob)]
            # RULER samples distinct line indices among the haystack; an empty haystack leaves the needles alone
            slots = sorted(rng.sample(range(max(knob, len(needles))), len(needles)), reverse=True)
            for slot, needle in zip(slots, needles):
                lines.insert(slot, needle)
            context = "\n".join(lines)
            label = self.spec.haystack

        chosen = rng.sample(range(num_k), s["num_needle_q"])
        queries = [keys[i] for i in chosen]
        answers = [v for i in chosen for v in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        template, prefix, type_v_text = NIAH_TEMPLATE, NIAH_ANSWER_PREFIX, type_v
        if s["num_needle_q"] * s["num_needle_v"] == 1:
            template, prefix, type_v_text = singular(template), singular(prefix), type_v[:-1]
        return Prompt(
            user=template.format(type_needle_v=type_v_text, context=context, query=query),
            answer_prefix=prefix.format(type_needle_v=type_v_text, query=query),
            references=answers,
            haystack=label,
        )


# ---- vt -----------------------------------------------------------------------------------------------
def _random_name(rng: random.Random, k: int) -> str:
    return "".join(rng.choices(string.ascii_uppercase, k=k))


class VTGenerator(Generator):
    """``variable_tracking.py``: one chain ``VAR A = 12345``, ``VAR B = VAR A `` … hidden among noise lines.

    A one-shot example is prepended: built once (3-letter names, value 12345, a ~500-token prompt with the
    bare template and answer prefix followed by its answer), then re-randomised per sample (new names of the
    same lengths, a new value).
    """

    max_fewshot = 1
    ICL_TOKENS = 500

    def __init__(self, spec, length, seed, count_tokens):
        super().__init__(spec, length, seed, count_tokens)
        self.hops = spec.settings["num_hops"]
        self.icl = self._build_icl()

    @property
    def incremental(self) -> int:
        return 5 if self.length < SHORT_LENGTH else 10

    def _chain(self, rng: random.Random, icl: bool):
        k, hops = (3, min(10, self.hops)) if icl else (5, self.hops)
        names: list[str] = []
        while len(names) < hops + 1:
            name = _random_name(rng, k)
            if name not in names and name != "VAR":
                names.append(name)
        value = "12345" if icl else str(rng.randint(10000, 99998))  # np.random.randint(10000, 99999): upper excluded
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]
        return names, value, chain

    def _text(self, knob: int, rng: random.Random, icl: bool):
        names, value, chain = self._chain(rng, icl)
        units = [NOISE_LINE] * knob
        if 0 < len(units) < len(chain):  # too few lines for one statement each: split them into sentences
            units = [s.strip() + "." for line in units for s in line.split(".") if s.strip()]
        slots = sorted(rng.sample(range(max(len(units), len(chain))), len(chain)))
        for j, (slot, statement) in enumerate(zip(slots, chain)):
            units.insert(slot + j, statement)
        context = "\n".join(units).replace(". \n", ".\n")
        num_v = len(names)
        user = VT_TEMPLATE.format(context=context, query=value, num_v=num_v)
        prefix = VT_ANSWER_PREFIX.format(context=context, query=value, num_v=num_v)
        return user, prefix, names

    def _build_icl(self) -> str:
        """The example RULER builds first: the largest noise that keeps the bare prompt within 500 tokens."""
        icl_seed = f"ruler|{self.seed}|vt|icl"  # one example for every length, as RULER's (built first from seed 42)

        def measure(knob):
            user, prefix, _ = self._text(knob, random.Random(icl_seed), icl=True)
            return self.count_tokens(user + prefix)

        knob = 0
        lo, hi = 0, 2 * 5
        while measure(hi) <= self.ICL_TOKENS:
            lo, hi = hi, hi * 2
        while lo <= hi:
            mid = (lo + hi) // 2
            if measure(mid) <= self.ICL_TOKENS:
                knob, lo = mid, mid + 1
            else:
                hi = mid - 1
        user, prefix, names = self._text(knob, random.Random(icl_seed), icl=True)
        return user + prefix + " " + " ".join(names) + "\n"

    def randomize_icl(self, rng: random.Random) -> str:
        """The example with its answer names and its value 12345 replaced by fresh random ones (one pass)."""
        tail = VT_ANSWER_PREFIX[-10:]
        names = self.icl[self.icl.index(tail) + len(tail):].split()
        mapping: dict[str, str] = {}
        for name in names:
            while True:
                new = _random_name(rng, len(name))
                if new != "VAR" and new not in mapping.values():
                    break
            mapping[name] = new
        mapping["12345"] = str(rng.randint(10000, 99998))
        pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in mapping) + r")\b")
        return pattern.sub(lambda m: mapping[m.group(0)], self.icl)

    def build(self, knob: int, rng: random.Random, fewshot: int, index: int) -> Prompt:
        user, prefix, names = self._text(knob, rng, icl=False)
        if fewshot:
            user = self.randomize_icl(rng) + "\n" + user
        return Prompt(user=user, answer_prefix=prefix, references=names, fewshot=fewshot, haystack="noise")


# ---- cwe ----------------------------------------------------------------------------------------------
def numbered(words: list[str]) -> str:
    """``"1. w 2. w 3. w …"``, RULER's rendering of a word list."""
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


class CWEGenerator(Generator):
    """``common_words_extraction.py``: a numbered list where 10 words repeat more often than the rest.

    At ≥ 4096 tokens the few-shot example has 40 words (common ×10, others ×3) and the item n words (×30, ×3);
    below, 20 words (×3, ×1) and n words (×6, ×1). More distinct words than the wonderwords lists hold come
    from :func:`ropekit.data.words.large_word_list` (RULER's "randle" list).
    """

    def __init__(self, spec, length, seed, count_tokens):
        super().__init__(spec, length, seed, count_tokens)
        s = spec.settings
        self.num_cw = s["num_cw"]
        self.max_fewshot = s["num_fewshot"]
        self.min_knob = self.num_cw
        if length < SHORT_LENGTH:
            self.example_setting, self.item_repeats = (20, 3, 1), (6, 1)
        else:
            self.example_setting, self.item_repeats = (40, 10, 3), (s["freq_cw"], s["freq_ucw"])

    @property
    def incremental(self) -> int:
        return 10

    @property
    def max_knob(self) -> int:
        return len(large_word_list())

    def _example(self, rng: random.Random, n: int, common_reps: int, uncommon_reps: int):
        small = common_word_list()
        vocab = small if n <= len(small) else large_word_list()
        chosen = rng.sample(vocab, n)
        common, uncommon = chosen[:self.num_cw], chosen[self.num_cw:]
        words = common * common_reps + uncommon * uncommon_reps
        rng.shuffle(words)
        return numbered(words), common, vocab is small

    def build(self, knob: int, rng: random.Random, fewshot: int, index: int) -> Prompt:
        shots = []
        for _ in range(fewshot):
            context, answer, _ = self._example(rng, *self.example_setting)
            shots.append((CWE_TEMPLATE.format(context=context), CWE_ANSWER_PREFIX + " " + numbered(answer)))
        context, answer, small = self._example(rng, knob, *self.item_repeats)
        label = WORDS_SOURCE if small else f"{WORDS_SOURCE}+{PROSE_SOURCE}"
        return Prompt(user=CWE_TEMPLATE.format(context=context), answer_prefix=CWE_ANSWER_PREFIX, references=answer,
                      shots=shots, fewshot=fewshot, haystack=label)

    def upper_estimate(self, measure: Callable[[int], int]) -> int:
        # RULER measures 4096 words and allows twice the words that many tokens per word would fit
        per_word = max(measure(4096), 1) / 4096
        return min(max(int(self.length // per_word) * 2, 2 * self.incremental), self.max_knob)


# ---- fwe ----------------------------------------------------------------------------------------------
def zipf_counts(num_words: int, vocab_size: int, alpha: float) -> list[int]:
    """RULER's copies per rank k = 1…V: ``int(N · k^-α / ζ(α))`` (``scipy.special.zeta``)."""
    k = np.arange(1, vocab_size + 1)
    return [int(c) for c in (num_words * (k ** -alpha) / zeta(alpha)).astype(int)]


class FWEGenerator(Generator):
    """``freq_words_extraction.py``: Zipf-distributed random 6-letter words; rank 1 is ``...`` (noise).

    The vocabulary has ``(length − 50) // 50`` words; the answer is ranks 2–4. The coded-word count N is
    found as RULER does: start at budget // 6, grow by budget // 32 while the prompt is shorter than the
    budget, step back once; each sample then shrinks by that step until it fits.
    """

    def __init__(self, spec, length, seed, count_tokens):
        super().__init__(spec, length, seed, count_tokens)
        self.alpha = spec.settings["alpha"]
        self.wordlen = spec.settings["coded_wordlen"]
        self.budget = length - spec.tokens_to_generate
        self.vocab_size = self.budget // 50
        self.min_knob = self._smallest_valid()

    @property
    def incremental(self) -> int:
        return max(1, self.budget // 32)

    def valid(self, knob: int) -> bool:
        if self.vocab_size < 4:
            return False
        counts = zipf_counts(knob, self.vocab_size, self.alpha)
        return counts[3] >= 1 and (self.vocab_size == 4 or counts[3] > counts[4])

    def _smallest_valid(self) -> int:
        if self.vocab_size < 4:
            return 1 << 30  # never: the caller reports the minimum length
        n = 1
        while not self.valid(n):
            n += 1
        return n

    def build(self, knob: int, rng: random.Random, fewshot: int, index: int) -> Prompt:
        vocab: set[str] = set()
        while len(vocab) < self.vocab_size:
            vocab.add("".join(rng.choices(string.ascii_lowercase, k=self.wordlen)))
        words = sorted(vocab)
        rng.shuffle(words)
        words[0] = "..."
        text = [w for w, c in zip(words, zipf_counts(knob, self.vocab_size, self.alpha)) for _ in range(c)]
        rng.shuffle(text)
        return Prompt(user=FWE_TEMPLATE.format(context=" ".join(text)), answer_prefix=FWE_ANSWER_PREFIX,
                      references=words[1:4], haystack="zipf-coded-words")


# ---- qa -----------------------------------------------------------------------------------------------
class QAGenerator(Generator):
    """``qa.py``: sample i asks question i; its gold document(s) among same-article and random others."""

    min_knob = 1

    def __init__(self, spec, length, seed, count_tokens, data: QAData):
        super().__init__(spec, length, seed, count_tokens)
        self.data = data

    @property
    def incremental(self) -> int:
        return 10

    def build(self, knob: int, rng: random.Random, fewshot: int, index: int) -> Prompt:
        item = self.data.items[index]
        docs = self.data.documents
        gold, more = list(item.gold), list(item.more)
        n = max(knob, len(gold))  # RULER cannot build fewer documents than the gold ones
        if n < len(docs):
            if n - len(gold) > len(more):
                taken = set(gold) | set(more)
                others = [i for i in range(len(docs)) if i not in taken]
                chosen = gold + more + rng.sample(others, n - len(gold) - len(more))
            else:
                chosen = gold + rng.sample(more, n - len(gold))
            picked = [docs[i] for i in chosen]
        else:
            picked = list(docs) * math.ceil(n / len(docs))
            picked = picked[:n]
        rng.shuffle(picked)
        context = "\n\n".join(QA_DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(picked))
        return Prompt(user=QA_TEMPLATE.format(context=context, query=item.query), answer_prefix=QA_ANSWER_PREFIX,
                      references=list(item.references), haystack=QA_FILES[self.spec.name][2])


def make_generator(spec: TaskSpec, length: int, seed: int, count_tokens: Callable[[str], int], qa: QAData | None = None,
                   *, essay: Callable[[int, random.Random], str] | None = None) -> Generator:
    """The generator of ``spec`` at ``length`` (``qa`` holds the local data set for qa_1 / qa_2; ``essay`` replaces
    the niah essay haystack's text, :class:`NiahGenerator`)."""
    if spec.family == "niah":
        return NiahGenerator(spec, length, seed, count_tokens, essay)
    if spec.family == "vt":
        return VTGenerator(spec, length, seed, count_tokens)
    if spec.family == "cwe":
        return CWEGenerator(spec, length, seed, count_tokens)
    if spec.family == "fwe":
        return FWEGenerator(spec, length, seed, count_tokens)
    if spec.family == "qa":
        if qa is None:
            raise ValueError(f"{spec.name} needs its data set")
        return QAGenerator(spec, length, seed, count_tokens, qa)
    raise ValueError(spec.family)
