"""The attention masks transformers builds for each kernel (``transformers.masking_utils``), for tests that
feed ropekit's attention functions every format: none (plain causal), the flash kernels' 2-D padding mask,
sdpa's 4-D bool mask, eager's 4-D additive float mask and flex-attention's ``BlockMask``."""

from __future__ import annotations

import torch
from transformers.masking_utils import (
    eager_mask,
    flash_attention_mask,
    flex_attention_mask,
    sdpa_mask,
)

FORMATS = ("none", "flash", "sdpa", "eager", "flex")


def kernel_mask(fmt: str, real, q_len: int):
    """The mask transformers builds for ``fmt`` from a 2-D padding mask ``real`` (B, Lk) (1 = real token), with
    a dynamic cache: the queries are the last ``q_len`` keys (``q_offset = Lk − Lq``, ``kv_offset = 0``)."""
    pad = torch.as_tensor(real).bool()
    batch, k_len = pad.shape
    sizes = {"batch_size": batch, "q_length": q_len, "kv_length": k_len, "q_offset": k_len - q_len, "kv_offset": 0}
    if fmt == "none":
        assert bool(pad.all()), "no mask means no padding"
        return None
    if fmt == "flash":
        return flash_attention_mask(**sizes, attention_mask=pad)
    if fmt == "sdpa":
        return sdpa_mask(**sizes, attention_mask=pad, allow_is_causal_skip=False)
    if fmt == "eager":
        return eager_mask(**sizes, attention_mask=pad, dtype=torch.float32)
    if fmt == "flex":
        return flex_attention_mask(**sizes, attention_mask=pad)
    raise ValueError(fmt)
