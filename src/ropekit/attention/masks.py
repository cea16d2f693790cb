"""One reader for every attention-mask format transformers hands an attention function, and the positions
of the queries and keys it covers.

An attention function gets ``query`` (B, H, Lq, D) and ``key`` (B, H_kv, Lk, D), the keys including the
KV cache, and a mask in the format of the kernel the model was set up for (``masking_utils`` of
transformers 5.x):

* ``None`` — plain causal attention with the queries as the last ``Lq`` of the ``Lk`` keys (bottom-right
  aligned): query row ``r`` is key ``r + Lk − Lq`` and sees keys ``0 … r + Lk − Lq``. This is what the
  flash kernels do with no mask and what sdpa's ``is_causal`` means for ``Lq = Lk`` and ``Lq = 1``.
  (transformers also passes ``None`` to sdpa for the first prefill of a *static* cache, ``1 < Lq < Lk``, where
  ``is_causal`` is top-left aligned: :func:`without_unwritten_keys` cuts a static cache's unwritten slots off
  before any method reads the keys, so that the keys end at the last query here too.)
* 2-D ``(B, L)`` padding masks (flash kernels: ``flash_attention_mask``), 1/True = real token, causality
  left to the kernel. ``L`` is ``Lk`` for a dynamic cache; a longer mask is cut from the right (what
  ``flash_attention_mask`` does for sliding and chunked caches); a shorter one (a static cache) leaves the
  keys past its end unwritten, so they are masked (transformers' ``_upad_input`` drops them).
* 4-D boolean ``(B|1, 1|H, Lq, Lk')`` masks (sdpa: ``sdpa_mask``), True = attend, causality included;
  ``Lk' ≥ Lk`` is cut to the first ``Lk`` keys as ``sdpa_attention_forward`` does.
* 4-D additive float masks (eager: ``eager_mask``): 0 = attend, dtype-min or −∞ = masked. Any other bias
  is refused: it is not a yes/no mask.
* flex-attention ``BlockMask`` (``flex_attention_mask``): key ``k`` is visible to query ``q`` when its
  ``(q, k)`` block is a *full* block, or a *partial* block whose ``mask_mod(b, h, q, k)`` is True — the rule
  ``flex_attention`` applies. ``mask_mod`` is evaluated on broadcast index grids (``b`` (B,1,1,1), ``h``
  (1,H,1,1), ``q`` (1,1,Q,1), ``k`` (1,1,1,K)), the way transformers' own ``sdpa_mask`` evaluates the same
  functions; the offsets of a KV cache are inside ``mask_mod`` (``add_offsets_to_mask_function``) and the
  padding is ``padding_mask[b, k]``. A ``mask_mod`` that cannot be evaluated that way, one that differs
  between heads, or a block mask sized for other lengths is refused in one line.

:class:`AttentionMask` turns any of them into blocks of "may attend" booleans ``(B|1, 1, rows, keys)``
without materialising an ``Lq × Lk`` matrix the format does not already hold.
"""

from __future__ import annotations

import weakref

import torch

from ..errors import RopekitError
from .kernels import tensor_version

try:  # flex attention is optional in torch builds
    from torch.nn.attention.flex_attention import BlockMask
except ImportError:  # pragma: no cover - torch without flex attention
    BlockMask = None

#: Rows of a flex mask evaluated at once when reducing over all queries: rows × keys × batch booleans.
REDUCE_ELEMENTS = 1 << 22

_ALTERNATIVE = "load the model with the sdpa or eager attention implementation"


def key_positions(position_ids: torch.Tensor, key_length: int) -> torch.Tensor:
    """Positions of the ``key_length`` keys attended to by queries at ``position_ids`` (batch, q_len).

    Without a cache the keys are the queries' own tokens. With a (dynamic) KV cache the cached keys are
    the consecutive positions that end at the last query — what ``generate`` and chunked prefill produce.
    Keys of left padding get meaningless positions, but the mask hides them.
    """
    if position_ids.shape[-1] == key_length:
        return position_ids
    last = position_ids[:, -1:]
    offsets = torch.arange(key_length - 1, -1, -1, device=position_ids.device, dtype=position_ids.dtype)
    return last - offsets


def query_key_positions(position_ids: torch.Tensor | None, q_len: int, k_len: int,
                        device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_pos (B|1, Lq), k_pos (B|1, Lk))`` as int64: ``position_ids`` (or the last ``Lq`` of ``0 … Lk−1``
    when transformers passed none) and :func:`key_positions`."""
    if position_ids is None:
        position_ids = torch.arange(k_len - q_len, k_len, device=device)[None]
    q_pos = position_ids.to(device=device, dtype=torch.long)
    return q_pos, key_positions(q_pos, k_len)


#: The last answer of :func:`written_keys` — ``(weak reference to the mask, its version, Lq, Lk, answer)`` — so
#: that the layers of one forward, which share the mask, read it once (one host sync per forward, not per layer).
_WRITTEN: list = [None]


def written_keys(attention_mask, q_len: int, k_len: int, kernel: str) -> int:
    """How many of the ``k_len`` keys hold tokens: fewer than ``k_len`` only with a *static* KV cache.

    A static cache hands the attention function all its ``max_cache_len`` slots, the unwritten ones masked; the
    rest of ropekit reads the keys as ending at the last query (:func:`key_positions`), which only the written
    ones do. Read from the mask as transformers builds it for each kernel:

    * sdpa without a mask and ``1 < Lq < Lk``: the first prefill of a static cache, where sdpa's ``is_causal``
      is top-left aligned (transformers' ``_ignore_causal_mask_sdpa``): the queries are the first ``Lq`` slots.
      (With a dynamic cache sdpa gets no mask only for ``Lq = Lk`` or ``Lq = 1``; the flash kernels' ``None``
      is bottom-right aligned and means nothing is padded.)
    * a 2-D padding mask shorter than ``Lk`` (flash kernels, ``flash_attention_mask``): its length.
    * a 4-D mask (sdpa, eager): one past the last key the last query may see (that query is the newest token;
      a left-padded batch ends every row with a real one).
    * a flex ``BlockMask``: the same, read through :class:`AttentionMask`.

    Under ``torch.compile`` nothing is read (``k_len``): a data-dependent length would break the graph.
    """
    if k_len <= q_len or torch.compiler.is_compiling():
        return k_len
    if attention_mask is None:
        return q_len if kernel == "sdpa" and q_len > 1 else k_len
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        return min(k_len, attention_mask.shape[-1])
    memo = _WRITTEN[0]
    if (memo is not None and memo[0]() is attention_mask and memo[1:4] == (tensor_version(attention_mask), q_len, k_len)):
        return memo[4]
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
        last = attention_mask[..., -1, :k_len]
        seen = last if last.dtype == torch.bool else last > torch.finfo(last.dtype).min / 2
    elif BlockMask is not None and isinstance(attention_mask, BlockMask):
        mask = AttentionMask(attention_mask, q_len, k_len, batch=1, device=attention_mask.kv_num_blocks.device)
        seen = mask.rows(torch.tensor([q_len - 1]))
    else:
        return k_len  # a format AttentionMask refuses in one line later
    seen = seen.reshape(-1, seen.shape[-1]).any(dim=0)
    written = int(torch.where(seen, torch.arange(1, k_len + 1, device=seen.device), 0).max())
    answer = written if written > 0 else k_len  # no key seen at all: nothing to read from it
    try:
        _WRITTEN[0] = (weakref.ref(attention_mask), tensor_version(attention_mask), q_len, k_len, answer)
    except TypeError:
        pass
    return answer


def counts_left_padding(attention_mask, position_ids, q_len: int, k_len: int) -> bool:
    """Whether a left-padded row of this (uncached) forward numbers its positions from the padding: its first real
    token at position = its column, as when a model is called with a padding mask and no ``position_ids``
    (transformers then counts from column 0). Plain RoPE does not care (only differences of positions enter a
    logit); Self-Extend's ``⌊i/G⌋``, LM-Infinite's first ``G`` positions and Dual Chunk's chunk boundaries do.
    ``generate`` passes ``cumsum(mask) − 1``: its rows start at 0 and are not flagged."""
    if position_ids is None or attention_mask is None or q_len != k_len or torch.compiler.is_compiling():
        return False
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        real = attention_mask[:, -k_len:].bool()
    elif isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
        allowed = attention_mask[..., :k_len]
        if allowed.dtype != torch.bool:
            allowed = allowed > torch.finfo(allowed.dtype).min / 2
        real = allowed.any(dim=-2).any(dim=1)  # (B, Lk): keys some query sees
    else:
        return False  # flex: not read for this (a padding mask is read the same way by its mask_mod)
    first = real.to(torch.int32).argmax(dim=-1)  # the first real column of each row
    padded = (first > 0) & real.any(dim=-1)
    positions = position_ids.to(first.device).expand(real.shape[0], -1)
    return bool((padded & (positions.gather(1, first[:, None])[:, 0] == first)).any())


def without_unwritten_keys(key: torch.Tensor, value: torch.Tensor, attention_mask, q_len: int, kernel: str):
    """``(key, value, attention_mask)`` cut to the written keys of a static KV cache (:func:`written_keys`); the
    same objects otherwise. A flex ``BlockMask`` cannot be cut: a static cache with flex attention is refused."""
    k_len = key.shape[2]
    written = written_keys(attention_mask, q_len, k_len, kernel)
    if written == k_len:
        return key, value, attention_mask
    if BlockMask is not None and isinstance(attention_mask, BlockMask):
        raise RopekitError("ropekit's attention methods cannot use a static KV cache with flex_attention",
                           "use the default dynamic cache, or load the model with the sdpa or eager attention")
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
        attention_mask = attention_mask[..., :written]
    return key[:, :, :written], value[:, :, :written], attention_mask


def _blocks_dense(num_blocks: torch.Tensor, indices: torch.Tensor, columns: int) -> torch.Tensor:
    """A BlockMask's ordered block lists ``(…, rows)`` / ``(…, rows, slots)`` as dense booleans ``(…, rows, columns)``."""
    width = max(columns, indices.shape[-1])
    listed = torch.arange(indices.shape[-1], device=indices.device) < num_blocks[..., None]
    dense = torch.zeros(*indices.shape[:-1], width + 1, dtype=torch.bool, device=indices.device)
    dense.scatter_(-1, torch.where(listed, indices.long(), width), True)  # unlisted slots land in the spare column
    return dense[..., :columns]


def _same_over_heads(x: torch.Tensor, what: str) -> torch.Tensor:
    """``x`` (B, H, …) with ``H`` > 1 reduced to head 0 when every head agrees; else a one-line refusal."""
    if x.shape[1] > 1:
        if not bool((x == x[:, :1]).all()):
            raise RopekitError(f"ropekit's attention methods got {what} that differs between heads",
                               _ALTERNATIVE)
        x = x[:, :1]
    return x


def packed_documents(kwargs: dict, batch: int, length: int, device) -> torch.Tensor | None:
    """The document of each token, ``(batch, length)``, of packed rows given no mask, from the boundaries
    ``cu_seq_lens_k`` a flash kernel's call carries over the flattened batch (given by the caller — the trainer's
    document masks, DataCollatorWithFlattening — or found by ropekit's attention wrapper from restarting
    ``position_ids`` as transformers' flash kernels do: :func:`ropekit.adapters.transformers.packed_sequence_kwargs`).
    None for one document per row."""
    bounds = kwargs.get("cu_seq_lens_k")
    if not isinstance(bounds, torch.Tensor) or bounds.numel() <= 2:
        return None
    total = batch * length
    starts = torch.zeros(total, dtype=torch.long, device=device)
    inner = bounds.to(device=device, dtype=torch.long)[1:-1].clamp(0, total - 1)
    return starts.index_fill(0, inner, 1).cumsum(0).view(batch, length)


class AttentionMask:
    """transformers' attention mask, in any kernel's format, read as "query ``r`` may attend to key ``k``".

    ``batch`` and ``heads`` are the query's (the flex ``mask_mod`` is evaluated for them); ``sliding_window``
    is the window a flash kernel applies itself (``i − j < window``), added to the formats that do not
    carry it (``None`` and 2-D). Results have the batch dimension ``self.batch`` (1 when the mask is the same
    for every row of the batch).
    """

    def __init__(self, attention_mask, q_len: int, k_len: int, *, batch: int = 1, heads: int = 1,
                 sliding_window: int | None = None, device=None):
        self.q_len, self.k_len = int(q_len), int(k_len)
        self.offset = self.k_len - self.q_len  # key index of query row r is r + offset
        self.window = int(sliding_window) if sliding_window else None
        self._padding = self._dense = self._flex = self._documents = None
        self._seen = self._active = None
        if device is None:
            device = attention_mask.device if isinstance(attention_mask, torch.Tensor) else "cpu"
        self.device = torch.device(device)

        if attention_mask is None:
            self.kind, self.batch = "causal", 1
        elif BlockMask is not None and isinstance(attention_mask, BlockMask):
            self.kind = "flex"
            self._read_flex(attention_mask, int(batch), int(heads))
        elif isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
            self.kind = "padding"
            self._read_padding(attention_mask)
        elif isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
            self.kind = "dense"
            self._read_dense(attention_mask)
        else:
            raise RopekitError(f"ropekit's attention methods cannot read a {type(attention_mask).__name__} "
                               f"attention mask of shape {tuple(getattr(attention_mask, 'shape', ()))}", _ALTERNATIVE)

    @classmethod
    def for_call(cls, attention_mask, query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> AttentionMask:
        """The mask of one attention-function call (an :class:`AttentionMask` already built for it passes)."""
        q_len, k_len = query.shape[2], key.shape[2]
        if isinstance(attention_mask, AttentionMask):
            if (attention_mask.q_len, attention_mask.k_len) != (q_len, k_len):
                raise ValueError(f"mask for {attention_mask.q_len}×{attention_mask.k_len} used on {q_len}×{k_len}")
            return attention_mask
        mask = cls(attention_mask, q_len, k_len, batch=query.shape[0], heads=query.shape[1],
                   sliding_window=kwargs.get("sliding_window"), device=query.device)
        if attention_mask is None and q_len == k_len:
            documents = packed_documents(kwargs, query.shape[0], k_len, query.device)
            if documents is not None:
                mask.kind, mask._documents, mask.batch = "packed", documents, documents.shape[0]
        return mask

    # ---- reading the formats ----------------------------------------------------------------------------
    def _read_padding(self, mask: torch.Tensor) -> None:
        real = mask.to(device=self.device).bool()
        if real.shape[-1] >= self.k_len:
            real = real[:, real.shape[-1] - self.k_len:]
        else:  # static cache: slots past the mask were never written
            real = torch.cat([real, real.new_zeros(real.shape[0], self.k_len - real.shape[-1])], dim=-1)
        self.batch = real.shape[0]
        if bool(real.all()):  # nothing padded: the plain causal mask (flash_attention_mask passes None then)
            self.kind, self.batch = "causal", 1
        else:
            self._padding = real

    def _read_dense(self, mask: torch.Tensor) -> None:
        if mask.shape[-1] < self.k_len or mask.shape[-2] not in (1, self.q_len):
            raise RopekitError(f"a {tuple(mask.shape)} attention mask does not cover {self.q_len} queries × "
                               f"{self.k_len} keys", "pass the mask transformers builds for this call")
        mask = mask[..., :self.k_len].to(self.device)
        if mask.dtype != torch.bool:
            allowed = mask > torch.finfo(mask.dtype).min / 2
            if bool((mask[allowed] != 0).any()):
                raise RopekitError("ropekit's attention methods got an additive attention mask with biases other "
                                   "than 0 and −∞", "pass a boolean or 0/−∞ mask (transformers' eager mask)")
            mask = allowed
        mask = _same_over_heads(mask, "a 4-D attention mask")
        self._dense = mask[:, 0].expand(mask.shape[0], self.q_len, self.k_len)  # (B|1, Lq, Lk)
        self.batch = mask.shape[0]

    def _read_flex(self, block_mask, batch: int, heads: int) -> None:
        if tuple(block_mask.seq_lengths) != (self.q_len, self.k_len):
            raise RopekitError(f"a flex_attention BlockMask for {tuple(block_mask.seq_lengths)} used on "
                               f"{self.q_len} queries × {self.k_len} keys", _ALTERNATIVE)
        q_block, k_block = block_mask.BLOCK_SIZE
        columns = -(-self.k_len // k_block)
        partial = _blocks_dense(block_mask.kv_num_blocks, block_mask.kv_indices, columns)
        if block_mask.full_kv_num_blocks is not None:
            full = _blocks_dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, columns)
        else:
            full = torch.zeros_like(partial)
        partial = _same_over_heads(partial, "a flex_attention BlockMask").to(self.device)
        full = _same_over_heads(full, "a flex_attention BlockMask").to(self.device)
        self.batch = max(batch, partial.shape[0])
        self._flex = (block_mask.mask_mod, partial, full, q_block, k_block, heads)

    # ---- what callers ask ---------------------------------------------------------------------------------
    @property
    def is_causal(self) -> bool:
        """Whether this is the plain causal mask (bottom-right aligned, nothing padded, no window)."""
        return self.kind == "causal" and self.window is None

    def block(self, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        """Bool ``(B|1, 1, q1 − q0, k1 − k0)``: may query row ``r ∈ [q0, q1)`` attend to key ``k ∈ [k0, k1)``."""
        if self._dense is not None:
            return self._dense[:, None, q0:q1, k0:k1]
        return self.rows(torch.arange(q0, q1, device=self.device), k0, k1)

    def rows(self, rows: torch.Tensor, k0: int = 0, k1: int | None = None) -> torch.Tensor:
        """Bool ``(B|1, 1, len(rows), k1 − k0)`` for the query rows ``rows`` (int64, any order) and keys ``[k0, k1)``."""
        k1 = self.k_len if k1 is None else k1
        rows = rows.to(self.device)
        if self._dense is not None:
            return self._dense[:, None, rows, k0:k1]
        keys = torch.arange(k0, k1, device=self.device)
        if self._flex is not None:
            return self._flex_rows(rows, keys)
        q_index = (rows + self.offset)[:, None]
        allowed = keys[None, :] <= q_index
        if self.window is not None:
            allowed = allowed & (q_index - keys[None, :] < self.window)
        if self._documents is not None:  # packed documents given no mask: a query sees its own document only
            same = self._documents[:, q_index] == self._documents[:, keys][:, None, :]  # (B, rows, keys)
            allowed = (allowed[None] & same)[:, None]
        else:
            allowed = allowed[None, None]
        if self._padding is not None:
            allowed = allowed & self._padding[:, None, None, k0:k1]
        return allowed

    def _flex_rows(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``full block | (partial block & mask_mod)`` — the pairs ``flex_attention`` attends to."""
        mask_mod, partial, full, q_block, k_block, heads = self._flex
        grid = (torch.arange(self.batch, device=self.device).view(-1, 1, 1, 1),
                torch.arange(heads, device=self.device).view(1, -1, 1, 1),
                rows.view(1, 1, -1, 1), keys.view(1, 1, 1, -1))
        shape = (self.batch, heads, rows.numel(), keys.numel())
        try:
            value = torch.as_tensor(mask_mod(*grid), device=self.device).bool()
            if value.dim() != 4 or torch.broadcast_shapes(value.shape, shape) != shape:
                raise ValueError(f"shape {tuple(value.shape)}")
        except (RuntimeError, IndexError, TypeError, ValueError) as exc:
            raise RopekitError(f"ropekit's attention methods cannot evaluate this flex_attention mask_mod on index "
                               f"grids ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                               _ALTERNATIVE) from None
        value = _same_over_heads(value, "a flex_attention mask_mod")
        q_blocks, k_blocks = rows // q_block, keys // k_block
        pick = (slice(None), slice(None), q_blocks[:, None], k_blocks[None, :])
        allowed = full[pick] | (partial[pick] & value)
        return allowed.expand(self.batch, 1, rows.numel(), keys.numel())

    def _reduce(self) -> None:
        """Keys some query attends to and queries that attend to something, in row chunks (flex)."""
        seen = torch.zeros(self.batch, self.k_len, dtype=torch.bool, device=self.device)
        active = torch.zeros(self.batch, self.q_len, dtype=torch.bool, device=self.device)
        step = max(1, REDUCE_ELEMENTS // max(1, self.batch * self.k_len))
        for a in range(0, self.q_len, step):
            b = min(a + step, self.q_len)
            part = self.block(a, b, 0, self.k_len)[:, 0]
            seen |= part.any(dim=1)
            active[:, a:b] = part.any(dim=2)
        self._seen, self._active = seen, active

    def seen_keys(self) -> torch.Tensor:
        """Bool ``(B|1, Lk)``: keys that some query attends to."""
        if self._seen is None:
            if self._dense is not None:
                self._seen = self._dense.any(dim=1)
            elif self._flex is not None:
                self._reduce()
            elif self._padding is not None and self.window is None:
                self._seen = self._padding  # the last query (key Lk − 1) sees every earlier key
            else:
                # key k is seen by query k itself when it is one, else (k < offset) by the first query
                keys = torch.arange(self.k_len, device=self.device)
                self._seen = (self.offset - keys < (self.window or self.k_len + 1))[None]
                if self._padding is not None:
                    self._seen = self._seen & self._padding
        return self._seen

    def active_queries(self) -> torch.Tensor:
        """Bool ``(B|1, Lq)``: queries that attend to at least one key."""
        if self._active is None:
            if self._dense is not None:
                self._active = self._dense.any(dim=2)
            elif self._flex is not None:
                self._reduce()
            elif self._padding is not None:
                # a query sees a real key iff one lies in its causal (and windowed) range
                real = self._padding.long().cumsum(-1)
                q_index = torch.arange(self.q_len, device=self.device) + self.offset
                start = (q_index - self.window) if self.window is not None else torch.full_like(q_index, -1)
                before = torch.where(start >= 0, real[:, start.clamp(min=0)], torch.zeros_like(real[:, :1]))
                self._active = real[:, q_index] - before > 0
            else:
                self._active = torch.ones(1, self.q_len, dtype=torch.bool, device=self.device)
        return self._active

    def __repr__(self) -> str:
        window = f", window={self.window}" if self.window else ""
        return f"AttentionMask({self.kind}, {self.q_len}×{self.k_len}, batch={self.batch}{window})"
