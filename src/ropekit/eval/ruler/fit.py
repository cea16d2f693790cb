"""Length control for RULER samples: render the prompt, count its tokens, size the haystack to the length.

The rule is RULER's (``max_seq_length`` counts the prompt and ``tokens_to_generate``): the tokens of the
final prompt — optional chat template, task template, answer prefix — plus the task's generation budget
must not exceed the target length. As in current RULER (``niah.py`` etc. since commit 56ea4ef) the haystack
knob is binary-searched once per task and length, between the smallest buildable haystack and
3 × length / (tokens per unit measured at one ``incremental``) (cwe: 2 × length / tokens per word measured on
4096 words), and each sample then shrinks its knob by ``incremental`` until it fits; fwe keeps RULER's own
linear search for its word count. Differences:

* Tokens are counted exactly as the model will receive them: ``tokenizer(text).input_ids`` with the
  tokenizer's BOS when there is no chat template (RULER counts ``tokenize()`` without BOS, so its prompts
  can run one token over), and with ``add_special_tokens=False`` on chat-rendered text, which carries its
  own special tokens.
* The search starts from the smallest buildable haystack rather than one ``incremental`` (so short lengths
  still fit) and doubles its ceiling if the estimated one still fits (RULER would stop short); a sample
  shrinks by ``incremental`` only while its haystack is at least four of them long, by a tenth below, so a
  short prompt is not emptied in one step.
* Few-shot examples (vt's one-shot, cwe's example) are dropped only when the smallest haystack cannot
  fit with them; the record says ``fewshot: 0``. Below that, the task cannot run at this length and a
  :class:`~ropekit.errors.RopekitError` names the minimum length.
* Each probe and each sample draws from its own seeded generator (seed, task, length, sample index), so a
  sample at a given knob is a pure function of those and the same seed reproduces it byte for byte.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from ...data.ruler.qa_data import QAData
from ...data.ruler.tasks import FWEGenerator, Generator, Prompt, TaskSpec, make_generator
from ...errors import RopekitError
from ..common import encode


def derive_seed(*parts) -> int:
    """A 64-bit seed from ``parts`` (stable across processes and Python hash seeds)."""
    return int.from_bytes(hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()[:8], "big")


class Renderer:
    """Turns a :class:`Prompt` into the model's input text and ids, with or without the chat template.

    Without chat (RULER's ``base`` template): few-shot turns as ``user + assistant + "\\n"``, then the task
    text and the answer prefix. With chat: the few-shot turns become user/assistant messages, the task text
    the last user message, ``apply_chat_template(add_generation_prompt=True)`` wraps them and the answer
    prefix follows the assistant tag, as RULER appends it after its model template. The template is the
    model's own: a system turn it inserts by itself (SmolLM2's default persona, Llama 3.1's knowledge-date
    block) stays in the prompt, where RULER's templates (``scripts/data/template.py``) have no system turn.
    """

    def __init__(self, tokenizer, chat: bool):
        self.tokenizer = tokenizer
        self.chat = chat

    def text(self, prompt: Prompt) -> str:
        if not self.chat:
            return prompt.base_text()
        messages = []
        for user, assistant in prompt.shots:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant.strip()}]
        messages.append({"role": "user", "content": prompt.user})
        wrapped = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return wrapped + prompt.answer_prefix

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text, add_special_tokens=not self.chat)

    def count_bare(self, text: str) -> int:
        """Tokens of a piece of text placed inside a prompt (no special tokens)."""
        return len(encode(self.tokenizer, text, add_special_tokens=False))


@dataclass
class Sample:
    """A finished prompt: ``text`` (what the model reads), its ``ids`` and what scoring needs."""

    task: str
    index: int
    length: int
    text: str
    ids: list[int]
    answer_prefix: str
    references: list[str]
    knob: int
    fewshot: int
    haystack: str

    @property
    def prompt_tokens(self) -> int:
        return len(self.ids)


def largest_fitting(fits: Callable[[int], bool], lo: int, hi: int, cap: int | None) -> int:
    """Largest knob in [lo, …] with ``fits`` true, ``lo`` known to fit: binary search under ``hi`` (raised by
    doubling while it still fits, never past ``cap``)."""
    best = lo
    hi = max(hi, lo)
    if cap is not None:
        hi = min(hi, cap)
    while fits(hi):
        best = hi
        if cap is not None and hi >= cap:
            return best
        hi = max(hi * 2, hi + 1) if cap is None else min(max(hi * 2, hi + 1), cap)
    lo = best + 1
    hi -= 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def shrink_step(knob: int, incremental: int) -> int:
    """How far a sample that does not fit shrinks its knob: RULER's ``incremental`` while the haystack is at
    least four of them long, a tenth of it below (so a short prompt is not emptied in one step)."""
    return incremental if knob >= 4 * incremental else max(1, knob // 10)


class Plan:
    """One task at one length: the fitted knob and few-shot count, and the samples they give."""

    def __init__(self, spec: TaskSpec, length: int, renderer: Renderer, seed: int, qa: QAData | None = None):
        self.spec = spec
        self.length = length
        self.renderer = renderer
        self.seed = seed
        self.qa = qa
        self.budget = length - spec.tokens_to_generate
        self.generator = self._generator(length)
        self.search_seed = derive_seed("ruler", seed, spec.name, length, "search")
        self.knob, self.fewshot = self._fit()

    def _generator(self, length: int) -> Generator:
        return make_generator(self.spec, length, self.seed, self.renderer.count_bare, self.qa)

    def render(self, knob: int, fewshot: int, rng_seed: int, index: int = 0, generator: Generator | None = None):
        prompt = (generator or self.generator).build(knob, random.Random(rng_seed), fewshot, index)
        text = self.renderer.text(prompt)
        return prompt, text, self.renderer.encode(text)

    def measure(self, knob: int, fewshot: int | None = None, generator: Generator | None = None) -> int:
        """Prompt tokens of the search probe at ``knob`` (sample 0's question for qa)."""
        fs = self.fewshot if fewshot is None else fewshot
        return len(self.render(knob, fs, self.search_seed, 0, generator)[2])

    def _fit(self) -> tuple[int, int]:
        gen = self.generator
        if self.budget < 1:
            raise self._too_short()
        choices = [gen.max_fewshot, 0] if gen.max_fewshot else [0]
        for fewshot in choices:
            if gen.valid(gen.min_knob) and self.measure(gen.min_knob, fewshot) <= self.budget:
                break
        else:
            raise self._too_short()

        def fits(knob: int) -> bool:
            return self.measure(knob, fewshot) <= self.budget

        if isinstance(gen, FWEGenerator):
            # RULER's fwe search: from budget // 6 words, grow by budget // 32 while shorter, then step back once
            n, step = self.budget // gen.wordlen, gen.incremental
            while self.measure(n, fewshot) < self.budget:
                n += step
            knob = max(n - step, gen.min_knob)
        else:
            upper = gen.upper_estimate(lambda k: self.measure(k, fewshot))
            knob = largest_fitting(fits, gen.min_knob, upper, gen.max_knob)
        while knob > gen.min_knob and not gen.valid(knob):
            knob -= 1
        return knob, fewshot

    def minimum_length(self) -> int:
        """About the smallest length at which this task fits under this tokenizer (fewest shots, smallest haystack)."""
        length = max(self.length, 1)
        for _ in range(32):
            gen = self._generator(length)
            if isinstance(gen, FWEGenerator) and gen.vocab_size < 4:
                length = 4 * 50 + self.spec.tokens_to_generate  # fwe needs 4 coded words: (length − 50) // 50 ≥ 4
                continue
            # the search probe and a few samples' draws (key lengths vary), with 1% to spare
            seeds = [derive_seed("ruler", self.seed, self.spec.name, length, i) for i in ("search", *range(8))]
            tokens = max(len(self.render(gen.min_knob, 0, s, 0, gen)[2]) for s in seeds)
            need = math.ceil(tokens * 1.01) + self.spec.tokens_to_generate
            if need <= length:
                return length
            length = need
        return length

    def _too_short(self) -> RopekitError:
        need = self.minimum_length()
        return RopekitError(
            f"RULER task '{self.spec.name}' cannot fit in {self.length} tokens under this tokenizer: even its smallest "
            f"haystack, without few-shot examples, needs about {need} tokens including the "
            f"{self.spec.tokens_to_generate} it generates",
            f"evaluate '{self.spec.name}' at --lengths {need} or more, or leave it out of --tasks",
        )

    def sample(self, index: int) -> Sample:
        """Sample ``index``: built at the fitted knob, shrunk by :func:`shrink_step` until it fits."""
        gen = self.generator
        rng_seed = derive_seed("ruler", self.seed, self.spec.name, self.length, index)
        knob = self.knob
        while True:
            prompt, text, ids = self.render(knob, self.fewshot, rng_seed, index)
            fits = len(ids) <= self.budget
            if fits and gen.valid(knob):
                return Sample(self.spec.name, index, self.length, text, ids, prompt.answer_prefix, prompt.references,
                              knob, self.fewshot, prompt.haystack)
            if knob <= gen.min_knob:
                raise RopekitError(
                    f"RULER task '{self.spec.name}' sample {index} does not fit in {self.length} tokens even with its "
                    f"smallest haystack ({len(ids)} prompt tokens + {self.spec.tokens_to_generate} to generate)",
                    "raise --lengths, or leave the task out of --tasks",
                )
            knob = max(gen.min_knob, knob - (shrink_step(knob, gen.incremental) if not fits else 1))
