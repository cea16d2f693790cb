"""The training dataset: the one entry point the trainer calls, :func:`build_training_data`.

``spec`` is the ``data:`` section of a training YAML::

    data:
      sources:                       # one or more; default: [{path: builtin}], the built-in corpus
        - path: builtin              # or a .txt/.jsonl/.parquet file, a directory, a saved datasets dir
          kind: text                 # text (default) | sft (conversations, see ropekit.data.sft)
          weight: 1.0                # share of the training rows, relative to the other sources
          max_documents: null        # use only the first N documents / conversations
          upsample_long: null        # or {threshold: 4096, factor: 10, mode: downsample_short|repeat_long}
          min_tokens: 0              # sft only: drop shorter conversations (Entropy-ABF (Zhang et al. 2024) §4.1: 10,000 at 16k)
      packing:
        reset_positions: false       # position ids restart at each document (flash kernels: with document_mask only)
        document_mask: false         # attention only within a document (4-D mask, see ropekit.data.packing)
        pack_sft: true               # several whole conversations per row (false: one per row, padded)
        drop_last: true              # drop the last partial row of a text stream (false: pad it)
      pose: null                     # or {target_length: 1024, chunks: 2, offset: uniform|zero|aligned,
                                     #     documents: whole|packed}
      randpos: null                  # or {target_length: 1024, offset: uniform|zero, documents: whole|packed}
      num_sequences: null            # dataset length; default: as many as the sources give (see below)
      shuffle: true                  # seeded shuffle of documents and of the final row order

``None`` (no ``data:`` section) means ``{"sources": [{"path": "builtin"}]}``. Unknown keys and bad values
raise a one-line :class:`RopekitError`.

**Items** (every item has exactly these four tensors; the default collate stacks them):

* ``input_ids`` — long ``[L]``;
* ``labels`` — long ``[L]``, transformers' convention (the model shifts: ``labels[t]`` is the target of
  the prediction made at ``t − 1``); −100 = no loss (padding, non-response SFT tokens, a document's
  first token under ``document_mask``);
* ``position_ids`` — long ``[L]``;
* ``attention_mask`` — long ``[L]`` of 1 (token) / 0 (padding) — *always* passed, even when all ones,
  because without it transformers reads jumps in the position ids (PoSE, RandPos, ``reset_positions``)
  as packed sequences — or, with ``document_mask``, bool ``[1, L, L]`` (``[B, 1, L, L]`` batched), to be
  converted for the model's attention kernel by :func:`ropekit.data.packing.prepare_attention_mask`.

``L`` is ``seq_len``: for packed data the row length; for PoSE/RandPos the training window ``L_c``
whose position ids reach up to ``target_length − 1``.

**Modes.** Without ``pose``/``randpos``, text sources are stream-packed (documents + EOS, cut into rows,
Fu et al.) and SFT sources are packed whole (:mod:`ropekit.data.packing`). With ``pose`` (PoSE, Zhu et al. 2024) or
``randpos``, every item is one *document* (``documents: whole``, the paper's setup: documents shorter
than ``seq_len`` are dropped — a source that would lose more than :data:`MAX_SHORT_SHARE` of them is refused) or one ``target_length`` window of the EOS-joined stream (``documents:
packed``: every token used, documents may be cut); its text and position ids are drawn by
:mod:`ropekit.data.pose` from a generator seeded by ``(seed, epoch, index)`` — new chunks and skips at
every step, identical after a resume. Labels are the input ids throughout, as in the released
``train_pose.py`` (the first token of a chunk is predicted across the chunk boundary). Call :meth:`TrainingDataset.set_epoch` at each epoch start (like a
``DistributedSampler``). PoSE/RandPos take text sources only and cannot be combined with
``reset_positions``/``document_mask``.

**Mixture.** Source ``s`` gets the share ``w_s / Σ w`` of the items. The default dataset length is the
largest that needs no repetition (``min_s rows_s / share_s``); a larger ``num_sequences`` repeats a
source's rows (each pass in a new seeded order). Upsampling acts within a source, before packing.

**Tokenisation cache.** With ``cache_dir``, each source's token ids are stored in
``cache_dir/tokens-<key>.pt`` where the key hashes the source's identity (path plus size and mtime of
every file, or the built-in corpus' digest), the tokenizer (its serialized vocabulary/merges, class,
special tokens), the chat template and, for SFT, the training length and ``min_tokens``. A second
build with the same key does not call the tokenizer at all.

**Built-in training text** (``path: builtin``): the *training* split of the standard-library corpus of
:mod:`ropekit.data.local_text` (what the built-in tiny model was pre-trained on). Not the built-in
corpus of :mod:`ropekit.data.corpora`: that is the held-out evaluation text, and training on it would
contaminate every perplexity measured on it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, ValidationError, field_validator, model_validator
from torch.utils.data import Dataset

from ..core.schema import ConfigProblem, StrictModel, config_error
from ..errors import RopekitError
from . import pose as pose_lib
from .packing import (
    IGNORE_INDEX,
    PackedPieces,
    PackedStream,
    UpsampleConfig,
    upsample_long,
)

CACHE_VERSION = 1
BUILTIN_LABEL = "builtin:python-stdlib-train"
#: Byte budget of the built-in training text (more than the split holds: the whole split).
BUILTIN_MAX_BYTES = 64 * 1024 * 1024
KINDS = ("text", "sft")
DOCUMENT_MODES = ("whole", "packed")
#: With ``documents: whole``, a source may lose at most this share of its documents as shorter than ``seq_len``.
MAX_SHORT_SHARE = 0.9
_TOKENIZE_BATCH = 256


# ---- the spec ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceSpec:
    path: str
    kind: str = "text"
    weight: float = 1.0
    max_documents: int | None = None
    upsample_long: UpsampleConfig | None = None
    min_tokens: int = 0


@dataclass(frozen=True)
class PositionSpec:
    """PoSE or RandPos settings (``chunks`` is unused by RandPos)."""

    method: str
    target_length: int
    chunks: int = 2
    offset: str = "uniform"
    documents: str = "whole"


@dataclass(frozen=True)
class DataSpec:
    sources: tuple[SourceSpec, ...]
    reset_positions: bool = False
    document_mask: bool = False
    pack_sft: bool = True
    drop_last: bool = True
    positions: PositionSpec | None = None
    num_sequences: int | None = None
    shuffle: bool = True


class _Upsample(StrictModel):
    threshold: Any = None
    factor: Any = None
    mode: Any = "downsample_short"

    @model_validator(mode="after")
    def _both(self):
        if self.threshold is None or self.factor is None:
            raise ConfigProblem("needs threshold and factor", "e.g. upsample_long: {threshold: 4096, factor: 10}")
        return self


class _Source(StrictModel):
    path: str = Field(examples=["builtin"])
    kind: Literal["text", "sft"] = "text"
    weight: float = Field(default=1.0, gt=0, examples=[1.0])
    max_documents: int | None = Field(default=None, ge=1, examples=[1000])
    upsample_long: _Upsample | None = None
    min_tokens: int = Field(default=0, ge=0, examples=[0])

    @model_validator(mode="after")
    def _kind_rules(self):
        if not self.path.strip():
            raise ConfigProblem("path is empty", "give every source a path (or 'builtin')")
        if self.kind == "text" and self.min_tokens:
            raise ConfigProblem("min_tokens applies to sft sources only",
                                "remove it, or use upsample_long to favour long documents")
        if self.kind == "sft" and self.path.strip().lower() == "builtin":
            raise ConfigProblem("the built-in corpus is text, not conversations",
                                "give an sft source a .jsonl file of conversations")
        return self


class _Packing(StrictModel):
    reset_positions: bool = False
    document_mask: bool = False
    pack_sft: bool = True
    drop_last: bool = True


class _RandPos(StrictModel):
    target_length: int = Field(ge=3, examples=[1024])
    offset: str = Field(default="uniform", examples=["uniform"])
    documents: Literal["whole", "packed"] = "whole"
    _modes: ClassVar[tuple[str, ...]] = pose_lib.RANDPOS_OFFSET_MODES

    @field_validator("offset")
    @classmethod
    def _offset(cls, value: str) -> str:
        # PoSE and RandPos accept different modes, so the choice is checked against the class's own list.
        if value not in cls._modes:
            raise ConfigProblem(f"must be one of {', '.join(cls._modes)}, got {value!r}", f"write e.g. offset: {cls._modes[0]}")
        return value


class _PoSE(_RandPos):
    chunks: int = Field(default=2, ge=1, examples=[2])
    _modes: ClassVar[tuple[str, ...]] = pose_lib.OFFSET_MODES


class _Spec(StrictModel):
    sources: list[_Source] = Field(min_length=1, examples=["[{path: builtin}]"])
    packing: _Packing | None = None
    pose: _PoSE | None = None
    randpos: _RandPos | None = None
    num_sequences: int | None = Field(default=None, ge=1, examples=[1000])
    shuffle: bool = True

    @model_validator(mode="after")
    def _positions(self):
        if self.pose is not None and self.randpos is not None:
            raise ConfigProblem("pose and randpos are both set", "choose one way to simulate long positions")
        chosen = "pose" if self.pose is not None else "randpos" if self.randpos is not None else None
        packing = self.packing or _Packing()
        if chosen and (packing.reset_positions or packing.document_mask):
            raise ConfigProblem(f"{chosen} cannot be combined with packing.reset_positions/document_mask",
                                f"{chosen} sets the position ids itself; turn those packing options off")
        if chosen and any(s.kind == "sft" for s in self.sources):
            raise ConfigProblem(f"{chosen} applies to text sources only", "remove the sft sources, or the position method")
        return self


def validate_data_spec(spec: dict | None, seq_len: int) -> DataSpec:
    """Check the ``data:`` section (module doc) against ``seq_len`` and return it normalised."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise RopekitError(f"sequence length {seq_len!r} is not an integer ≥ 2", "train on sequences of at least 2 tokens")
    if spec is None or isinstance(spec, dict) and "sources" not in spec:
        # no source named: the built-in corpus, with whatever else the section sets (pose:, num_sequences: …)
        spec = {"sources": [{"path": "builtin"}], **(spec or {})}
    try:
        parsed = _Spec.model_validate(spec)
    except ValidationError as err:
        raise config_error(err, _Spec, prefix="data") from None
    sources = tuple(
        SourceSpec(s.path, s.kind, float(s.weight), s.max_documents,
                   UpsampleConfig(s.upsample_long.threshold, s.upsample_long.factor, s.upsample_long.mode)
                   if s.upsample_long is not None else None, s.min_tokens)
        for s in parsed.sources)
    packing = parsed.packing or _Packing()
    positions = None
    for method, raw in (("pose", parsed.pose), ("randpos", parsed.randpos)):
        if raw is None:
            continue
        # Checks against the sequence length stay out of the model: seq_len is not part of the section.
        if raw.target_length <= seq_len:
            raise RopekitError(f"data.{method}.target_length: must be > the sequence length {seq_len}, got {raw.target_length}",
                               f"write e.g. target_length: {4 * seq_len}")
        chunks = getattr(raw, "chunks", 2)
        if chunks > seq_len:
            raise RopekitError(f"data.pose.chunks {chunks} exceeds the sequence length {seq_len}", "use 2 chunks, as the PoSE paper")
        positions = PositionSpec(method, raw.target_length, chunks, raw.offset, raw.documents)
    return DataSpec(sources, packing.reset_positions, packing.document_mask, packing.pack_sft, packing.drop_last,
                    positions, parsed.num_sequences, parsed.shuffle)


# ---- identities for the cache ------------------------------------------------------------------------
def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of what determines the tokenizer's output: its serialized model, class and special tokens."""
    h = hashlib.sha256()
    h.update(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode())
    elif hasattr(tokenizer, "get_vocab"):
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    else:
        h.update(repr(tokenizer).encode())
    special = {k: str(getattr(tokenizer, k, None)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    h.update(json.dumps(special, sort_keys=True).encode())
    return h.hexdigest()


def source_fingerprint(path: str) -> str:
    """Path plus size and modification time of every file under it (content changes change the mtime)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise RopekitError(f"training data path '{path}' does not exist", "pass an existing file or directory, or 'builtin'")
    p = p.resolve()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    h = hashlib.sha256(str(p).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(p) if p.is_dir() else f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def _is_builtin(path: str) -> bool:
    return path.strip().lower() == "builtin"


def builtin_corpus_digest() -> str:
    """The digest of the built-in training split on this machine (:func:`ropekit.data.local_text.corpus_digest`):
    it is the running Python's standard library, so two Pythons give two corpora."""
    return _builtin_texts()[2]


def uses_builtin(spec: dict | None, seq_len: int) -> bool:
    """Whether the data spec ``spec`` (module doc) reads the built-in split."""
    return any(_is_builtin(source.path) for source in validate_data_spec(spec, seq_len).sources)


@functools.lru_cache(maxsize=1)
def _builtin_texts() -> tuple[list[str], str, str]:
    """The built-in training split as text, its label and its digest (which Python's standard library it is)."""
    from .local_text import corpus_digest, stdlib_documents

    docs = stdlib_documents(BUILTIN_MAX_BYTES, "train")
    return [d.decode("ascii", errors="replace") for d in docs], BUILTIN_LABEL, corpus_digest(docs)


# ---- loading a source (through the cache) ------------------------------------------------------------
@dataclass
class _Tokenized:
    """One source's token ids: documents (text) or pieces with labels (sft)."""

    label: str
    docs: list[torch.Tensor]
    labels: list[torch.Tensor] | None
    stats: dict = field(default_factory=dict)
    cache: str = "off"


def _flatten(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([t.numel() for t in tensors], dtype=torch.long)
    offsets = torch.zeros(len(tensors) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    flat = torch.cat(tensors) if tensors else torch.zeros(0, dtype=torch.int32)
    return flat.to(torch.int32), offsets


def _unflatten(flat: torch.Tensor, offsets: torch.Tensor) -> list[torch.Tensor]:
    return [flat[int(offsets[i]):int(offsets[i + 1])] for i in range(len(offsets) - 1)]


def _tokenize_texts(tokenizer, texts: list[str]) -> list[torch.Tensor]:
    out = []
    for start in range(0, len(texts), _TOKENIZE_BATCH):
        batch = tokenizer(texts[start:start + _TOKENIZE_BATCH], add_special_tokens=False, verbose=False)["input_ids"]
        out.extend(torch.tensor(ids, dtype=torch.int32) for ids in batch)
    return out


def _read_source(source: SourceSpec, tokenizer, seq_len: int) -> _Tokenized:
    if source.kind == "sft":
        from .sft import build_sft_examples, read_conversations

        conversations, label = read_conversations(source.path)
        if source.max_documents:
            conversations = conversations[: source.max_documents]
        examples, stats = build_sft_examples(tokenizer, conversations, seq_len, min_tokens=source.min_tokens)
        return _Tokenized(label, [torch.tensor(i, dtype=torch.int32) for i, _ in examples],
                          [torch.tensor(lab, dtype=torch.int32) for _, lab in examples], stats)
    if _is_builtin(source.path):
        texts, label, _ = _builtin_texts()
    else:
        from .corpora import read_texts

        texts, label = read_texts(source.path)
    if source.max_documents:
        texts = texts[: source.max_documents]
    docs = [d for d in _tokenize_texts(tokenizer, texts) if d.numel()]
    return _Tokenized(label, docs, None, {"documents": len(docs)})


def _cache_key(source: SourceSpec, tokenizer, seq_len: int) -> str:
    from .sft import chat_template_of

    identity = _builtin_texts()[2] if _is_builtin(source.path) else source_fingerprint(source.path)
    parts: dict[str, Any] = {
        "version": CACHE_VERSION, "kind": source.kind, "source": identity, "max_documents": source.max_documents,
        "tokenizer": tokenizer_fingerprint(tokenizer),
    }
    if source.kind == "sft":
        parts.update(template=chat_template_of(tokenizer)[0], seq_len=seq_len, min_tokens=source.min_tokens)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def load_source(source: SourceSpec, tokenizer, seq_len: int, cache_dir: str | None) -> _Tokenized:
    """A source's token ids, from ``cache_dir`` when an identical build stored them, else tokenised (and stored)."""
    if cache_dir is None:
        return _read_source(source, tokenizer, seq_len)
    path = Path(cache_dir).expanduser() / f"tokens-{_cache_key(source, tokenizer, seq_len)}.pt"
    if path.is_file():
        try:
            blob = torch.load(path, weights_only=True)
            docs = _unflatten(blob["ids"], blob["offsets"])
            labels = _unflatten(blob["labels"], blob["offsets"]) if blob["labels"] is not None else None
            return _Tokenized(blob["label"], docs, labels, json.loads(blob["stats"]), cache="hit")
        except (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError, EOFError,
                pickle.UnpicklingError):
            pass  # a truncated or foreign file: rebuilt below
    data = _read_source(source, tokenizer, seq_len)
    ids, offsets = _flatten(data.docs)
    labels = _flatten(data.labels)[0] if data.labels is not None else None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RopekitError(f"cannot create the cache directory '{path.parent}' ({e.strerror})",
                           "pass a writable cache_dir, or none") from None
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"version": CACHE_VERSION, "label": data.label, "ids": ids, "offsets": offsets, "labels": labels,
                "stats": json.dumps(data.stats)}, tmp)
    os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    data.cache = "miss"
    return data


# ---- the dataset -------------------------------------------------------------------------------------
def _allocate(counts: list[int], weights: list[float], total: int | None) -> list[int]:
    """Items per source: shares ``w/Σw`` of ``total`` (largest remainders), default the most without repeats."""
    shares = [w / sum(weights) for w in weights]
    if total is None:
        total = min(int(c / s + 1e-9) for c, s in zip(counts, shares))
    exact = [total * s for s in shares]
    alloc = [int(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - alloc[i]), i))
    for i in order[: total - sum(alloc)]:
        alloc[i] += 1
    return alloc


def _pick(count: int, wanted: int, rng: random.Random, shuffle: bool) -> list[int]:
    """``wanted`` row numbers out of ``count``: a (seeded) permutation, cycled with fresh orders if needed."""
    picked: list[int] = []
    while len(picked) < wanted:
        order = list(range(count))
        if shuffle:
            rng.shuffle(order)
        picked.extend(order[: wanted - len(picked)])
    return picked


class TrainingDataset(Dataset):
    """Fixed-length training items (module doc); ``summary`` describes what was built."""

    def __init__(self, spec: DataSpec, seq_len: int, seed: int, sources: list, index: list[tuple[int, int]],
                 summary: dict):
        self.spec = spec
        self.seq_len = seq_len
        self.seed = seed
        self.epoch = 0
        self._sources = sources
        self._index = index
        self.summary = summary

    @property
    def mode(self) -> str:
        """``"packed"``, ``"pose"`` or ``"randpos"``."""
        return self.spec.positions.method if self.spec.positions else "packed"

    @property
    def attention_mask_kind(self) -> str:
        """``"2d"`` (``[L]`` per item, 1 = token) or ``"document_4d"`` (bool ``[1, L, L]`` per item)."""
        return "document_4d" if self.spec.document_mask else "2d"

    def set_epoch(self, epoch: int) -> None:
        """PoSE/RandPos draw from ``(seed, epoch, index)``: call at every epoch start for fresh positions."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index < 0:
            index += len(self)
        source, row = self._index[index]
        rows = self._sources[source]
        positions = self.spec.positions
        if positions is None:
            return rows.row(row, reset_positions=self.spec.reset_positions, document_mask=self.spec.document_mask)
        doc = rows[row]
        g = pose_lib.item_generator(self.seed, self.epoch, index)
        L = self.seq_len
        if positions.method == "pose":
            sample = pose_lib.pose_sample(L, positions.target_length, n_chunks=positions.chunks, doc_length=doc.numel(),
                                          offset=positions.offset, generator=g)
            input_ids = doc[sample.content_index].long()
            position_ids = sample.position_ids
        else:
            start = pose_lib.randpos_content_start(doc.numel(), L, positions.offset, g)
            input_ids = doc[start:start + L].long()
            position_ids = pose_lib.randpos_positions(L, positions.target_length, g)
        return {"input_ids": input_ids, "labels": input_ids.clone(), "position_ids": position_ids,
                "attention_mask": pose_lib.attention_mask_for(L)}


def _tokens_digest(docs: list[torch.Tensor], labels: list | None = None) -> str:
    """A digest of a source's documents as tokenised, in order (and of their SFT labels)."""
    h = hashlib.sha256()
    for k, doc in enumerate(docs):
        h.update(doc.numel().to_bytes(8, "little"))
        h.update(doc.to(torch.int64).numpy().tobytes())
        if labels is not None:
            h.update(torch.as_tensor(labels[k]).to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:16]


def build_training_data(spec: dict | None, tokenizer, seq_len: int, seed: int,
                        cache_dir: str | None = None) -> TrainingDataset:
    """Build the training :class:`TrainingDataset` described by ``spec`` (module doc) for rows of ``seq_len``."""
    data_spec = validate_data_spec(spec, seq_len)
    if tokenizer is None:
        raise RopekitError("training data needs a tokenizer and this model has none",
                           "pass a model directory that includes tokenizer files")
    eos_id = getattr(tokenizer, "eos_token_id", None)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)
    positions = data_spec.positions
    built, counts, described = [], [], []
    for i, source in enumerate(data_spec.sources):
        data = load_source(source, tokenizer, seq_len, cache_dir)
        lengths = [d.numel() for d in data.docs]
        chosen = upsample_long(lengths, source.upsample_long, seed=hash_seed(seed, "upsample", i))
        if data_spec.shuffle:
            random.Random(hash_seed(seed, "documents", i)).shuffle(chosen)
        docs = [data.docs[k] for k in chosen]
        info = {"path": source.path, "label": data.label, "kind": source.kind, "weight": source.weight,
                "documents": len(data.docs), "documents_after_upsampling": len(docs),
                "tokens": int(sum(lengths)), "cache": data.cache, **{f"sft_{k}": v for k, v in data.stats.items()
                                                                     if source.kind == "sft"}}
        if _is_builtin(source.path):  # the stdlib differs between Python versions: say which one was read
            info["corpus_digest"] = builtin_corpus_digest()
        # what was read, token by token: a resumed run checks it trains on the same rows (a file edited since)
        info["tokens_digest"] = _tokens_digest(data.docs, data.labels if source.kind == "sft" else None)
        if source.kind == "sft":
            rows = PackedPieces([(d, data.labels[k]) for d, k in zip(docs, chosen)], seq_len, pad_id=pad_id,
                                pack=data_spec.pack_sft)
            count = len(rows)
        elif positions is None:
            rows = PackedStream(docs, seq_len, eos_id=eos_id, pad_id=pad_id, drop_last=data_spec.drop_last)
            count = len(rows)
        else:
            with_eos = [torch.cat([d, torch.tensor([eos_id], dtype=torch.int32)]) if eos_id is not None else d
                        for d in docs]
            if positions.documents == "whole":
                rows = [d for d in with_eos if d.numel() >= seq_len]
                short = len(with_eos) - len(rows)
                info["documents_too_short"] = short
                if short > MAX_SHORT_SHARE * len(with_eos):
                    # the source's weight would be served by a sliver of it, repeated: 8 of 2,400 documents,
                    # each seen dozens of times, is a different training run from the one the config describes
                    raise RopekitError(
                        f"source '{source.path}': {short} of {len(with_eos)} documents are shorter than the "
                        f"{seq_len}-token {positions.method} window, and {positions.method} with `documents: whole` "
                        "takes each example from one document",
                        f"set `documents: packed` under {positions.method} (windows of the joined text), lower "
                        "seq_len, or use longer documents")
            else:
                stream = PackedStream(with_eos, positions.target_length, eos_id=None, pad_id=pad_id, drop_last=True)
                rows = [stream.tokens[k * positions.target_length:(k + 1) * positions.target_length]
                        for k in range(len(stream))]
            count = len(rows)
        if count == 0:
            unit = (f"{positions.target_length}-token window" if positions is not None and positions.documents == "packed"
                    else f"document or row of {seq_len} tokens")
            raise RopekitError(f"source '{source.path}' yields no training {unit}",
                               "add more or longer text, or lower the sequence length")
        info["rows"] = count
        built.append(rows)
        counts.append(count)
        described.append(info)
    alloc = _allocate(counts, [s.weight for s in data_spec.sources], data_spec.num_sequences)
    index: list[tuple[int, int]] = []
    for i, (count, wanted) in enumerate(zip(counts, alloc)):
        rng = random.Random(hash_seed(seed, "rows", i))
        index.extend((i, r) for r in _pick(count, wanted, rng, data_spec.shuffle))
        described[i]["items"] = wanted
        described[i]["repeated"] = wanted > count
    if data_spec.shuffle:
        random.Random(hash_seed(seed, "order")).shuffle(index)
    summary = {
        "mode": positions.method if positions else "packed",
        "seq_len": seq_len,
        "items": len(index),
        "seed": seed,
        "reset_positions": data_spec.reset_positions,
        "document_mask": data_spec.document_mask,
        "attention_mask": "document_4d" if data_spec.document_mask else "2d",
        "separator_id": eos_id,
        "pad_id": pad_id,
        "positions": None if positions is None else {
            "method": positions.method, "target_length": positions.target_length, "offset": positions.offset,
            "documents": positions.documents, **({"chunks": positions.chunks} if positions.method == "pose" else {})},
        "sources": described,
    }
    return TrainingDataset(data_spec, seq_len, seed, built, index, summary)


def hash_seed(seed: int, *tags) -> int:
    """A 63-bit seed derived from ``seed`` and ``tags`` (independent streams for independent choices)."""
    text = ":".join(str(t) for t in (seed, *tags))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") & ((1 << 63) - 1)


__all__ = ["IGNORE_INDEX", "DataSpec", "TrainingDataset", "build_training_data", "load_source", "validate_data_spec"]
