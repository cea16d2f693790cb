"""The training dataset: the one entry point the trainer calls, :func:`build_training_data`.

``spec`` is the ``data:`` section of a training YAML::

    data:
      sources:                       # one or more; required
        - path: builtin              # or a .txt/.jsonl/.parquet file, a directory, a saved datasets dir
          kind: text                 # text (default) | sft (conversations, see ropekit.data.sft)
          weight: 1.0                # share of the training rows, relative to the other sources
          max_documents: null        # use only the first N documents / conversations
          upsample_long: null        # or {threshold: 4096, factor: 10, mode: downsample_short|repeat_long}
          min_tokens: 0              # sft only: drop shorter conversations (paper 001 §4.1: 10,000 at 16k)
      packing:
        reset_positions: false       # position ids restart at each document
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
Fu et al.) and SFT sources are packed whole (:mod:`ropekit.data.packing`). With ``pose`` (paper 003) or
``randpos``, every item is one *document* (``documents: whole``, the paper's setup: documents shorter
than ``seq_len`` are dropped) or one ``target_length`` window of the EOS-joined stream (``documents:
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

import hashlib
import json
import os
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

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
_TOP_KEYS = ("sources", "packing", "pose", "randpos", "num_sequences", "shuffle")
_SOURCE_KEYS = ("path", "kind", "weight", "max_documents", "upsample_long", "min_tokens")
_PACKING_KEYS = ("reset_positions", "document_mask", "pack_sft", "drop_last")
_POSE_KEYS = ("target_length", "chunks", "offset", "documents")
_RANDPOS_KEYS = ("target_length", "offset", "documents")
_UPSAMPLE_KEYS = ("threshold", "factor", "mode")
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


def _where(path: str) -> str:
    return f"data.{path}"


def _mapping(value, where: str, allowed: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise RopekitError(f"{_where(where)} is a {type(value).__name__}, not a mapping",
                           f"write it as a mapping with keys {', '.join(allowed)}")
    unknown = sorted(set(map(str, value)) - set(allowed))
    if unknown:
        raise RopekitError(f"unknown key '{unknown[0]}' in {_where(where)}", f"use only {', '.join(allowed)}")
    return value


def _bool(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise RopekitError(f"{_where(where)} is {value!r}, not true/false", f"set {_where(where)}: true or false")
    return value


def _int(value, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RopekitError(f"{_where(where)} is {value!r}, not an integer ≥ {minimum}",
                           f"set {_where(where)} to an integer ≥ {minimum}")
    return value


def _choice(value, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise RopekitError(f"{_where(where)} is {value!r}", f"choose one of {', '.join(choices)}")
    return value


def validate_data_spec(spec: dict | None, seq_len: int) -> DataSpec:
    """Check the ``data:`` section (module doc) against ``seq_len`` and return it normalised."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise RopekitError(f"sequence length {seq_len!r} is not an integer ≥ 2", "train on sequences of at least 2 tokens")
    if spec is None:
        spec = {"sources": [{"path": "builtin"}]}
    spec = _mapping(spec, "(section)", _TOP_KEYS)
    raw_sources = spec.get("sources")
    if not isinstance(raw_sources, list) or not raw_sources:
        raise RopekitError("data.sources is missing or empty", "list at least one source, e.g. sources: [{path: builtin}]")
    sources = []
    for i, raw in enumerate(raw_sources):
        where = f"sources[{i}]"
        raw = _mapping(raw, where, _SOURCE_KEYS)
        path = raw.get("path")
        if not isinstance(path, str) or not path.strip():
            raise RopekitError(f"{_where(where)}.path is missing", "give every source a path (or 'builtin')")
        kind = _choice(raw.get("kind", "text"), f"{where}.kind", KINDS)
        weight = raw.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise RopekitError(f"{_where(where)}.weight is {weight!r}, not a positive number", "set a weight > 0, e.g. 1.0")
        max_docs = raw.get("max_documents")
        if max_docs is not None:
            max_docs = _int(max_docs, f"{where}.max_documents", 1)
        up = raw.get("upsample_long")
        if up is not None:
            up = _mapping(up, f"{where}.upsample_long", _UPSAMPLE_KEYS)
            if "threshold" not in up or "factor" not in up:
                raise RopekitError(f"{_where(where)}.upsample_long needs threshold and factor",
                                   "e.g. upsample_long: {threshold: 4096, factor: 10}")
            up = UpsampleConfig(up["threshold"], up["factor"], up.get("mode", "downsample_short"))
        min_tokens = _int(raw.get("min_tokens", 0), f"{where}.min_tokens", 0)
        if kind == "text" and min_tokens:
            raise RopekitError(f"{_where(where)}.min_tokens applies to sft sources only",
                               "remove it, or use upsample_long to favour long documents")
        if kind == "sft" and path.strip().lower() == "builtin":
            raise RopekitError(f"{_where(where)}: the built-in corpus is text, not conversations",
                               "give an sft source a .jsonl file of conversations")
        sources.append(SourceSpec(path, kind, float(weight), max_docs, up, min_tokens))
    packing = _mapping({} if spec.get("packing") is None else spec["packing"], "packing", _PACKING_KEYS)
    reset = _bool(packing.get("reset_positions", False), "packing.reset_positions")
    doc_mask = _bool(packing.get("document_mask", False), "packing.document_mask")
    pack_sft = _bool(packing.get("pack_sft", True), "packing.pack_sft")
    drop_last = _bool(packing.get("drop_last", True), "packing.drop_last")
    positions = None
    if spec.get("pose") is not None and spec.get("randpos") is not None:
        raise RopekitError("data.pose and data.randpos are both set", "choose one way to simulate long positions")
    for method, keys in (("pose", _POSE_KEYS), ("randpos", _RANDPOS_KEYS)):
        raw = spec.get(method)
        if raw is None:
            continue
        raw = _mapping(raw, method, keys)
        if "target_length" not in raw:
            raise RopekitError(f"data.{method}.target_length is missing", "set the context length to simulate, e.g. 1024")
        target = _int(raw["target_length"], f"{method}.target_length", seq_len + 1)
        chunks = 2
        if method == "pose":
            chunks = _int(raw.get("chunks", 2), "pose.chunks", 1)
            if chunks > seq_len:
                raise RopekitError(f"data.pose.chunks {chunks} exceeds the sequence length {seq_len}",
                                   "use 2 chunks, as the PoSE paper")
        modes = pose_lib.OFFSET_MODES if method == "pose" else pose_lib.RANDPOS_OFFSET_MODES
        offset = _choice(raw.get("offset", "uniform"), f"{method}.offset", modes)
        documents = _choice(raw.get("documents", "whole"), f"{method}.documents", DOCUMENT_MODES)
        if reset or doc_mask:
            raise RopekitError(f"data.{method} cannot be combined with packing.reset_positions/document_mask",
                               f"{method} sets the position ids itself; turn those packing options off")
        if any(s.kind == "sft" for s in sources):
            raise RopekitError(f"data.{method} applies to text sources only", "remove the sft sources, or the position method")
        positions = PositionSpec(method, target, chunks, offset, documents)
    num = spec.get("num_sequences")
    if num is not None:
        num = _int(num, "num_sequences", 1)
    shuffle = _bool(spec.get("shuffle", True), "shuffle")
    return DataSpec(tuple(sources), reset, doc_mask, pack_sft, drop_last, positions, num, shuffle)


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


def _builtin_texts() -> tuple[list[str], str, str]:
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
                info["documents_too_short"] = len(with_eos) - len(rows)
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
