"""``ropekit search``: LongRoPE's search for a model's rescale factors, resumable, ending in a native export.

The objective (LongRoPE §3.2) is the perplexity of the model with candidate factors λ at the target length on a
few search documents: by default documents of the training split the built-in base model was trained on
(never the built-in held-out evaluation corpus, which stays the yardstick), or ``--data``. Each candidate is
installed with ropekit's ``longrope`` method (``θ'_i = θ^eff_i/λ_i`` beyond the original window, the model's own
frequencies inside it, and cos/sin multiplied by the attention factor ``√(1 + ln s/ln C)`` at every length, inside the
window too, as transformers' ``longrope`` and Phi-3 compute it) and removed again after its evaluation.

With ``start_tokens`` the first n̂ positions keep the model's own RoPE (LongRoPE §3.2, the method's
``start_tokens``): one fixed n̂ for every candidate, or several, searched jointly with the factors
(:mod:`ropekit.methods.longrope_search`). A best candidate with n̂ > 0 cannot be written as transformers' ``longrope`` (one frequency
per pair for every position): it is exported as rope type ``ropekit_longrope``, which ``ropekit.load`` restores.

Every evaluated candidate is written to ``DIR/search.sqlite`` as it finishes (one transaction each, WAL,
``synchronous=FULL``). The search is a deterministic function of the seed and the objective values, so a
restarted run replays the same generations and reads finished candidates back instead of evaluating them:
after a SIGKILL nothing done is lost and nothing is evaluated twice. The database is a store of objective
values: a candidate's perplexity depends only on the model's weights, the search documents, n̂ when it is fixed,
and the dtype. The database pins each by content, not only by the settings that name it: the sha256 of the
documents' token ids (:func:`documents_digest`: a changed ``--data`` file, or another Python's standard library
behind the default documents, is caught), a fingerprint of the weights (:func:`model_fingerprint`) and the dtype;
a rerun whose documents or weights differ is refused in one line (a database written before the digests were
recorded adopts the current ones, as it does the dtype). A rerun that changes only how the search moves (its
budget, population, ceiling, mutation probability or fixed pairs) replays its own generations and reads back every
candidate it shares with the runs before it; its result is the one a fresh directory would give. The best
candidate is exported natively (transformers' ``longrope``: plain transformers loads it with the same logits) to
``DIR/model``, with ``DIR/result.json`` describing the search.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sqlite3
import struct
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .. import runtime
from ..runtime.devices import computed_on
from ..data.corpora import existing_corpus, is_builtin, iter_documents
from ..data.local_text import stdlib_documents
from ..data.packing import PackedStream
from ..core.base_rope import length_dependence
from ..core.schema import MAX_POSITIONS
from ..errors import InvalidParameterError, RopekitError, UnsupportedModelError
from ..eval.perplexity import score_windows
from ..install import extend, installed, rope_info, save_pretrained, uninstall
from ..methods.longrope import LongRoPE
from ..methods.longrope_search import (PAPER_START_TOKENS, Candidate, ceiling_of, initial_population,
                                      next_generation, seed_candidate, seed_factors, split)

#: The training split read for default search documents (bytes of cleaned standard-library text).
TRAIN_BYTES = 1_500_000


#: The settings a candidate's objective depends on (with the dtype, which the store pins): what the stored
#: perplexities of a search directory were computed for. The other settings only steer the search.
OBJECTIVE_FIELDS = ("model", "target_length", "documents", "data", "seed", "start_tokens")


@dataclass(frozen=True)
class SearchSettings:
    """What defines a search. Its objective fields (:data:`OBJECTIVE_FIELDS`) define the values its directory
    stores; a rerun with other objective fields is refused there."""

    model: str
    target_length: int
    evaluations: int
    seed: int = 0
    documents: int = 4
    data: str | None = None
    fixed_pairs: int = 0
    population: int | None = None
    mutation_probability: float = 0.3
    #: n̂: one value (fixed for every candidate) or several (searched among them); (0,) = no start tokens.
    start_tokens: tuple[int, ...] = (0,)
    #: The largest factor tried; None: LongRoPE Table 1's ``1.25·s``.
    max_factor: float | None = None

    @property
    def searched_starts(self) -> tuple[int, ...] | None:
        """The start-token counts searched among, or ``None`` when n̂ is fixed."""
        return tuple(self.start_tokens) if len(self.start_tokens) > 1 else None

    def objective_record(self) -> dict[str, Any]:
        """The settings a candidate's perplexity depends on (:data:`OBJECTIVE_FIELDS`), as stored."""
        out = {name: getattr(self, name) for name in OBJECTIVE_FIELDS}
        out["start_tokens"] = list(self.start_tokens)
        return out

    def ceiling(self, factor: float) -> float:
        """The largest factor tried for extension ratio ``factor``."""
        return ceiling_of(factor, self.max_factor)

    def shape(self) -> tuple[int, int, int, int]:
        """``(population, parents, mutations, crossovers)``: the paper's 64/32/16/16, scaled down to the budget."""
        population = self.population or max(4, min(64, self.evaluations // 4))
        children = max(2, population // 2)
        return population, max(2, population // 2), children - children // 2, children // 2


def check_settings(s: SearchSettings, window: int, pairs: int) -> None:
    """One line for each impossible setting."""
    if s.fixed_pairs >= pairs:
        raise InvalidParameterError(f"--fixed-pairs {s.fixed_pairs} fixes every one of the {pairs} rotary pairs",
                                    "pass fewer pairs than the model has")
    if s.target_length <= window:
        raise InvalidParameterError(f"target length {s.target_length} is not beyond the model's window {window}",
                                    f"pass --target-length above {window}")
    if s.target_length > MAX_POSITIONS:
        raise InvalidParameterError(f"target length {s.target_length:,} is past {MAX_POSITIONS:,} tokens, the most "
                                    "positions a float32 rotary angle tells apart", "pass a target length up to 16M")
    if s.evaluations < 4:
        raise InvalidParameterError(f"--evaluations {s.evaluations} leaves no room for a search",
                                    "pass --evaluations 4 or more (the paper used about 1,300)")
    starts = list(s.start_tokens)
    if not starts or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in starts):
        raise InvalidParameterError(f"--start-tokens {starts} must be whole numbers ≥ 0",
                                    "pass e.g. --start-tokens 4, or --start-tokens 0,4,16, or --start-tokens paper")
    if len(set(starts)) != len(starts):
        raise InvalidParameterError(f"--start-tokens {starts} repeats a value", "pass each n̂ once")
    if max(starts) >= s.target_length:
        raise InvalidParameterError(f"--start-tokens {max(starts)} keeps the whole {s.target_length}-token input "
                                    "un-interpolated", f"pass values below {s.target_length}")
    if s.documents < 1:
        raise InvalidParameterError("--documents must be at least 1", "pass e.g. --documents 4")
    factor = s.target_length / window
    if s.max_factor is not None and not math.isfinite(s.max_factor):
        raise InvalidParameterError(f"--max-factor {s.max_factor} is not a finite number",
                                    f"pass a value from s = {factor:g} up, e.g. LongRoPE's 1.25·s = {ceiling_of(factor):g}")
    if s.max_factor is not None and s.max_factor < factor:
        raise InvalidParameterError(f"--max-factor {s.max_factor:g} is below the extension ratio s = {factor:g}: "
                                    "PI's λ = s, a seed of the search, would not fit",
                                    f"pass --max-factor {factor:g} or more, or leave it out for LongRoPE's "
                                    f"1.25·s = {ceiling_of(factor):g}")
    if not 0.0 < s.mutation_probability <= 1.0:
        raise InvalidParameterError("the mutation probability must be in (0, 1]", "pass e.g. 0.3")
    if s.data is not None and is_builtin(s.data):
        raise InvalidParameterError(f"--data {str(s.data).strip() or 'builtin'} is a held-out evaluation corpus",
                                    "search on other text (a file, folder or dataset), or leave --data out for the "
                                    "built-in training split")
    if s.data is not None:
        existing_corpus(s.data)  # before the search says it starts


def search_documents(tokenizer, settings: SearchSettings) -> list[list[int]]:
    """``documents`` token sequences of exactly the target length, chosen by the seed: documents that are long
    enough, cut to the target (from ``--data`` or the built-in training split).

    The built-in training split stores standard-library text in pieces of at most 32 KiB, so for a target of tens
    of thousands of tokens none is long enough; then its documents, in a seeded order and each followed by the
    tokenizer's end-of-text token, are concatenated and cut into target-length rows, as training packs them
    (:mod:`ropekit.data.packing`). Such a row spans the target's positions, which is what the factors are searched
    for, though no dependency in it reaches further than one document."""
    rng = random.Random(f"longrope-search|{settings.seed}")
    if settings.data is None:
        texts = [doc.decode("ascii") for doc in stdlib_documents(TRAIN_BYTES, "train")]
        all_ids = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
        where = "the built-in training split"
    else:
        all_ids = [doc.ids for doc in iter_documents(settings.data, tokenizer)]
        where = f"'{settings.data}'"
    long_enough = [d[:settings.target_length] for d in all_ids if len(d) >= settings.target_length]
    if len(long_enough) >= settings.documents:
        rng.shuffle(long_enough)
        return long_enough[:settings.documents]
    if settings.data is None:
        rng.shuffle(all_ids)
        stream = PackedStream(all_ids, settings.target_length, eos_id=getattr(tokenizer, "eos_token_id", None))
        if len(stream) >= settings.documents:
            n = settings.target_length
            return [stream.tokens[k * n:(k + 1) * n].tolist() for k in range(settings.documents)]
        where += f" ({TRAIN_BYTES:,} bytes read, packed into {len(stream)} rows)"
    raise RopekitError(f"{where} has {len(long_enough)} documents of {settings.target_length}+ tokens, "
                       f"the search needs {settings.documents}",
                       "pass --data with longer documents, fewer --documents, or a shorter --target-length")


def documents_digest(documents: list[list[int]]) -> str:
    """sha256 of the search documents' token ids: each document as its length and then its ids, 8-byte
    little-endian integers, in order. The ids, not the text: a changed tokenizer changes the objective too."""
    h = hashlib.sha256(b"ropekit-search-documents/1")
    for doc in documents:
        h.update(struct.pack("<q", len(doc)))
        h.update(struct.pack(f"<{len(doc)}q", *doc))
    return h.hexdigest()


#: Values sampled from each parameter for :func:`model_fingerprint`.
FINGERPRINT_SAMPLES = 4096


def model_fingerprint(model) -> str:
    """A cheap fingerprint of ``model``'s weights: sha256 over each parameter's name, shape and a fixed strided
    sample of at most :data:`FINGERPRINT_SAMPLES` of its values (every ``ceil(n/4096)``-th, from the first), cast to
    bfloat16 — so a checkpoint gives the same fingerprint loaded in float32 or bfloat16 and on any device, while
    other weights (a fine-tuned or another checkpoint) give another. A sample, not a full hash: it reads a few
    thousand values per tensor, not the whole model."""
    h = hashlib.sha256(b"ropekit-model-fingerprint/1")
    with torch.no_grad():
        for name, param in model.named_parameters():
            h.update(f"{name}|{tuple(param.shape)}|".encode())
            if param.device.type == "meta" or param.numel() == 0:
                continue
            flat = param.detach().reshape(-1)
            step = -(-flat.numel() // FINGERPRINT_SAMPLES)
            sample = flat[::step][:FINGERPRINT_SAMPLES].to(device="cpu", dtype=torch.bfloat16)
            raw = sample.view(torch.int16).numpy()
            h.update((raw.byteswap() if sys.byteorder == "big" else raw).tobytes())
    return h.hexdigest()


def parse_start_tokens(text: str, target_length: int) -> tuple[int, ...]:
    """``--start-tokens``: ``N`` (fixed), ``a,b,c`` (searched among), or ``paper`` (the paper's set
    :data:`~ropekit.methods.longrope_search.PAPER_START_TOKENS`, the values below the target length)."""
    if text.strip().lower() == "paper":
        return tuple(n for n in PAPER_START_TOKENS if n < target_length)
    try:
        values = tuple(int(v) for v in text.replace(";", ",").split(",") if v.strip())
    except ValueError:
        raise InvalidParameterError(f"--start-tokens {text!r} is not a number or a comma-separated list",
                                    "pass e.g. --start-tokens 4, --start-tokens 0,4,16 or --start-tokens paper") from None
    return values


def objective(model, documents: list[list[int]], factors: Candidate, factor: float, start_tokens: int = 0) -> float:
    """Perplexity of ``model`` with long factors ``factors`` (and the first ``start_tokens`` positions
    un-interpolated) over ``documents`` (every predicted token)."""
    extend(model, LongRoPE.name, long_factor=list(factors), factor=factor, start_tokens=start_tokens)
    try:
        nll, count = 0.0, 0
        for doc in documents:
            with torch.no_grad():
                row = torch.tensor([doc], device=next(model.parameters()).device)
                scores = score_windows(model, row, row.shape[1] - 1).double()
            nll += float(scores.sum())
            count += scores.numel()
    finally:
        uninstall(model)
    return math.exp(nll / count)


#: What the stored perplexities were computed on, pinned by content in the store's meta: meta key → what it names.
DIGEST_KEYS = {"documents_sha256": "search documents", "model_fingerprint": "model weights"}


class SearchStore:
    """The evaluated candidates of a search directory in SQLite, written as each finishes.

    It keeps what their perplexities were computed for (:meth:`SearchSettings.objective_record`) and refuses a
    run whose objective differs; a run that only steers the search differently reads the stored values back.
    It also keeps the dtype the objectives were computed in: a bfloat16 perplexity differs from a float32 one by
    about what separates neighbouring candidates, so a search is continued only in the dtype it began in (any
    device). And it keeps what they were computed on, by content (``digests``: :data:`DIGEST_KEYS`, the sha256 of
    the documents' token ids and the weights' fingerprint): the same settings can name other text (a ``--data``
    file rewritten, the default documents read from another Python's standard library) or other weights (a model
    path holding another checkpoint), and a run whose digests differ is refused. Every check is made before
    anything is written. Searches stored before the dtype or the digests were recorded take those of the run that
    continues them; searches stored before the objective was recorded are read by the objective fields of their
    settings. ``digests=None`` (a check before the model is loaded) checks and records none."""

    def __init__(self, path: Path, settings: SearchSettings, dtype: str = "float32",
                 digests: dict[str, str] | None = None):
        self.conn = sqlite3.connect(path, timeout=30)
        try:
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = FULL")
            with self.conn:
                self.conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
                self.conn.execute("CREATE TABLE IF NOT EXISTS candidates (factors TEXT PRIMARY KEY, objective REAL "
                                  "NOT NULL, generation INTEGER NOT NULL, seconds REAL NOT NULL, evaluated_at TEXT "
                                  "NOT NULL)")
            meta = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as e:  # a damaged or foreign file: nothing in it is touched
            self.conn.close()
            raise RopekitError(f"'{path}' is not a ropekit search database ({e})",
                               "pass another --out directory, or move the damaged file away") from None
        try:
            self._check(path, meta, settings, dtype, digests or {})
        except RopekitError:
            self.conn.close()
            raise
        wanted = {"objective": json.dumps(settings.objective_record(), sort_keys=True), "dtype": dtype,
                  **(digests or {})}
        with self.conn:  # the objective is rewritten (its stored form may be an older one); the rest adopted
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('objective', ?)", (wanted["objective"],))
            for key, value in wanted.items():
                if key != "objective" and key not in meta:
                    self.conn.execute("INSERT INTO meta VALUES (?, ?)", (key, value))
        self.dtype = dtype

    @staticmethod
    def _check(path: Path, meta: dict[str, str], settings: SearchSettings, dtype: str,
               digests: dict[str, str]) -> None:
        """One line when the stored perplexities were computed for other settings, in another dtype, or on other
        documents or weights than this run's."""
        wanted = settings.objective_record()
        if "objective" in meta:
            stored = json.loads(meta["objective"])
        elif "settings" in meta:  # stored before the objective was: its settings hold the same fields
            old = json.loads(meta["settings"])
            stored = {name: old.get(name) for name in OBJECTIVE_FIELDS}
            stored["start_tokens"] = old.get("start_tokens", [0])
        else:
            stored = None
        if stored is not None and stored != wanted:
            differ = ", ".join(f"{name} {stored.get(name)!r}" for name in OBJECTIVE_FIELDS
                               if stored.get(name) != wanted[name])
            raise RopekitError(f"{path.parent} holds a search whose perplexities were computed for other settings "
                               f"({differ})", "pass another --out directory, or the same model, target length, "
                               "documents, data, seed and start tokens to continue it")
        if "dtype" in meta and meta["dtype"] != dtype:
            raise RopekitError(f"{path.parent} holds a search computed in {meta['dtype']}; this run computes in "
                               f"{dtype}, and its perplexities would not compare with the stored ones",
                               f"pass --dtype {meta['dtype']} to continue it, or another --out directory")
        differ = [key for key in DIGEST_KEYS if key in meta and key in digests and meta[key] != digests[key]]
        if differ:
            what = " and ".join(f"other {DIGEST_KEYS[key]} ({key} {meta[key][:12]}…, this run's "
                                f"{digests[key][:12]}…)" for key in differ)
            causes = []
            if "documents_sha256" in differ:
                causes.append("the --data text (or the tokenizer) changed" if settings.data is not None else
                              "the default documents, read from this Python's standard library, differ from those "
                              "of the run that began it")
            if "model_fingerprint" in differ:
                causes.append(f"'{settings.model}' holds other weights")
            raise RopekitError(f"{path.parent} holds a search whose perplexities were computed on {what}: "
                               f"{' and '.join(causes)}, so its stored values do not apply to this run",
                               "pass another --out directory, or the documents and model it was computed on to "
                               "continue it")

    @staticmethod
    def key(c: Candidate) -> str:
        return json.dumps([round(v, 2) for v in c])

    def finished(self) -> dict[str, float]:
        return dict(self.conn.execute("SELECT factors, objective FROM candidates").fetchall())

    def add(self, c: Candidate, value: float, generation: int, seconds: float) -> None:
        with self.conn:
            self.conn.execute("INSERT OR IGNORE INTO candidates VALUES (?, ?, ?, ?, datetime('now'))",
                              (self.key(c), value, generation, seconds))

    def evaluation_seconds(self, candidates: Iterable[Candidate]) -> float:
        """Time spent evaluating ``candidates``, over every run that evaluated one of them."""
        keys = {self.key(c) for c in candidates}
        rows = self.conn.execute("SELECT factors, seconds FROM candidates").fetchall()
        return float(sum(seconds for key, seconds in rows if key in keys))

    def close(self) -> None:
        self.conn.close()


def run_search(model, tokenizer, settings: SearchSettings, out_dir: str | Path, *, progress: bool = True,
               evaluate: Callable[[list[Candidate]], Iterable[tuple[Candidate, float, float]]] | None = None
               ) -> dict[str, Any]:
    """Search, export the best factors to ``out_dir/model`` and return the result (also ``result.json``).

    ``evaluate`` maps a generation's new candidates to ``(candidate, objective, seconds)`` as each finishes
    (the CLI passes a worker pool); by default they are evaluated here, one after another.
    """
    require_base_model(model)
    info = rope_info(model)
    check_settings(settings, info.window, info.rotary_dim // 2)
    out = Path(out_dir)
    factor = settings.target_length / info.window
    check_candidates_install(model, settings, factor)
    starts = settings.searched_starts
    documents = search_documents(tokenizer, settings)  # too little text is refused before the directory exists
    check_search_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    if evaluate is None:
        def evaluate(batch):
            for c in batch:
                started = time.perf_counter()
                factors, n_hat = candidate_args(c, settings)
                yield c, objective(model, documents, factors, factor, n_hat), time.perf_counter() - started

    where = computed_on(model)
    digests = {"documents_sha256": documents_digest(documents), "model_fingerprint": model_fingerprint(model)}
    store = SearchStore(out / "search.sqlite", settings, dtype=where["dtype"], digests=digests)
    started = time.perf_counter()
    try:
        stored = store.finished()
        population, parents, mutations, crossovers = settings.shape()
        rng = random.Random(settings.seed)
        scored: dict[Candidate, float] = {}
        generation, evaluated_here = 0, 0
        ceiling = settings.ceiling(factor)
        batch = initial_population(seed_factors(info, factor, settings.target_length), population, rng, factor,
                                   settings.fixed_pairs, settings.mutation_probability, starts, ceiling)
        with runtime.progress("LongRoPE search", total=settings.evaluations, enabled=progress) as bar:
            while batch:
                batch = batch[:settings.evaluations - len(scored)]
                todo = [c for c in batch if store.key(c) not in stored]
                for c in batch:
                    if store.key(c) in stored:
                        scored[c] = stored[store.key(c)]
                        bar.update(advance=1)
                for c, value, seconds in evaluate(todo):
                    if not math.isfinite(value):
                        value = math.inf
                    store.add(c, value, generation, seconds)
                    scored[c] = value
                    evaluated_here += 1
                    bar.update(advance=1, info=f"best ppl {min(scored.values()):.3f}")
                if len(scored) >= settings.evaluations:
                    break
                generation += 1
                batch = next_generation(scored, rng, parents=parents, mutations=mutations, crossovers=crossovers,
                                        factor=factor, fixed_pairs=settings.fixed_pairs,
                                        probability=settings.mutation_probability, starts=starts, ceiling=ceiling)
        evaluation_seconds = store.evaluation_seconds(scored)
    finally:
        store.close()
    best = min(scored, key=lambda c: (scored[c], c))
    best_factors, best_start = candidate_args(best, settings)
    extend(model, LongRoPE.name, long_factor=list(best_factors), factor=factor, start_tokens=best_start)
    with runtime.quiet_transformers():  # n̂ > 0 has no per-pair form: rope type ropekit_longrope
        report = save_pretrained(model, out / "model", tokenizer, rope_format="native" if best_start == 0 else "ropekit")
    uninstall(model)
    seeds = seed_factors(info, factor, settings.target_length)  # which closed forms the search started from
    result = {
        "settings": {**asdict(settings), "start_tokens": list(settings.start_tokens), "max_factor": ceiling},
        "window": info.window,
        "factor": factor,
        "evaluations": len(scored),
        "evaluated_here": evaluated_here,
        "generations": generation + 1,
        "seconds": round(time.perf_counter() - started, 1),
        "evaluation_seconds": round(evaluation_seconds, 1),
        "best": {"long_factor": list(best_factors), "start_tokens": best_start, "perplexity": scored[best]},
        "seeds": {name: scored.get(seed_candidate(values, factor, settings.fixed_pairs, starts, ceiling))
                  for name, values in seeds.items()},
        "export": report,
        "computed_on": where,
        "digests": digests,
    }
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, out / "result.json")
    return result




def require_base_model(model) -> None:
    """Each candidate is LongRoPE installed on ``model``; one line, before anything is written, for a model the
    search does not take.

    * A model extended by ropekit (an export of ``ropekit extend`` or ``train`` carries its method): a method goes on
      a model not extended by ropekit.
    * A model whose own RoPE is a switching LongRoPE (Phi-3/3.5/4-mini: transformers' ``longrope`` with short and
      long factors that differ, switching at ``original_max_position_embeddings``): searching factors on it would be
      LongRoPE's progressive extension (Ding et al. 2024: a second search on a model already extended with searched
      factors, the route from 256k to 2048k tokens), which this search does not implement — its candidates would
      switch at another length than the model's own set does. The model's base at its original window, or the
      factors it ships, are the alternatives.
    """
    record = installed(model)
    if record:
        raise UnsupportedModelError(f"the model is already extended with '{record['method']}'",
                                    "search on the base model it was extended from: LongRoPE's factors replace the "
                                    "method's")
    info = rope_info(model)
    kind, switch = length_dependence(info)
    if kind == "switch":
        raise UnsupportedModelError(
            f"a LongRoPE search on a model whose RoPE already switches between short and long factors "
            f"('{info.rope_type}' at {switch} tokens, window {info.window}) is not supported: it would be a "
            "progressive search on an already extended model",
            f"search on the model's base at its original {switch}-token window, or use the long_factor it ships")


def check_candidates_install(model, settings: SearchSettings, factor: float) -> None:
    """Install and remove the search's first candidate (PI's factors, with the largest n̂) on ``model``: a model
    that cannot take LongRoPE is refused in one line here, before the search directory is made, not at its first
    evaluation."""
    pairs = rope_info(model).rotary_dim // 2
    try:
        extend(model, LongRoPE.name, long_factor=[factor] * pairs, factor=factor,
               start_tokens=max(settings.start_tokens))
    except RopekitError as e:
        raise type(e)(f"the search's candidates (LongRoPE factors) cannot be installed on this model: {e.problem}",
                      e.fix or "search on another model") from None
    uninstall(model)


def check_search_dir(out: Path) -> None:
    """Before any work: the search writes ``model/`` and ``result.json`` into ``out``, replacing them only when
    they are an earlier search's (``search.sqlite`` beside them, ``model/`` a model directory); a non-empty
    directory without an earlier search is refused."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InvalidParameterError(f"--out '{out}' exists and is a file", "pass a directory path")
    earlier = (out / "search.sqlite").is_file()
    model = out / "model"
    if model.exists() and not (earlier and (model / "config.json").is_file()):
        raise InvalidParameterError(f"'{model}' exists and is not the model of an earlier search in '{out}'",
                                    "pass a new --out directory, or move it away")
    if (out / "result.json").exists() and not earlier:
        raise InvalidParameterError(f"'{out / 'result.json'}' exists and is not an earlier search's",
                                    "pass a new --out directory, or move it away")
    if not earlier and out.is_dir() and any(out.iterdir()):  # the search's files would mix with someone else's
        raise InvalidParameterError(f"--out '{out}' holds files and no earlier search (search.sqlite)",
                                    "pass a new or empty --out directory")


def candidate_args(c: Candidate, settings: SearchSettings) -> tuple[Candidate, int]:
    """``(long factors, n̂)`` a candidate is evaluated with."""
    factors, n_hat = split(c, settings.searched_starts)
    return factors, settings.start_tokens[0] if n_hat is None else n_hat


# ---- worker processes: each loads the model once and evaluates the candidates it is sent -------------------------
_WORKER: dict[str, Any] = {}


def worker_init(model_path: str, settings: SearchSettings, threads: int, placement: dict[str, str] | None = None) -> None:
    """Load the model and the search documents in a worker process (``ProcessPoolExecutor`` initializer), on the
    device and in the dtype and attention kernel of ``placement`` (the parent's, so every candidate is scored alike)."""
    from ..models.loading import load_model

    torch.set_num_threads(threads)
    where = placement or {}
    with runtime.quiet_transformers():
        loaded = load_model(model_path, device=where.get("device"), dtype=where.get("dtype"),
                            attn_implementation=where.get("attn", "sdpa"))
    _WORKER.update(model=loaded.model, documents=search_documents(loaded.tokenizer, settings),
                   factor=settings.target_length / rope_info(loaded.model).window, settings=settings)


def worker_evaluate(c: Candidate) -> tuple[Candidate, float, float]:
    started = time.perf_counter()
    factors, n_hat = candidate_args(c, _WORKER["settings"])
    value = objective(_WORKER["model"], _WORKER["documents"], factors, _WORKER["factor"], n_hat)
    return c, value, time.perf_counter() - started


def pool_evaluator(pool):
    """An ``evaluate`` for :func:`run_search` that sends a generation to ``pool`` and yields results as they finish."""
    from concurrent.futures import as_completed

    def evaluate(batch):
        for future in as_completed([pool.submit(worker_evaluate, c) for c in batch]):
            yield future.result()

    return evaluate
