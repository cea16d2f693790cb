"""What the trainer needs from data: a dataset per stage, a deterministic order, sharding, and batches.

**Items.** The trainer takes any map-style dataset whose items are dicts of tensors: ``input_ids`` [L],
``labels`` [L] (same positions as ``input_ids``, −100 = no loss; the shift happens in the loss, as in
transformers), ``position_ids`` [L], and ``attention_mask``: [L] (1 = token, 0 = padding; always given, so
that position jumps are never read as packed sequences — docs/methods-reference.md §9) or a boolean [L, L] /
[1, L, L] / [1, 1, L, L] document mask (``True`` = may attend), batched to [B, 1, L, L] and converted for
the model's attention kernel by :func:`ropekit.data.packing.prepare_attention_mask`. The config's
``data:`` section is turned into such a dataset by ``ropekit.data.training_data.build_training_data``
(its module doc describes the section); :func:`packed_dataset` is a minimal builder for tests.

**Order, sharding and resume.** The samples of a stage are an endless stream made of one seeded
permutation of the dataset per epoch (permutation ``e`` from ``seed``, the stage index and ``e``). Global
optimizer step ``t`` of the stage (0-based) uses stream positions ``t·G … (t+1)·G − 1`` with
``G = micro_batch_size × grad_accum × processes``; process ``r`` takes the ``r``-th contiguous block of
``micro_batch_size × grad_accum`` of them and cuts it into ``grad_accum`` micro-batches. The data position
is therefore a pure function of the step: a resumed run reads exactly what the uninterrupted run read,
and 1 process × accumulation 2 sees the same global batch as 2 processes × accumulation 1.

Datasets whose items depend on the epoch (fresh PoSE skips each pass) expose ``set_epoch(e)``; the
loader calls it before the first item of each epoch. With ``num_workers > 0`` the workers hold their own
copies of the dataset, so the epoch travels with each index instead (:class:`_EpochIndexed`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..errors import RopekitError

_SEED_MIX = 0x9E3779B97F4A7C15


def _stream_seed(seed: int, stage: int, epoch: int) -> int:
    # A fixed mixing of the three integers: different stages/epochs get unrelated permutations.
    x = (seed * 1_000_003 + stage) * 1_000_033 + epoch
    return (x * _SEED_MIX) % (2**63 - 1)


class SampleOrder:
    """Stream position → dataset index: a seeded permutation per epoch (identity order without ``shuffle``)."""

    def __init__(self, size: int, seed: int, stage: int = 0, shuffle: bool = True):
        if size < 1:
            raise RopekitError("the training data is empty", "check data.sources (and that documents are long enough for data.seq_len)")
        self.size, self.seed, self.stage, self.shuffle = size, seed, stage, shuffle
        self._cache: dict[int, torch.Tensor] = {}

    def permutation(self, epoch: int) -> torch.Tensor:
        if epoch not in self._cache:
            if len(self._cache) > 2:
                self._cache.clear()
            if self.shuffle:
                gen = torch.Generator().manual_seed(_stream_seed(self.seed, self.stage, epoch))
                self._cache[epoch] = torch.randperm(self.size, generator=gen)
            else:
                self._cache[epoch] = torch.arange(self.size)
        return self._cache[epoch]

    def at(self, position: int) -> tuple[int, int]:
        """``(epoch, dataset index)`` of stream ``position``."""
        epoch, offset = divmod(position, self.size)
        return epoch, int(self.permutation(epoch)[offset])


def step_positions(step: int, micro_batch_size: int, grad_accum: int, processes: int, rank: int) -> list[list[int]]:
    """Stream positions of the ``grad_accum`` micro-batches of process ``rank`` at 0-based stage step ``step``."""
    per_process = micro_batch_size * grad_accum
    first = step * per_process * processes + rank * per_process
    return [list(range(first + j * micro_batch_size, first + (j + 1) * micro_batch_size)) for j in range(grad_accum)]


class _EpochIndexed(torch.utils.data.Dataset):
    """Wraps a dataset with ``set_epoch`` so that items can be fetched as ``(epoch, index)`` in any process."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.epoch = None

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        epoch, index = key
        if epoch != self.epoch:
            self.dataset.set_epoch(epoch)
            self.epoch = epoch
        return self.dataset[index]


class _StepBatches(torch.utils.data.Sampler):
    def __init__(self, order: SampleOrder, start_step: int, steps: int, micro_batch_size: int, grad_accum: int,
                 processes: int, rank: int, with_epoch: bool):
        self.order, self.start_step, self.steps = order, start_step, steps
        self.mbs, self.accum, self.processes, self.rank = micro_batch_size, grad_accum, processes, rank
        self.with_epoch = with_epoch

    def __len__(self):
        return (self.steps - self.start_step) * self.accum

    def __iter__(self) -> Iterator[list]:
        for step in range(self.start_step, self.steps):
            for positions in step_positions(step, self.mbs, self.accum, self.processes, self.rank):
                keys = [self.order.at(p) for p in positions]
                yield keys if self.with_epoch else [index for _, index in keys]


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack items into a batch; 1-D attention masks stay 2-D ``[B, L]``, square ones become ``[B, 1, L, L]``."""
    if not items:
        raise ValueError("empty batch")
    required = ("input_ids", "labels", "position_ids", "attention_mask")
    for key in required:
        if key not in items[0]:
            raise RopekitError(f"training items have no '{key}'", "the dataset must yield input_ids, labels, position_ids and attention_mask")
    batch = {key: torch.stack([it[key] for it in items]) for key in ("input_ids", "labels", "position_ids")}
    masks = [it["attention_mask"] for it in items]
    length = batch["input_ids"].shape[1]
    if masks[0].dim() == 1:
        batch["attention_mask"] = torch.stack(masks)
    else:
        batch["attention_mask"] = torch.stack([m.reshape(length, length) for m in masks])[:, None]
    return batch


def make_loader(dataset, order: SampleOrder, *, start_step: int, steps: int, micro_batch_size: int, grad_accum: int,
                processes: int, rank: int, num_workers: int = 0, pin_memory: bool = False):
    """A DataLoader over this process's micro-batches for stage steps ``start_step … steps − 1``."""
    with_epoch = hasattr(dataset, "set_epoch")
    source = _EpochIndexed(dataset) if with_epoch else dataset
    sampler = _StepBatches(order, start_step, steps, micro_batch_size, grad_accum, processes, rank, with_epoch)
    # Its own generator: creating the loader's iterator draws a base seed, which from the global RNG would shift
    # every later dropout mask of a resumed run (created again after the RNG state is restored) against the
    # uninterrupted run's (created once). The items themselves are functions of the step, not of worker seeds.
    generator = torch.Generator().manual_seed(_stream_seed(order.seed, order.stage, 0))
    return torch.utils.data.DataLoader(
        source, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers, pin_memory=pin_memory,
        persistent_workers=False, generator=generator,
    )


# ---- building datasets ----------------------------------------------------------------------------------
class PackedDataset(torch.utils.data.Dataset):
    """Fixed-length sequences cut from one token stream (plain causal LM items; the last partial one dropped)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
        self.seq_len = int(seq_len)
        self.count = tokens.numel() // self.seq_len
        self.tokens = tokens[: self.count * self.seq_len].view(self.count, self.seq_len)
        self._positions = torch.arange(self.seq_len)
        self._ones = torch.ones(self.seq_len, dtype=torch.long)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.tokens[index]
        return {"input_ids": ids, "labels": ids.clone(), "position_ids": self._positions, "attention_mask": self._ones}


def packed_dataset(documents: list[bytes] | list[list[int]], seq_len: int, separator: int = 0) -> PackedDataset:
    """Documents (byte strings = byte-token ids, or id lists) joined with ``separator`` and cut into ``seq_len``."""
    stream: list[int] = []
    for doc in documents:
        stream.extend(doc)
        stream.append(separator)
    return PackedDataset(torch.tensor(stream, dtype=torch.long), seq_len)


def data_spec(spec: dict[str, Any], shuffle: bool) -> dict[str, Any] | None:
    """The spec handed to the data builder: ``None`` (the built-in corpus) when the section names no source;
    the trainer's ``shuffle`` is shared with the builder (document and row order)."""
    if not spec:
        return None if shuffle else {"sources": [{"path": "builtin"}], "shuffle": False}
    return {**spec, "shuffle": shuffle}


def build_dataset(spec: dict[str, Any], tokenizer, seq_len: int, seed: int, cache_dir: str | None, shuffle: bool = True):
    """The dataset of a ``data:`` section, from :func:`ropekit.data.training_data.build_training_data`."""
    from ..data.training_data import build_training_data

    return build_training_data(data_spec(spec, shuffle), tokenizer, seq_len, seed, cache_dir)


def require_local_sources(cfg, where: str = "") -> None:
    """A data source path of ``cfg`` (a :class:`~ropekit.train.config.TrainConfig`) that does not exist, in one line
    (prefixed by ``where``) before anything is written or loaded."""
    from ..data.corpora import unreadable_corpus
    from ..data.training_data import validate_data_spec

    for i, stage in enumerate(cfg.stages):
        for source in validate_data_spec(data_spec(stage.data.spec, stage.data.shuffle), stage.seq_len).sources:
            if source.path.strip().lower() == "builtin":
                continue
            at = f"stages[{i}] ({stage.name}): " if cfg.curriculum else ""
            if why := unreadable_corpus(source.path, builtins=False):
                raise RopekitError(f"{where}{at}data source '{source.path}' {why}",
                                   "pass a file or directory that holds the training text, or 'builtin'")


def validate_spec(spec: dict[str, Any], seq_len: int, shuffle: bool = True) -> None:
    """Check a ``data:`` section for ``seq_len`` without reading any data (one-line errors)."""
    from ..data.training_data import validate_data_spec

    validate_data_spec(data_spec(spec, shuffle), seq_len)


def model_attention_mask(mask: torch.Tensor, model, dtype: torch.dtype, position_ids: torch.Tensor) -> torch.Tensor | None:
    """A batch's attention mask in the form the model's attention kernel takes (4-D document masks differ
    per kernel: :func:`ropekit.data.packing.prepare_attention_mask`); 2-D masks pass unchanged (flash kernels
    refuse positions that restart under one)."""
    from ..adapters.transformers import attn_implementation
    from ..attention.interface import kernel_of
    from ..data.packing import prepare_attention_mask

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    kernel = kernel_of(attn_implementation(config))
    return prepare_attention_mask(mask, kernel, dtype=dtype, position_ids=position_ids)


def document_varlen_kwargs(mask: torch.Tensor, model, position_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The varlen kwargs (``cu_seq_lens_q/k``, ``max_length_q/k``) that carry a 4-D document mask to a flash kernel,
    which gets no mask (:func:`model_attention_mask`): the boundaries of the documents of every row, the batch
    flattened, as transformers' flash path reads them for any batch size. Without them transformers finds documents
    only in a batch of one row (``_is_packed_sequence``), and the rows of a larger micro-batch attended across
    their documents. ``{}`` for any other kernel or mask."""
    from ..adapters.transformers import attn_implementation, packed_sequence_kwargs
    from ..attention.interface import kernel_of

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if mask.dim() != 4 or not kernel_of(attn_implementation(config)).startswith("flash_attention"):
        return {}
    # every row starts a document at position 0 (reset positions, checked with the mask), so the flattened
    # positions restart exactly at the documents' starts
    return packed_sequence_kwargs(position_ids.reshape(1, -1), 1, always=True) or {}
