"""Many-shot in-context learning: classification accuracy vs number of demonstrations (LCEG §7.5, TREC-style).

LCEG ("A Controlled Study on Long Context Extension and Generalization in LLMs", §7.5, Fig. 6) evaluates TREC
question classification with 1 to 1000 in-context examples. This task measures the same curve on any labelled
set, at several context budgets.

Prompt (TREC layout of LongBench's trec prompt, one demonstration per block)::

    Please determine the type of the question below. Here are some examples of questions.\\n\\n
    Question: {text}\\nType: {label}\\n\\n        ← k demonstrations
    Question: {query}\\nType:

Prediction: *label-likelihood ranking*, not generation. Each label ``y`` is scored by
``log p(" " + y | prompt)``, the sum of its tokens' log-probabilities, with the continuation's tokens taken as
lm-evaluation-harness does (``encode(prompt + " " + y)[len(encode(prompt)):]``). The prediction is the
highest-scoring label (``score``: 1 if it is the gold label); ``prediction_norm`` / ``score_norm`` rank by
log-probability per character of the label, the joining space not counted (lm-eval's ``acc_norm``, which divides by
``len(choice)`` of the choice string, ``lm_eval/api/task.py``). Ranking is deterministic and
cannot fail on formatting, unlike parsing a generation. It is batched: continuations that share all their
tokens but the last read their log-probabilities from the same row, so single-token labels cost one forward of
the prompt. When the model's frequencies do not depend on the input length, a continuation also reads its
log-probabilities from a longer one's row when its tokens are a prefix of that row, and the remaining rows go
through the model together (right-filled to one width; causal attention keeps every real position exact, so no
padding mask is needed). When they do (Dynamic NTK, Dynamic YaRN, LongRoPE's switch, CLEX:
:meth:`ropekit.methods.base.Method.length_dependence`), a longer row or filler would change them, so each
continuation is scored on a row of exactly ``prompt + continuation[:-1]`` — the input lm-evaluation-harness builds
for a request, ``(context_enc + continuation_enc)[-(max_length + 1):][:-1]`` (``lm_eval/models/huggingface.py``,
``_loglikelihood_tokens``) — rows of one width together, each forward from the model's freshly installed RoPE
state (:func:`ropekit.install.installer.reset_length_state`), so a score never depends on what ran before it.

Demonstrations: drawn for each (shots, query) with ``random.Random(f"manyshot:{seed}:{shots}:{sample}")``,
the same for every length (a length only decides whether the prompt fits). ``sampling="balanced"``
(default) deals labels round-robin in a shuffled label order (so counts differ by at most one; below the number
of labels, a random subset of labels appears once), each label's items in a shuffled order, then shuffles the
demonstrations; ``sampling="random"`` draws k items uniformly without replacement. The query is never among
its own demonstrations.

Fit: a shot count is evaluated at a length only when every query's prompt plus its longest label continuation
fits; otherwise it is skipped at that length with a warning (so every reported accuracy covers the same queries).

Data (``data=``):

* ``None``: a built-in **synthetic** set (:func:`synthetic_items`): English questions generated from templates,
  labelled with the six TREC coarse classes; a stand-in for TREC, not TREC itself (records say so).
* a JSONL file of ``{"text": ..., "label": ...}`` lines (optional ``"id"``). With a ``"split"`` field
  (``"train"``/``"test"``) on every line, train lines are the demonstration pool and test lines the queries;
  without it, every line can be a query and its demonstrations come from all the other lines.
* a directory with ``train.jsonl`` and ``test.jsonl`` in that format.

Queries: the test items in a seeded shuffled order, the first ``samples`` (default 100).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.base_rope import length_dependence
from ..core.jsonl import jsonl_rows
from ..errors import RopekitError
from ..install import installed, rope_info, text_config
from ..install.installer import reset_length_state
from ..install.model_rope import base_info
from ..methods import get_method
from .common import EvalContext, accuracy_by, encode, mean, require_tokenizer, timer, token_lengths, whole_number

KEY_FIELDS = ("shots", "sample")

#: Shot counts tried when ``shots`` is not given (those that do not fit are skipped).
DEFAULT_SHOTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DEFAULT_SAMPLES = 100

HEADER = "Please determine the type of the question below. Here are some examples of questions.\n\n"
DEMO_TEMPLATE = "Question: {text}\nType: {label}\n\n"
QUERY_TEMPLATE = "Question: {text}\nType:"

SYNTHETIC_SOURCE = "synthetic: template-generated question-type classification (TREC coarse classes), not TREC"
SAMPLING = ("balanced", "random")


@dataclass(frozen=True)
class Example:
    """One labelled text; ``id`` is stable across runs (the file's ``id`` or the line's position)."""

    id: str
    text: str
    label: str


# ---- built-in synthetic set ---------------------------------------------------------------------------
_ABBRS = ("NASA", "UNESCO", "NATO", "FBI", "DNA", "HTML", "HTTP", "CPU", "GPU", "RAM", "USB", "LED", "GDP", "ATM",
          "UFO", "BBC", "CEO", "FAQ", "GPS", "MRI", "PDF", "RSVP", "SCUBA", "WHO", "WWF", "LASER", "RADAR", "OPEC")
_LONG_FORMS = ("the North Atlantic Treaty Organization", "the World Health Organization", "deoxyribonucleic acid",
               "the central processing unit", "random access memory", "the gross domestic product",
               "the global positioning system", "the British Broadcasting Corporation", "the chief executive officer",
               "magnetic resonance imaging", "the portable document format", "the universal serial bus")
_DEVICES = ("refrigerator", "compass", "microwave oven", "thermostat", "bicycle gear", "steam engine", "telescope",
            "vaccine", "battery", "jet engine", "solar panel", "lock and key", "barometer", "parachute", "hearing aid")
_WORDS = ("serendipity", "photosynthesis", "democracy", "inflation", "metaphor", "gravity", "erosion", "irony",
          "nostalgia", "entropy", "symbiosis", "osmosis", "camouflage", "hibernation", "evaporation")
_WHY = ("cats purr", "birds migrate", "leaves change color in autumn", "people yawn", "dogs bark at night",
        "wolves howl", "bears hibernate", "stars twinkle", "onions make people cry", "bread rise",
        "ships float", "volcanoes erupt", "tides rise and fall", "bees make honey", "metals rust")
_TASKS = ("bake bread", "tie a bowline knot", "change a flat tire", "brew green tea", "plant a tree",
          "learn to juggle", "build a birdhouse", "knit a scarf", "train a puppy", "make cheese",
          "paint a fence", "boil an egg", "sharpen a knife", "fold a paper crane", "fix a leaky faucet")
_OBJECTS = ("a ripe banana", "the planet Mars", "a school bus", "an emerald", "a flamingo", "a polar bear",
            "a fire truck", "a lemon", "the Statue of Liberty", "a ruby", "a canary", "a pumpkin", "a raven",
            "a sapphire", "an eggplant")
_COUNTRIES = ("Japan", "Brazil", "Kenya", "Norway", "Peru", "Egypt", "India", "Canada", "Mexico", "Australia",
              "Portugal", "Thailand", "Argentina", "Ireland", "Vietnam", "Morocco", "Sweden", "Chile", "Greece",
              "Nigeria")
_MUSICIANS = ("Louis Armstrong", "Jimi Hendrix", "Yo-Yo Ma", "Miles Davis", "Ravi Shankar", "Eric Clapton",
              "Charlie Parker", "Itzhak Perlman", "Ray Charles", "Benny Goodman")
_DISHES = ("guacamole", "hummus", "paella", "pesto", "risotto", "tabbouleh", "fondue", "gazpacho", "falafel",
           "ratatouille", "kimchi", "sauerkraut")
_INVENTIONS = ("the telephone", "the light bulb", "the printing press", "the steam engine", "the airplane",
               "the radio", "the telescope", "the microscope", "the television", "the bicycle", "the compass",
               "the typewriter", "the sewing machine", "the refrigerator", "the camera", "the telegraph")
_BOOKS = ("Pride and Prejudice", "Moby-Dick", "War and Peace", "Don Quixote", "The Odyssey", "Hamlet", "Ulysses",
          "Jane Eyre", "Great Expectations", "The Divine Comedy", "Frankenstein", "Dracula", "Middlemarch",
          "Les Miserables", "The Iliad")
_PAINTINGS = ("the Mona Lisa", "The Starry Night", "The Scream", "Guernica", "The Night Watch", "Water Lilies",
              "The Persistence of Memory", "The Last Supper", "Girl with a Pearl Earring", "The Birth of Venus",
              "American Gothic", "The Kiss")
_FEATS = ("climb Mount Everest", "walk on the Moon", "fly solo across the Atlantic", "reach the South Pole",
          "swim the English Channel", "sail around the world", "orbit the Earth", "split the atom",
          "run a mile in under four minutes", "win two Nobel Prizes")
_DISCOVERIES = ("penicillin", "radium", "the electron", "oxygen", "insulin", "the neutron", "X-rays", "helium",
                "the planet Neptune", "DNA's double helix", "the law of gravity", "vitamin C")
_LANDMARKS = ("the Eiffel Tower", "the Taj Mahal", "Machu Picchu", "the Colosseum", "the Great Wall",
              "Stonehenge", "the Parthenon", "Angkor Wat", "the Golden Gate Bridge", "Petra", "Big Ben",
              "the Sydney Opera House", "Mount Kilimanjaro", "Niagara Falls", "the Kremlin")
_CITIES = ("Kyoto", "Marrakesh", "Cusco", "Bergen", "Mumbai", "Quebec City", "Lisbon", "Chiang Mai", "Cordoba",
           "Galway", "Hanoi", "Valparaiso", "Thessaloniki", "Lagos", "Gothenburg")
_ANIMALS = ("penguins", "kangaroos", "koalas", "camels", "pandas", "lemurs", "orangutans", "polar bears",
            "flamingos", "llamas", "sloths", "walruses")
_PEOPLE = ("Mozart", "Gandhi", "Frida Kahlo", "Albert Einstein", "Marie Curie", "Pablo Picasso", "Nelson Mandela",
           "Leonardo da Vinci", "Charles Darwin", "Ada Lovelace", "Napoleon", "Confucius")
_COUNTS = (("legs", "a spider"), ("keys", "a piano"), ("players", "a soccer team"), ("cards", "a deck"),
           ("bones", "the human body"), ("days", "a leap year"), ("strings", "a violin"), ("squares", "a chessboard"),
           ("teeth", "an adult mouth"), ("hearts", "an octopus"), ("moons", "orbit Jupiter"), ("sides", "a hexagon"),
           ("states", "the United States"), ("minutes", "a day"), ("stripes", "the American flag"))
_EVENTS = ("the Berlin Wall fall", "the Titanic sink", "World War I end", "the French Revolution begin",
           "humans first land on the Moon", "the Roman Empire fall", "the printing press appear",
           "the Great Fire of London happen", "the first Olympic Games take place", "the Black Death reach Europe",
           "the American Civil War end", "the first satellite launch")
_PAIRS = (("Paris", "London"), ("Tokyo", "Osaka"), ("New York", "Boston"), ("Rome", "Milan"), ("Cairo", "Luxor"),
          ("Sydney", "Melbourne"), ("Berlin", "Munich"), ("Madrid", "Seville"), ("Lima", "Cusco"),
          ("Toronto", "Montreal"), ("the Earth", "the Moon"), ("the Sun", "Mars"))

#: TREC coarse classes → question templates (each ``{}`` slot filled from the list beside it).
_TEMPLATES: dict[str, list[tuple[str, Sequence]]] = {
    "Abbreviation": [("What does {} stand for?", _ABBRS), ("What is the full form of {}?", _ABBRS),
                     ("What is {} short for?", _ABBRS), ("What is the abbreviation for {}?", _LONG_FORMS)],
    "Description": [("How does a {} work?", _DEVICES), ("What is the definition of {}?", _WORDS),
                    ("What does the word {} mean?", _WORDS), ("Why do {}?", _WHY), ("How do you {}?", _TASKS)],
    "Entity": [("What color is {}?", _OBJECTS), ("What language is spoken in {}?", _COUNTRIES),
               ("What currency is used in {}?", _COUNTRIES), ("What instrument did {} play?", _MUSICIANS),
               ("What is the main ingredient of {}?", _DISHES), ("What is the national animal of {}?", _COUNTRIES)],
    "Human": [("Who invented {}?", _INVENTIONS), ("Who wrote {}?", _BOOKS), ("Who painted {}?", _PAINTINGS),
              ("Who was the first person to {}?", _FEATS), ("Who discovered {}?", _DISCOVERIES)],
    "Location": [("Where is {} located?", _LANDMARKS), ("What is the capital of {}?", _COUNTRIES),
                 ("In which country is {}?", _CITIES), ("Where do {} live in the wild?", _ANIMALS),
                 ("Which continent is {} in?", _COUNTRIES), ("Where was {} born?", _PEOPLE)],
    "Numeric": [("How many {} are there in {}?", _COUNTS), ("When did {}?", _EVENTS), ("How tall is {}?", _LANDMARKS),
                ("In what year was {} invented?", _INVENTIONS), ("How far is {} from {}?", _PAIRS),
                ("How long does it take to {}?", _TASKS), ("How much does {} weigh?", _OBJECTS)],
}

_SYNTHETIC_TEST_PER_LABEL = 20


def synthetic_items() -> tuple[list[Example], list[Example]]:
    """The built-in **synthetic** question-type set: ``(train, test)``, deterministic (fixed seed 0).

    Every (template, filler) question of each class is generated; each class's questions are shuffled and
    its first 20 go to the test split, the rest to the training pool (≈ 70–100 per class). The class is
    decided by the question's frame ("Who …" → Human, "How many …" → Numeric), while fillers are shared
    across classes, so a model must learn the frame → label mapping from the demonstrations.
    """
    rng = random.Random(0)
    train: list[Example] = []
    test: list[Example] = []
    for label, templates in _TEMPLATES.items():
        questions = []
        for template, fillers in templates:
            for filler in fillers:
                args = filler if isinstance(filler, tuple) else (filler,)
                questions.append(template.format(*args))
        questions = list(dict.fromkeys(questions))
        rng.shuffle(questions)
        for i, q in enumerate(questions):
            (test if i < _SYNTHETIC_TEST_PER_LABEL else train).append(Example(f"{label[:4].lower()}-{i}", q, label))
    return train, test


# ---- user data ----------------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for number, row in jsonl_rows(path, "fix or remove that line"):
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not isinstance(row.get("label"), str) \
                or not row["text"].strip() or not row["label"].strip():
            raise RopekitError(
                f"'{path}' line {number} lacks a non-empty string 'text' and 'label'",
                'write one {"text": "...", "label": "..."} object per line',
            )
        rows.append((number, row))
    if not rows:
        raise RopekitError(f"'{path}' holds no examples", 'write one {"text": "...", "label": "..."} object per line')
    return rows


def _examples(rows: list[tuple[int, dict[str, Any]]], prefix: str) -> list[Example]:
    out = [Example(str(r["id"]) if "id" in r else f"{prefix}{i}", r["text"].strip(), r["label"].strip())
           for i, (_, r) in enumerate(rows)]
    seen: set[str] = set()
    for e in out:
        if e.id in seen:
            raise RopekitError(f"example id '{e.id}' appears twice", "give every line a distinct 'id' (or none)")
        seen.add(e.id)
    return out


def load_data(data: str | Path | None) -> tuple[list[Example], list[Example], bool, str]:
    """``(pool, queries, leave_one_out, source)`` from ``data`` (see the module doc for the formats)."""
    if data is None:
        train, test = synthetic_items()
        return train, test, False, SYNTHETIC_SOURCE
    path = Path(data).expanduser()
    if path.is_dir():
        train_path, test_path = path / "train.jsonl", path / "test.jsonl"
        if not (train_path.is_file() and test_path.is_file()):
            raise RopekitError(
                f"'{path}' lacks train.jsonl and/or test.jsonl",
                "put the demonstrations in train.jsonl and the queries in test.jsonl, or pass one JSONL file",
            )
        return (_examples(_read_jsonl(train_path), "train-"), _examples(_read_jsonl(test_path), "test-"), False,
                str(path))
    if not path.is_file():
        raise RopekitError(f"many-shot data '{path}' does not exist", "pass --data FILE.jsonl or a folder with train.jsonl and test.jsonl")
    rows = _read_jsonl(path)
    with_split = [r for _, r in rows if "split" in r]
    if not with_split:
        items = _examples(rows, "")
        return items, items, True, str(path)
    if len(with_split) != len(rows) or any(r["split"] not in ("train", "test") for r in with_split):
        raise RopekitError(f"'{path}' mixes lines with and without a train/test 'split'",
                           'give every line "split": "train" or "test", or drop the field everywhere')
    train = _examples([(n, r) for n, r in rows if r["split"] == "train"], "train-")
    test = _examples([(n, r) for n, r in rows if r["split"] == "test"], "test-")
    if not train or not test:
        raise RopekitError(f"'{path}' has no {'train' if not train else 'test'} lines", "mark some lines with that split")
    return train, test, False, str(path)


# ---- prompts ------------------------------------------------------------------------------------------
def build_prompt(demos: Sequence[Example], query: str) -> str:
    """The header, ``k`` demonstrations and the unanswered query (module doc)."""
    return HEADER + "".join(DEMO_TEMPLATE.format(text=d.text, label=d.label) for d in demos) + QUERY_TEMPLATE.format(text=query)


def draw_demos(pool: Sequence[Example], query: Example, shots: int, seed: int, *, sampling: str = "balanced",
               leave_one_out: bool = False) -> list[Example]:
    """``shots`` demonstrations for ``query``, from a RNG seeded by (seed, shots, query id); see module doc."""
    candidates = [e for e in pool if e.id != query.id] if leave_one_out else list(pool)
    if shots > len(candidates):
        raise ValueError(f"{shots} demonstrations requested from a pool of {len(candidates)}")
    rng = random.Random(f"manyshot:{seed}:{shots}:{query.id}")
    if sampling == "random":
        return rng.sample(candidates, shots)
    by_label: dict[str, list[Example]] = {}
    for e in candidates:
        by_label.setdefault(e.label, []).append(e)
    labels = sorted(by_label)
    rng.shuffle(labels)
    for label in labels:
        rng.shuffle(by_label[label])
    queues = [iter(by_label[label]) for label in labels]
    chosen: list[Example] = []
    while len(chosen) < shots:
        progressed = False
        for queue in queues:
            if len(chosen) == shots:
                break
            item = next(queue, None)
            if item is not None:
                chosen.append(item)
                progressed = True
        if not progressed:  # pragma: no cover - guarded by the pool-size check above
            break
    rng.shuffle(chosen)
    return chosen


def continuation_ids(tokenizer, prompt: str, label: str, prompt_ids: list[int] | None = None) -> list[int]:
    """The tokens of ``" " + label`` after ``prompt``: ``encode(prompt + " " + label)[len(encode(prompt)):]``.

    Encoding the whole and cutting at the prompt's length is lm-evaluation-harness's pairing: it gives the
    label the tokens it gets in context even for tokenizers whose word pieces depend on what precedes them.
    """
    ctx = prompt_ids if prompt_ids is not None else encode(tokenizer, prompt, add_special_tokens=True)
    whole = encode(tokenizer, prompt + " " + label, add_special_tokens=True)
    cont = whole[len(ctx):]
    if not cont:
        raise RopekitError(f"label {label!r} encodes to no tokens after the prompt", "use non-empty, printable labels")
    return cont


# ---- scoring ------------------------------------------------------------------------------------------
def _forward_rows(model, prompt_ids: list[int], extensions: Sequence[tuple[int, ...]], longest: int,
                  pad_id: int) -> torch.Tensor:
    """Log-softmax over the vocabulary at positions ``len(prompt)−1 … len(prompt)−1+longest`` of each row
    ``prompt + extension``: [rows, longest+1, vocab].

    Rows are right-filled with ``pad_id`` up to ``len(prompt)+longest`` under an all-ones attention mask:
    under causal attention no real position sees the filler, so its log-probabilities are exact, and no
    attention method has to honour a padding mask (the explicit mask keeps transformers from reading the
    batch as packed sequences).
    """
    width = len(prompt_ids) + longest
    keep = longest + 1
    device = next(model.parameters()).device
    ids = torch.full((len(extensions), width), pad_id, dtype=torch.long)
    ids[:, : len(prompt_ids)] = torch.tensor(prompt_ids, dtype=torch.long)
    for i, ext in enumerate(extensions):
        if ext:
            ids[i, len(prompt_ids) : len(prompt_ids) + len(ext)] = torch.tensor(ext, dtype=torch.long)
    ids = ids.to(device)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        try:
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits
        except TypeError:  # a forward without logits_to_keep: slice afterwards
            logits = model(input_ids=ids, attention_mask=mask).logits
    return torch.log_softmax(logits[:, -keep:, :].float(), dim=-1).cpu()


def length_dependent(model) -> bool:
    """Whether ``model``'s rotary frequencies depend on the length of its input: the installed method's
    :meth:`~ropekit.methods.base.Method.length_dependence` (on every layer type it extends), or the model's own
    (a Dynamic-NTK or LongRoPE checkpoint) when nothing is installed."""
    record = installed(model)
    if not record:
        return length_dependence(rope_info(model))[0] != "static"
    method = get_method(record["method"])
    config = text_config(model)
    per_type = record.get("layer_params") or {None: record["params"]}
    return any(method.length_dependence(base_info(config, layer_type), params)[0] != "static"
               for layer_type, params in per_type.items())


def label_logprobs(model, prompt_ids: list[int], continuations: Sequence[Sequence[int]], *, pad_id: int = 0,
                   max_batch_tokens: int = 32768, own_length: bool | None = None) -> list[float]:
    """``log p(continuation | prompt)`` (sum over its tokens) for each continuation, batched.

    Token ``j`` of a continuation is predicted at position ``len(prompt) − 1 + j``, so a continuation needs a
    row holding the prompt and all its tokens but the last. ``own_length`` (default: :func:`length_dependent`)
    False: rows are the distinct such prefixes that are not themselves a prefix of another (under causal attention
    a longer row gives the shorter one's logits too); they are right-filled to one width (:func:`_forward_rows`)
    and run ``max_batch_tokens`` tokens at a time. True: every distinct prefix is a row of exactly its own length,
    rows of one width run together, each forward from the freshly installed RoPE state (module doc).
    """
    if not continuations or any(len(c) == 0 for c in continuations):
        raise ValueError("every continuation needs at least one token")
    if own_length is None:
        own_length = length_dependent(model)
    heads = sorted({tuple(c[:-1]) for c in continuations}, key=lambda h: (-len(h), h))
    kept: list[tuple[int, ...]] = []
    for h in heads:
        if own_length or not any(k[: len(h)] == h for k in kept):
            kept.append(h)
    row_of = [kept.index(tuple(c[:-1])) if own_length else
              next(i for i, k in enumerate(kept) if k[: len(c) - 1] == tuple(c[:-1])) for c in continuations]
    # rows of one width, longest first: all of them (right-filled to the longest) when filler changes nothing
    groups: list[list[int]] = []
    for i, k in enumerate(kept):
        if groups and (not own_length or len(kept[groups[-1][0]]) == len(k)):
            groups[-1].append(i)
        else:
            groups.append([i])
    row_logp: list[torch.Tensor] = [torch.empty(0)] * len(kept)
    for group in groups:
        longest = max(len(kept[i]) for i in group)
        per_batch = max(1, max_batch_tokens // max(1, len(prompt_ids) + longest))
        for start in range(0, len(group), per_batch):
            batch = group[start : start + per_batch]
            if own_length:
                reset_length_state(model)
            tail = _forward_rows(model, prompt_ids, [kept[i] for i in batch], longest, pad_id)
            for i, logp in zip(batch, tail):
                row_logp[i] = logp
    out = []
    for c, r in zip(continuations, row_of):
        idx = torch.arange(len(c))
        out.append(float(row_logp[r][idx, torch.tensor(list(c))].sum()))
    return out


def rank_labels(logprobs: dict[str, float]) -> tuple[str, str]:
    """``(by sum, by sum per character of the label)``: the labels with the highest log-probability; ties go to the
    first label. The label's characters without the joining space, as lm-eval's ``acc_norm`` divides by ``len(choice)``."""
    labels = list(logprobs)
    best = max(labels, key=lambda y: (logprobs[y], -labels.index(y)))
    best_norm = max(labels, key=lambda y: (logprobs[y] / max(len(y), 1), -labels.index(y)))
    return best, best_norm


# ---- task ---------------------------------------------------------------------------------------------
def _plan(tokenizer, pool, queries, labels, shots, lengths, seed, sampling, leave_one_out):
    """For each shot count, the longest prompt + continuation over the queries (None: fits no length)."""
    longest_length = max(lengths)
    needed: dict[int, int | None] = {}
    for k in shots:
        worst = 0
        for q in queries:
            demos = draw_demos(pool, q, k, seed, sampling=sampling, leave_one_out=leave_one_out)
            prompt = build_prompt(demos, q.text)
            ids = encode(tokenizer, prompt, add_special_tokens=True)
            if len(ids) >= longest_length:  # no room left for any label at any length
                worst = None
                break
            cont = max(len(continuation_ids(tokenizer, prompt, y, ids)) for y in labels)
            worst = max(worst, len(ids) + cont)
        needed[k] = worst
    return needed


def check_options(*, lengths: list[int] | None = None, shots: list[int] | None = None, samples: int | None = None,
                  data: str | None = None, sampling: str = "balanced") -> None:
    """Refuse what is wrong whatever the model (:mod:`ropekit.eval.common`); the data is read by ``run`` (a study
    whose many-shot pieces are done continues without it)."""
    if sampling not in SAMPLING:
        raise RopekitError(f"sampling '{sampling}' is unknown", f"choose one of: {', '.join(SAMPLING)}")
    if samples is not None:
        whole_number(samples, "--samples")
    if shots is not None:
        if not shots:
            raise RopekitError("--shots is empty", "pass counts ≥ 0, e.g. --shots 0,1,2,4,8, or leave it out")
        for k in shots:
            whole_number(k, "--shots", minimum=0, example="K")
    if lengths is not None:
        token_lengths(lengths)


def run(
    ctx: EvalContext,
    *,
    lengths: list[int] | None = None,
    shots: list[int] | None = None,
    samples: int | None = None,
    data: str | None = None,
    sampling: str = "balanced",
) -> None:
    """Score every query with every shot count that fits each length (one record per query).

    ``lengths``: prompt caps in tokens (default: the model's window). ``shots``: demonstration counts
    (default 1, 2, 4, … 1024; 0 is the zero-shot baseline: header and query only). ``samples``: queries (default 100). ``data``: labelled JSONL, a folder with
    train/test files, or None for the built-in synthetic set. ``sampling``: "balanced" or "random".
    A query's prompt at a shot count is the same at every length it fits in, so it is scored once and
    written for each of those lengths: the lengths decide which shot counts are reachable, not the score.
    """
    tokenizer = require_tokenizer(ctx.tokenizer, "manyshot")
    check_options(lengths=lengths, shots=shots, samples=samples, data=data, sampling=sampling)
    counts = sorted(set(shots)) if shots is not None else list(DEFAULT_SHOTS)
    budgets = token_lengths(lengths) if lengths else [rope_info(ctx.model).window]
    pool, test, leave_one_out, source = load_data(data)
    labels = sorted({e.label for e in pool} | {e.label for e in test})
    if len(labels) < 2:
        raise RopekitError(f"the data has a single label ({labels[0]!r})", "give examples of at least two labels")
    order = list(test)
    random.Random(f"manyshot:{ctx.seed}:queries").shuffle(order)
    queries = order[: samples or DEFAULT_SAMPLES]
    available = len(pool) - (1 if leave_one_out else 0)
    too_many = [k for k in counts if k > available]
    counts = [k for k in counts if k <= available]
    if not counts:
        raise RopekitError(f"every shot count asked for exceeds the {available} demonstrations available",
                           f"pass --shots of at most {available}, or more data")
    needed = _plan(tokenizer, pool, queries, labels, counts, budgets, ctx.seed, sampling, leave_one_out)
    plan = [(b, k) for b in budgets for k in counts if needed[k] is not None and needed[k] <= b]
    if not plan:  # an empty run that exits 0 would read as a measurement
        least = counts[0]
        need = f"needs {needed[least]} tokens" if needed[least] is not None else "does not fit"
        raise RopekitError(f"no shot count fits in {max(budgets)} tokens ({least} shots {need})",
                           "pass longer --lengths, or fewer --shots")
    if too_many:  # said once the run is known to go ahead: a refusal above stays one line
        warnings.warn(f"ropekit manyshot: {', '.join(map(str, too_many))} shots exceed the {available} demonstrations "
                      "available; skipped", stacklevel=2)
    skipped = {b: [k for k in counts if (b, k) not in plan] for b in budgets}
    if any(skipped.values()):
        notes = "; ".join(f"{', '.join(map(str, ks))} shots do not fit in {b} tokens" for b, ks in skipped.items() if ks)
        warnings.warn(f"ropekit manyshot: {notes}; skipped", stacklevel=2)
    ctx.set_total(len(plan) * len(queries))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    own_length = length_dependent(ctx.model)  # each label on a row of its own length, from a fresh RoPE state
    for k in counts:
        lengths_k = [b for b in budgets if (b, k) in plan]
        if not lengths_k:
            continue
        for q in queries:
            keys = [ctx.key(b, shots=k, sample=q.id) for b in lengths_k]
            todo = [key for key in keys if not ctx.done(key)]
            if not todo:
                continue
            with timer() as elapsed:
                demos = draw_demos(pool, q, k, ctx.seed, sampling=sampling, leave_one_out=leave_one_out)
                prompt = build_prompt(demos, q.text)
                ids = encode(tokenizer, prompt, add_special_tokens=True)
                conts = [continuation_ids(tokenizer, prompt, y, ids) for y in labels]
                scores = dict(zip(labels, label_logprobs(ctx.model, ids, conts, pad_id=pad_id, own_length=own_length)))
                best, best_norm = rank_labels(scores)
                seconds = elapsed()
            # the prompt is the same at every length where it fits, so one scoring serves them all
            for key in todo:
                ctx.write(
                    key, label=q.label, prediction=best, score=float(best == q.label), prediction_norm=best_norm,
                    score_norm=float(best_norm == q.label), logprobs=scores, prompt_tokens=len(ids),
                    demo_ids=[d.id for d in demos], sampling=sampling, data_source=source, seconds=seconds,
                )


def summarize(records: list[dict]) -> list[dict]:
    """Rows per (length, shots): ``accuracy`` (sum log-probability ranking), ``accuracy_norm`` (per character), ``n``."""
    rows = accuracy_by(records, "length", "shots")
    for row in rows:
        same = [r for r in records if r["length"] == row["length"] and r["shots"] == row["shots"]]
        row["accuracy_norm"] = mean(float(r["score_norm"]) for r in same)
    return [{"length": r["length"], "shots": r["shots"], "accuracy": r["accuracy"],
             "accuracy_norm": r["accuracy_norm"], "n": r["n"]} for r in rows]
