"""Packing token documents into fixed-length training rows, and per-source length upsampling.

**Stream packing** (:class:`PackedStream`, the recipe of Fu et al. 2024 and of the LCEG controlled study,
LCEG (Lu et al. 2024) §7.9: "packed all sampled data into chunks of the training length, regardless of document
boundaries"): the documents, each followed by an end-of-text separator, are concatenated into one
stream that is cut into rows of ``seq_len`` tokens. A document may be split across two rows. The last,
partial row is dropped (``drop_last``) or padded.

**Whole packing** (:class:`PackedPieces`, for SFT conversations): pieces that must stay intact (a
conversation and its loss mask) are placed whole, in order, into the current row while they fit
("next fit"); the rest of a row is padding.

Row options, identical for both:

* ``reset_positions`` — position ids restart at 0 at every document start (a document cut by a row
  boundary restarts at 0 in the next row); otherwise they are ``0 … seq_len − 1``.
* ``document_mask`` — a token attends only to earlier tokens *of its own document*. The prediction of a
  document's first token from the previous document is then meaningless, so its label is −100. Padding
  forms a segment of its own (padding attends to padding only), so no query row is entirely masked —
  a fully masked softmax row is NaN in some attention kernels and torch versions.

**How the mask reaches transformers.** A row's ``attention_mask`` is either

* 1-D ``[L]`` of 1/0 (1 = real token, 0 = padding): transformers combines it with its causal mask. It is
  always present, even when all ones, because transformers 5.x otherwise *infers* packed sequences from
  jumps in the position ids (``masking_utils.find_packed_sequence_indices``) — which would silently
  turn ``reset_positions`` (or PoSE) into a block-diagonal mask; or
* with ``document_mask``: a boolean ``[1, L, L]`` (``True`` = the query row may attend the key column),
  i.e. ``[B, 1, L, L]`` once batched. transformers passes a 4-D mask to the attention kernel untouched,
  so it must be in the kernel's format: :func:`prepare_attention_mask` keeps it boolean for ``sdpa``,
  turns it into an additive float mask (0 / dtype minimum) for ``eager`` (a boolean there would be
  *added* as 0/1 — silently wrong), and for ``flash_attention_*`` drops it in favour of transformers'
  varlen packing from position ids (exact only if the row's positions restart at every document, which
  it checks). The CPU path (sdpa/eager) is exact: the tests compare every document's logits in a packed
  row with the logits of that document alone.

**Per-source length upsampling** (Fu et al. 2024, "per_source" mode of their ``slimpajama_packing.py``;
used for the LCEG data, LCEG (Lu et al. 2024) §7.9): *within* each source, documents of at least ``threshold`` tokens
are made ``factor`` times more frequent relative to shorter ones, so long documents gain weight while
the mixture *between* sources (their weights) is unchanged. Two ways, same long/short ratio:

* ``"downsample_short"`` — Fu et al.'s exact procedure: short documents are kept with probability
  ``1/factor`` (their 4096-token threshold and ratio 0.1 are ``threshold=4096, factor=10``); needs plenty
  of data;
* ``"repeat_long"`` — long documents are repeated ``factor`` times (a fractional part is a Bernoulli draw);
  for small corpora, where throwing text away hurts more than repeating it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import RopekitError

IGNORE_INDEX = -100
UPSAMPLE_MODES = ("downsample_short", "repeat_long")
_PAD_SEGMENT = -1


# ---- upsampling --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpsampleConfig:
    """Per-source length upsampling: documents of ≥ ``threshold`` tokens become ``factor`` × more frequent."""

    threshold: int
    factor: float
    mode: str = "downsample_short"

    def __post_init__(self):
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or self.threshold < 1:
            raise RopekitError(f"upsample_long.threshold {self.threshold!r} is not a positive integer",
                               "set it in tokens, e.g. threshold: 4096 (Fu et al.)")
        if isinstance(self.factor, bool) or not isinstance(self.factor, (int, float)) or not self.factor >= 1:
            raise RopekitError(f"upsample_long.factor {self.factor!r} is below 1",
                               "set a factor ≥ 1, e.g. factor: 10 (Fu et al. keep 1 short document in 10)")
        if self.mode not in UPSAMPLE_MODES:
            raise RopekitError(f"unknown upsample_long.mode '{self.mode}'", f"choose one of {', '.join(UPSAMPLE_MODES)}")


def upsample_long(lengths: Sequence[int], config: UpsampleConfig | None, seed: int) -> list[int]:
    """Indices of the documents to use (with repeats), in document order, after length upsampling.

    ``lengths`` are the documents' token counts. ``None`` keeps every document once.
    """
    if config is None:
        return list(range(len(lengths)))
    rng = random.Random(f"ropekit-upsample:{seed}")
    whole, frac = int(config.factor), config.factor - int(config.factor)
    chosen: list[int] = []
    for i, n in enumerate(lengths):
        long = n >= config.threshold
        if config.mode == "downsample_short":
            if long or rng.random() < 1.0 / config.factor:
                chosen.append(i)
        else:
            copies = 1
            if long:
                copies = whole + (1 if frac > 0 and rng.random() < frac else 0)
            chosen.extend([i] * copies)
    return chosen


# ---- rows --------------------------------------------------------------------------------------------
def _segment_starts(segment_ids: torch.Tensor) -> torch.Tensor:
    """Boolean ``[L]``: where a new segment begins (index 0 always does)."""
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[1:] = segment_ids[1:] != segment_ids[:-1]
    return starts


def reset_position_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    """Position ids ``[L]`` that restart at 0 at every segment start (segments are contiguous runs)."""
    idx = torch.arange(segment_ids.numel(), dtype=torch.long)
    starts = _segment_starts(segment_ids)
    # the start index of the run each token belongs to: a running maximum over start positions
    start_of = torch.where(starts, idx, torch.zeros_like(idx))
    start_of = torch.cummax(start_of, dim=0).values
    return idx - start_of


def document_attention_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Boolean ``[1, L, L]``: causal and same segment (padding, segment −1, is a segment of its own)."""
    n = segment_ids.numel()
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    same = segment_ids[:, None] == segment_ids[None, :]
    return (causal & same).unsqueeze(0)


def make_row(input_ids: torch.Tensor, labels: torch.Tensor, segment_ids: torch.Tensor, *,
             reset_positions: bool, document_mask: bool) -> dict[str, torch.Tensor]:
    """One training row from its tokens, labels and per-token segment (document) ids; −1 marks padding.

    Labels follow transformers' convention (``labels[t]`` is the target of the prediction made at
    ``t − 1``; the model shifts): with ``document_mask`` every segment's first token gets −100, since the
    token before it belongs to another document it may not see.
    """
    labels = labels.clone().long()
    labels[segment_ids == _PAD_SEGMENT] = IGNORE_INDEX
    if document_mask:
        starts = _segment_starts(segment_ids)
        starts[0] = False  # position 0's label is never used (nothing precedes it)
        labels[starts] = IGNORE_INDEX
    position_ids = reset_position_ids(segment_ids) if reset_positions else torch.arange(segment_ids.numel())
    if document_mask:
        attention_mask = document_attention_mask(segment_ids)
    else:
        attention_mask = (segment_ids != _PAD_SEGMENT).long()
    return {"input_ids": input_ids.long(), "labels": labels, "position_ids": position_ids.long(),
            "attention_mask": attention_mask}


def _check_seq_len(seq_len: int) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise RopekitError(f"sequence length {seq_len!r} is not an integer ≥ 2", "train on rows of at least 2 tokens")


class PackedStream:
    """Documents + separator concatenated and cut into ``seq_len``-token rows (see module doc).

    ``tokens`` (int32) and ``segments`` (int32, the document index of every token; the separator belongs
    to the document it ends) hold the whole stream; rows are built on demand by :meth:`row`.
    """

    def __init__(self, documents: Sequence[Sequence[int]] | Sequence[torch.Tensor], seq_len: int, *,
                 eos_id: int | None, pad_id: int = 0, drop_last: bool = True):
        _check_seq_len(seq_len)
        pieces, segs = [], []
        for i, doc in enumerate(documents):
            ids = torch.as_tensor(doc, dtype=torch.int32).reshape(-1)
            if eos_id is not None:
                ids = torch.cat([ids, torch.tensor([eos_id], dtype=torch.int32)])
            if ids.numel() == 0:
                continue
            pieces.append(ids)
            segs.append(torch.full((ids.numel(),), i, dtype=torch.int32))
        tokens = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int32)
        segments = torch.cat(segs) if segs else torch.zeros(0, dtype=torch.int32)
        full, rest = divmod(tokens.numel(), seq_len)
        if rest and not drop_last:
            pad = seq_len - rest
            tokens = torch.cat([tokens, torch.full((pad,), pad_id, dtype=torch.int32)])
            segments = torch.cat([segments, torch.full((pad,), _PAD_SEGMENT, dtype=torch.int32)])
            full += 1
        self.seq_len = seq_len
        self.num_rows = full
        self.tokens = tokens[: full * seq_len]
        self.segments = segments[: full * seq_len]

    def __len__(self) -> int:
        return self.num_rows

    def row(self, index: int, *, reset_positions: bool = False, document_mask: bool = False) -> dict[str, torch.Tensor]:
        """Row ``index`` as ``input_ids``, ``labels``, ``position_ids``, ``attention_mask`` (see :func:`make_row`)."""
        if not 0 <= index < self.num_rows:
            raise IndexError(index)
        sl = slice(index * self.seq_len, (index + 1) * self.seq_len)
        ids = self.tokens[sl].long()
        return make_row(ids, ids, self.segments[sl].long(), reset_positions=reset_positions, document_mask=document_mask)


class PackedPieces:
    """Whole pieces ``(input_ids, labels)`` placed next-fit into ``seq_len``-token rows, padded at the end.

    Every piece must fit in one row (split long conversations first, :mod:`ropekit.data.sft`).
    ``pack=False`` puts one piece per row (the rest is padding).
    """

    def __init__(self, pieces: Sequence[tuple[Sequence[int], Sequence[int]]], seq_len: int, *, pad_id: int,
                 pack: bool = True):
        _check_seq_len(seq_len)
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.pieces = [(torch.as_tensor(ids, dtype=torch.int32), torch.as_tensor(lab, dtype=torch.int32))
                       for ids, lab in pieces]
        self.rows: list[list[int]] = []
        used = seq_len
        for i, (ids, lab) in enumerate(self.pieces):
            if ids.numel() != lab.numel():
                raise ValueError(f"piece {i}: {ids.numel()} ids but {lab.numel()} labels")
            if ids.numel() > seq_len:
                raise RopekitError(f"a piece of {ids.numel()} tokens does not fit a row of {seq_len}",
                                   "split conversations to the training length before packing")
            if ids.numel() == 0:
                continue
            if not pack or used + ids.numel() > seq_len:
                self.rows.append([])
                used = 0
            self.rows[-1].append(i)
            used += ids.numel()

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, index: int, *, reset_positions: bool = False, document_mask: bool = False) -> dict[str, torch.Tensor]:
        """Row ``index`` (see :func:`make_row`); padding has label −100 and attention 0 (or its own segment)."""
        members = self.rows[index]
        ids = torch.full((self.seq_len,), self.pad_id, dtype=torch.long)
        labels = torch.full((self.seq_len,), IGNORE_INDEX, dtype=torch.long)
        segments = torch.full((self.seq_len,), _PAD_SEGMENT, dtype=torch.long)
        at = 0
        for k, piece in enumerate(members):
            p_ids, p_lab = self.pieces[piece]
            n = p_ids.numel()
            ids[at:at + n] = p_ids.long()
            labels[at:at + n] = p_lab.long()
            segments[at:at + n] = k
            at += n
        return make_row(ids, labels, segments, reset_positions=reset_positions, document_mask=document_mask)


# ---- handing the mask to a model ---------------------------------------------------------------------
def restarts_positions(position_ids: torch.Tensor) -> bool:
    """Whether some row's position ids go down (a new document restarting them); PoSE's skips only go up."""
    return bool((position_ids.diff(dim=-1) < 0).any())


def prepare_attention_mask(attention_mask: torch.Tensor, attn_implementation: str, dtype: torch.dtype = torch.float32,
                           position_ids: torch.Tensor | None = None) -> torch.Tensor | None:
    """The ``attention_mask`` to pass to a transformers model whose attention is ``attn_implementation``.

    A 2-D (padding) mask is returned as is; under ``flash_attention_*`` its row's positions must not restart
    (``reset_positions`` without ``document_mask`` is refused: flash would read each restart as a new document
    in a one-row unpadded batch only). A boolean 4-D document mask ``[B, 1, L, L]`` becomes: boolean
    for ``sdpa``; additive float in ``dtype`` (0 where allowed, ``finfo(dtype).min`` elsewhere) for
    ``eager`` and any other kernel that adds the mask to its scores; ``None`` for ``flash_attention_*``,
    which gets the documents as varlen kwargs over the flattened batch instead
    (:func:`ropekit.train.data.document_varlen_kwargs`, boundaries where ``position_ids`` restart at 0 — which
    must be the case, ``packing.reset_positions: true``, checked here from the mask itself).
    """
    impl = str(attn_implementation or "eager")
    if attention_mask.dim() != 4:
        if impl.startswith("flash_attention") and position_ids is not None and restarts_positions(position_ids):
            # transformers' flash path reads position ids that restart as packed documents (varlen, one block
            # per restart) when the batch is one unpadded row, and as one causal sequence otherwise: the
            # attention pattern would hang on batch size and padding, unlike sdpa/eager's causal row.
            raise RopekitError("position ids that restart inside a row (packing.reset_positions) without "
                               "packing.document_mask are read as separate documents by flash attention",
                               "set data.packing.document_mask: true, or use attn_implementation sdpa/eager")
        return attention_mask
    if attention_mask.dtype != torch.bool:
        raise RopekitError("the 4-D attention mask is not boolean", "pass the mask the training dataset produced")
    if impl == "sdpa":
        return attention_mask
    if impl.startswith("flash_attention"):
        if position_ids is None:
            raise RopekitError("flash attention needs position_ids to find document boundaries",
                               "pass the batch's position_ids along with its attention mask")
        # first key each query may see = the start of its document; positions must count from there
        first = attention_mask[:, 0].int().argmax(dim=-1)
        expected = torch.arange(attention_mask.shape[-1], device=attention_mask.device).unsqueeze(0) - first
        if not torch.equal(position_ids.to(device=expected.device, dtype=expected.dtype), expected):
            raise RopekitError("document masking with flash attention needs positions that restart at each document",
                               "set data.packing.reset_positions: true (or use attn_implementation sdpa/eager)")
        return None
    if impl == "flex_attention":
        raise RopekitError("a 4-D document mask cannot be passed to flex_attention as a tensor",
                           "train with attn_implementation sdpa or eager, or without data.packing.document_mask")
    additive = torch.zeros(attention_mask.shape, dtype=dtype)
    return additive.masked_fill(~attention_mask, torch.finfo(dtype).min)
