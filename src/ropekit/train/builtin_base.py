"""The study's built-in base model: a small Llama pre-trained here, from scratch, with its own tokenizer.

The controlled study (LCEG's protocol, Lu et al. 2024, arXiv 2409.12181, at laptop scale) needs one base model that every method
starts from, and it must exist offline on a 2-core CPU. :func:`pretrain_base` builds it:

1. a byte-level BPE tokenizer (``tokenizers``; digits split one per token, as Llama's) trained on the
   training text below;
2. a 4-layer Llama (GQA 4/2 heads, head size 32, RoPE base 10,000) trained at a 256-token window, first on
   a synthetic copy curriculum that grows the induction heads retrieval needs (:class:`Curriculum`), then
   on the *training* split of the Python standard-library sources (:mod:`ropekit.data.local_text`; their
   docstrings are its English) with synthetic retrieval documents — the passkey prompt of
   :mod:`ropekit.data.passkey_text` (Landmark/YaRN/PoSE's) and RULER's single-needle prompts
   (niah_single_1/2, :func:`ruler_documents`), each with its answer — so that the base model retrieves
   *within* its window and retrieval beyond it measures the method. The held-out split and the
   language-reference prose, which make up the built-in evaluation corpus (:mod:`ropekit.data.corpora`) and
   RULER's essay haystack, are never trained on;
3. the result is shipped in the package (``ropekit/train/base_model/``: safetensors, config, tokenizer and
   the training record ``ropekit_base.json``), so a study starts from it without pre-training; it is used
   whenever its recorded settings equal :data:`SETTINGS` (and the seed). Otherwise — other settings, another
   seed, or ``use_cache=False`` (``ropekit pretrain-base --force``) — the model is trained here and cached
   under ``$ROPEKIT_CACHE`` (default ``~/.cache/ropekit``) as ``base-llama-<hash>``, the hash covering every
   setting and a fingerprint of the corpus: a normal ``save_pretrained`` directory with its tokenizer,
   loadable by ``ropekit.load_model(path)`` or any transformers code.

The shipped model: 2,400 steps of 16 × 256 tokens (the copy curriculum's 800, then 1,600 of text over the whole
training split, with RULER's single-needle prompts beside the passkey documents), about 1.1M parameters, 4.5 MB
of float32 safetensors. At its 256-token window: held-out perplexity 58.0 (``ropekit eval ppl --samples 8
--score-mode truncate``), passkey 56 of 60 (``--depths 0.1,0.3,0.5,0.7,0.9 --trials 12``) and RULER
niah_single_1/2 59 of 60 (``--samples 30 --tokens-to-generate 12``); README, "The base model".

Deterministic for a seed on a given machine (fixed threads, deterministic kernels).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from ..data.local_text import corpus_digest, stdlib_documents
from ..data.passkey_text import KEY_RANGE, build_prompt
from ..data.ruler.tasks import TASKS, make_generator
from ..models.loading import load_model
from ..models.tiny import build_tiny_model
from ..runtime import (
    cache_root,
    check_target,
    default_threads,
    deterministic,
    save_model_atomically,
    settings_key,
)
from ..runtime import progress as progress_bar
from ..runtime.atomic import atomic_dir
from .pretrain import pretrain

#: Bump when training changes in a way SETTINGS does not capture (invalidates cached models).
CACHE_FORMAT = 5
#: File in the model directory recording how it was trained.
META_FILE = "ropekit_base.json"
#: The end-of-text token (also padding); the tokenizer's only special token.
EOS = "<|endoftext|>"

#: Everything that defines the base model; with the corpus fingerprint its hash names the cache entry.
SETTINGS: dict[str, Any] = {
    "format": CACHE_FORMAT,
    "vocab_size": 2048,
    "model": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "rope_theta": 10000.0},
    "window": 256,
    "steps": 2400,
    "batch_size": 16,
    "lr": 3e-3,
    # linear warm-up over this many steps, then cosine decay to 10 % of lr (absolute, as the copy phases below:
    # the induction circuit's timing depends on them)
    "warmup": 45,
    # rows of each phase-3 batch packed with retrieval documents (the rest is natural text): a passkey document
    # with probability passkey_share, else a RULER-format document of a task of ruler_tasks (by its weight)
    "retrieval_rows": 6,
    "passkey_share": 0.34,
    "ruler_tasks": {"niah_single_1": 1, "niah_single_2": 1},
    "train_bytes": 6_000_000,  # the whole training split (about 5.6 MB)
    # the copy curriculum (see Curriculum): the steps at which its first two phases end, rows of phase-3
    # batches that repeat random spans, the synthetic alphabet's size and the spans' length range
    "curriculum": {"trigram_until": 99, "copy_until": 800, "copy_rows": 2, "alphabet": 32, "span": [8, 32]},
}

#: The shipped base model (package data): the result of :func:`pretrain_base` with SETTINGS and seed 0.
SHIPPED_DIR = Path(__file__).with_name("base_model")


def passkey_document(rng: random.Random, max_sentences: int) -> str:
    """One passkey prompt of :mod:`ropekit.eval.passkey` with the answer after it, at a random size and depth."""
    key = rng.randint(*KEY_RANGE)
    n_garbage = rng.randint(0, max_sentences)
    return build_prompt(n_garbage, rng.randint(0, n_garbage), key) + f" {key}."


def ruler_answer(family: str, references: list[str]) -> str:
    """What follows a RULER prompt's answer prefix in a training document: `` 1234567.`` after a niah prefix
    (values joined by ", "), the names after vt's ``they are: ``."""
    return " " + ", ".join(references) + "." if family == "niah" else " ".join(references)


def ruler_documents(task: str, tokenizer, window: int, count: int, rng: random.Random, essay_words: list[str]) -> list[list[int]]:
    """``count`` RULER-format documents of ``task`` (prompt in RULER's base template, then the answer) that fit
    the window, as token ids.

    They come from the evaluation's own generators (:mod:`ropekit.data.ruler.tasks`) — RULER's templates,
    needles and noise verbatim — with the training split in place of the essay haystack (a random stretch of
    ``essay_words``), and keys and values drawn from ``rng``, so the model learns the question format, not
    the evaluation's samples. Haystack sizes are uniform from empty up to the largest that fits.
    """
    spec = TASKS[task]

    def essay(n_words: int, draw: random.Random) -> str:
        start = draw.randrange(max(1, len(essay_words) - n_words))
        return " ".join(essay_words[start:start + n_words])

    generator = make_generator(spec, window, 0, lambda text: len(tokenizer(text).input_ids), essay=essay)

    def document(knob: int) -> list[int]:
        prompt = generator.build(knob, rng, 0, 0)
        return tokenizer(prompt.base_text() + ruler_answer(spec.family, prompt.references)).input_ids

    smallest = len(document(generator.min_knob))
    if smallest > window:
        raise ValueError(f"RULER task {task} needs {smallest} tokens with an empty haystack; the window is {window}")
    top = generator.min_knob  # the largest haystack that fit a probe, found by doubling
    while len(document(2 * top + 1)) <= window:
        top = 2 * top + 1
    out: list[list[int]] = []
    while len(out) < count:
        ids = document(rng.randint(generator.min_knob, 2 * top + 1))
        if len(ids) <= window:
            out.append(ids)
    return out


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE trained on ``texts`` (digits one per token), as a ``PreTrainedTokenizerFast`` with EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    # no model_max_length: evaluations go far past the training window on purpose
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   clean_up_tokenization_spaces=False, model_max_length=10**9)


class Curriculum:
    """The pre-training batches, in three phases, that make the base model copy (and so retrieve passkeys).

    Retrieving a passkey means copying it: an *induction head* (Olsson et al. 2022) — a previous-token head
    whose output a later head matches against the current token — attends from the answer's "␣" to the
    token after the earlier "␣", then from each digit to the digit after its earlier occurrence. Natural
    text and packed passkey documents alone did not grow that circuit within the budget (measured:
    0 % in-window passkeys after 700 steps), so the first 800 steps of pre-training teach its two halves in
    turn, on a small *alphabet* (the ten digits, the space token that precedes a number, then the most
    frequent tokens of the text):

    1. ``trigram`` rows (steps before ``trigram_until``): the next token is a fixed random
       function of the two before it (80 %, else random), so moving the previous token into the current
       position — the previous-token head — lowers the loss at once;
    2. ``copy`` rows (steps before ``copy_until``): random spans of distinct alphabet tokens, each repeated 2–4
       times, which only an induction head predicts (the loss leaves ln |alphabet| between steps 300 and 500, by
       the seed: the phase runs well past that, since a circuit not formed by its end did not form later);
    3. the language model's data: windows of the natural-text stream, with ``retrieval_rows`` rows of packed
       retrieval documents — passkey prompts and RULER-format prompts (:func:`ruler_documents`) with their
       answers — and ``copy_rows`` copy rows that keep the circuit in use.

    Phases 1–2 use rows of half the window (twice as many, the same tokens per batch).
    ``scripts/induction_probe.py`` measures other curricula on the same data.
    """

    def __init__(self, tokenizer, natural: torch.Tensor, passkey_docs: list[list[int]], settings: dict[str, Any],
                 seed: int, ruler_docs: dict[str, list[list[int]]] | None = None):
        plan = settings["curriculum"]
        self.natural, self.passkey_docs, self.eos = natural, passkey_docs, tokenizer.eos_token_id
        tasks = sorted(ruler_docs or {})
        self.ruler_docs = [ruler_docs[t] for t in tasks]
        self.ruler_weights = torch.tensor([float(settings["ruler_tasks"][t]) for t in tasks])
        self.passkey_share = float(settings["passkey_share"]) if self.ruler_docs else 1.0
        self.window, self.batch_size, self.steps = settings["window"], settings["batch_size"], settings["steps"]
        self.retrieval_rows, self.copy_rows = settings["retrieval_rows"], plan["copy_rows"]
        self.trigram_until, self.copy_until = int(plan["trigram_until"]), int(plan["copy_until"])
        self.span = tuple(plan["span"])
        specials = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789\u0120"]  # "Ġ": the byte-level space
        frequent = torch.bincount(natural, minlength=len(tokenizer)).argsort(descending=True).tolist()
        others = [t for t in frequent if t not in specials and t != self.eos]  # EOS separates copy groups
        self.alphabet = torch.tensor((specials + others)[:plan["alphabet"]])
        size = len(self.alphabet)
        self.table = torch.randint(0, size, (size, size), generator=torch.Generator().manual_seed(seed + 7))

    def phase(self, step: int) -> str:
        return "trigram" if step < self.trigram_until else "copy" if step < self.copy_until else "text"

    def batch(self, step: int, gen: torch.Generator) -> torch.Tensor:
        """The ``batch_size × window`` token ids of pre-training step ``step`` (0-based)."""
        short, rows = self.window // 2, self.batch_size * 2
        if self.phase(step) == "trigram":
            return torch.stack([self.trigram_row(gen, short) for _ in range(rows)])
        if self.phase(step) == "copy":
            return torch.stack([self.copy_row(gen, short) for _ in range(rows)])
        starts = torch.randint(0, len(self.natural) - self.window, (self.batch_size,), generator=gen)
        ids = self.natural[starts[:, None] + torch.arange(self.window)]
        synthetic = [self.retrieval_row(gen) for _ in range(self.retrieval_rows)]
        synthetic += [self.copy_row(gen, self.window) for _ in range(self.copy_rows)]
        for row, values in enumerate(synthetic):
            ids[row] = values
        return ids

    def trigram_row(self, gen: torch.Generator, length: int) -> torch.Tensor:
        size = len(self.alphabet)
        x = torch.randint(0, size, (2,), generator=gen).tolist()
        noise, noise_tokens = torch.rand(length, generator=gen), torch.randint(0, size, (length,), generator=gen)
        while len(x) < length:
            x.append(int(noise_tokens[len(x)]) if noise[len(x)] < 0.2 else int(self.table[x[-2], x[-1]]))
        return self.alphabet[torch.tensor(x)]

    def copy_row(self, gen: torch.Generator, length: int) -> torch.Tensor:
        out: list[int] = []
        low, high = self.span[0], min(self.span[1], len(self.alphabet))
        while len(out) < length:
            size = int(torch.randint(low, high + 1, (1,), generator=gen))
            span = self.alphabet[torch.randperm(len(self.alphabet), generator=gen)[:size]].tolist()
            out += span * int(torch.randint(2, 5, (1,), generator=gen)) + [self.eos]
        return torch.tensor(out[:length])

    def retrieval_row(self, gen: torch.Generator) -> torch.Tensor:
        """Retrieval documents back to back (EOS between them), the last one cut at the window: each a passkey
        document with probability ``passkey_share``, else one of a RULER task drawn by its ``ruler_tasks`` weight."""
        packed: list[int] = []
        while len(packed) < self.window:
            pool = self.passkey_docs
            if float(torch.rand(1, generator=gen)) >= self.passkey_share:
                pool = self.ruler_docs[int(torch.multinomial(self.ruler_weights, 1, generator=gen))]
            packed += pool[int(torch.randint(0, len(pool), (1,), generator=gen))] + [self.eos]
        return torch.tensor(packed[:self.window])


def _settings(seed: int, steps: int | None, train_bytes: int | None = None) -> tuple[dict[str, Any], list[str]]:
    train_bytes = SETTINGS["train_bytes"] if train_bytes is None else int(train_bytes)
    documents = stdlib_documents(train_bytes, "train")
    settings = dict(SETTINGS, seed=int(seed), train_bytes=train_bytes,
                    corpus={"name": "python-stdlib-train", "bytes": sum(map(len, documents)),
                            "digest": corpus_digest(documents)})
    if steps is not None:
        settings["steps"] = int(steps)
    return settings, [d.decode("ascii") for d in documents]


def training_data(settings: dict[str, Any], texts: list[str], seed: int):
    """``(tokenizer, curriculum)`` of a base model: the BPE trained on ``texts`` and a sample of passkey
    documents, and the :class:`Curriculum` over the tokenized text stream, passkey documents and 3,000
    RULER-format documents of each of ``settings["ruler_tasks"]``."""
    rng = random.Random(f"ropekit-base|{seed}")
    window = settings["window"]
    retrieval = [passkey_document(rng, max_sentences=window // 8) for _ in range(8000)]
    tokenizer = train_tokenizer(texts + retrieval[:200], settings["vocab_size"])
    stream: list[int] = []
    for ids in tokenizer(texts).input_ids:
        stream.extend(ids + [tokenizer.eos_token_id])
    documents = [ids[:window] for ids in tokenizer(retrieval).input_ids]
    essay_words = " ".join(texts).split()
    ruler = {task: ruler_documents(task, tokenizer, window, 3000, rng, essay_words) for task in settings["ruler_tasks"]}
    return tokenizer, Curriculum(tokenizer, torch.tensor(stream), documents, settings, seed, ruler)


def learning_rate(step: int, settings: dict[str, Any]) -> float:
    """Linear warm-up over ``settings["warmup"]`` steps, then cosine decay to 10 % of ``settings["lr"]``."""
    peak, warmup, total = settings["lr"], settings["warmup"], settings["steps"]
    if step < warmup:
        return peak * (step + 1) / warmup
    fraction = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * fraction)))


def shipped_model_path(seed: int = 0, *, steps: int | None = None, shipped_dir: Path | None = None) -> Path | None:
    """The shipped base model's directory when it was trained with the current SETTINGS, this seed and these
    steps, else ``None``.

    The corpus fingerprint is not compared: the training split comes from the local Python's standard
    library, so another Python version would rebuild a (slightly) different model, but the shipped one is
    still the model these settings describe. ``ropekit pretrain-base --force`` rebuilds it here.
    """
    directory = Path(shipped_dir) if shipped_dir is not None else SHIPPED_DIR
    if not is_cached(directory) or not (directory / "model.safetensors").is_file():
        return None
    try:
        recorded = dict(describe(directory)["settings"])
    except (OSError, ValueError, KeyError):
        return None
    recorded.pop("corpus", None)
    wanted = json.loads(json.dumps(dict(SETTINGS, seed=int(seed))))
    if steps is not None:
        wanted["steps"] = int(steps)
    return directory if recorded == wanted else None


def base_model_path(seed: int = 0, cache_dir=None, *, steps: int | None = None, shipped: bool = True) -> Path:
    """Where :func:`pretrain_base` finds (or will keep) the model for these settings: the shipped model when
    it matches them (and ``shipped``), else the cache entry."""
    if shipped:
        found = shipped_model_path(seed, steps=steps)
        if found is not None:
            return found
    settings, _ = _settings(seed, steps)
    return cache_root(cache_dir) / f"base-llama-{settings_key(settings)}"


def is_cached(path: Path) -> bool:
    return (path / META_FILE).is_file() and (path / "config.json").is_file() and (path / "tokenizer.json").is_file()


def pretrain_base(seed: int = 0, cache_dir=None, *, steps: int | None = None, use_cache: bool = True,
                  shipped: bool = True, progress: bool = True, threads: int | None = None, on_step=None) -> Path:
    """The built-in base model's directory (model + tokenizer + meta): the shipped model when it matches the
    settings, else a cached one, else trained here now.

    ``use_cache=False`` trains again from scratch (ignoring both the shipped and the cached model) and
    replaces the cache entry; ``shipped=False`` ignores only the shipped model.

    Each step is a batch of :class:`Curriculum` (copy curriculum first, then natural text with packed
    passkey and RULER-format documents). Measured on 2 CPU cores: the copy loss leaves its plateau between steps
    300 and 500 and the finished model retrieves passkeys and RULER's needles inside its window (README, "The
    base model").

    AdamW (β 0.9/0.95), warm-up then cosine decay (:func:`learning_rate`), gradient clipping at 1.
    ``on_step(done, total)`` is called after every step (a study's progress bar).
    """
    if use_cache and shipped:
        found = shipped_model_path(seed, steps=steps)
        if found is not None:
            return found
    settings, texts = _settings(seed, steps)
    path = cache_root(cache_dir) / f"base-llama-{settings_key(settings)}"
    if use_cache and is_cached(path):
        return path
    # an unusable cache (a file, a read-only place) is said before the minutes of training, not after them
    check_target(path, what="the model cache (ROPEKIT_CACHE)", kind="dir")
    window, total = settings["window"], settings["steps"]
    # the tokenizer and the packed documents take a while (≈ 45 s) before the first step: shown, not silent
    with progress_bar("preparing the base model's tokenizer and training documents", enabled=progress):
        tokenizer, curriculum = training_data(settings, texts, seed)
    eos = tokenizer.eos_token_id
    threads = threads or default_threads()
    started = time.perf_counter()
    saved = _Resume(path, settings)
    if not use_cache:
        saved.clear()  # trained again from scratch, as asked
    with deterministic(threads):
        model = build_tiny_model("llama", seed=seed, vocab_size=len(tokenizer), window=window, **settings["model"])
        model.config.eos_token_id = model.config.pad_token_id = model.config.bos_token_id = eos
        model.generation_config.eos_token_id = model.generation_config.pad_token_id = eos
        model.train()
        gen = torch.Generator().manual_seed(seed)
        resume = saved.load(model, gen)

        def batch(step: int) -> dict[str, torch.Tensor]:
            ids = curriculum.batch(step, gen)
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

        def checkpoint(done: int, optimizer, losses: list[float]) -> None:
            if done % CHECKPOINT_EVERY == 0 and done < total:
                saved.save(done, model, optimizer, gen, losses, time.perf_counter() - started)

        losses = pretrain(model, batch, lambda step: learning_rate(step, settings), total, lr=settings["lr"],
                          label="pre-training the base model" + (f" (resumed after step {resume['step']})"
                                                                 if resume is not None else ""),
                          progress=progress, phase=curriculum.phase, on_step=on_step, resume=resume,
                          checkpoint=checkpoint)
        model.eval()
    meta = {
        "settings": settings,
        "train_seconds": round(time.perf_counter() - started + (resume or {}).get("seconds", 0.0), 1),
        "threads": threads,
        "initial_loss": losses[0],
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "corpus_note": "copy curriculum (synthetic trigram and repeated-span rows), then the python-stdlib training split "
                       "(sources and their docstrings) with packed passkey and RULER-format documents and repeated-span rows",
    }
    done = save_model_atomically(model, path, meta, extra=tokenizer.save_pretrained, meta_file=META_FILE)
    saved.clear()
    return done


#: Steps between the pre-training's resume points (about 50 s each on 2 CPU cores).
CHECKPOINT_EVERY = 100


class _Resume:
    """The resume point of one base model's pre-training, beside its cache entry (``…/base-llama-KEY.resume.pt``):
    weights, AdamW's state, the batch generator's and torch's RNG state, the losses so far and the seconds spent,
    for the settings it was written for. A run that finds one continues after its step, bit for bit as if it had
    not stopped (the batches come from the generator's state, the weights and moments from the file)."""

    def __init__(self, path: Path, settings: dict[str, Any]):
        self.file = path.with_name(path.name + ".resume.pt")
        self.settings = json.loads(json.dumps(settings))

    def save(self, step: int, model, optimizer, gen: torch.Generator, losses: list[float], seconds: float) -> None:
        state = {"settings": self.settings, "step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "generator": gen.get_state(), "torch_rng": torch.get_rng_state(), "losses": list(losses),
                 "seconds": float(seconds)}
        tmp = self.file.with_name(self.file.name + ".part")
        self.file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, tmp)
        os.replace(tmp, self.file)  # a crash while writing leaves the previous resume point

    def load(self, model, gen: torch.Generator) -> dict[str, Any] | None:
        if not self.file.is_file():
            return None
        try:
            state = torch.load(self.file, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged resume point is not trusted: the training starts over
            return None
        if state.get("settings") != self.settings:
            return None
        model.load_state_dict(state["model"])
        gen.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        return state

    def clear(self) -> None:
        for leftover in (self.file, self.file.with_name(self.file.name + ".part")):
            leftover.unlink(missing_ok=True)


#: The files of a model directory that are shipped (weights, config, tokenizer, training record).
SHIPPED_FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", META_FILE)


def ship_model(path: Path, shipped_dir: Path | None = None) -> Path:
    """Copy the model directory ``path`` into the package's shipped folder (:data:`SHIPPED_DIR`), its training
    record with the Python version whose standard library it was trained on; returns the folder. The folder is
    built beside the old one and swapped in whole (:func:`ropekit.runtime.atomic.atomic_dir`): an interrupted ship
    leaves the old model and its record, never new weights under the old record or a file of the old model."""
    import platform
    import shutil

    target = Path(shipped_dir) if shipped_dir is not None else SHIPPED_DIR
    if Path(path).resolve() == target.resolve():  # the shipped model itself matched: it is shipped already
        return target
    # the corpus fingerprint depends on the standard library, so record whose it was
    meta = dict(describe(path), python=platform.python_version())
    with atomic_dir(target, replace=True, what="the shipped base model") as building:
        for name in SHIPPED_FILES[:-1]:
            if (Path(path) / name).is_file():
                shutil.copyfile(Path(path) / name, building / name)
        (building / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return target


def load_base(seed: int = 0, cache_dir=None, **kwargs):
    """``(model, tokenizer)`` of the built-in base model, pre-training it first when it is not cached."""
    path = pretrain_base(seed, cache_dir, **kwargs)
    loaded = load_model(str(path))
    return loaded.model, loaded.tokenizer


def describe(path: Path) -> dict[str, Any]:
    """The recorded training facts of a base model directory."""
    return json.loads((Path(path) / META_FILE).read_text())
