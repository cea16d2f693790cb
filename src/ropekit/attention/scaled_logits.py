"""Per-query-position attention-logit scaling (Entropy-aware ABF)."""

from __future__ import annotations

import torch

from ..core.rope import entropy_logit_scale


class QueryLogitScale:
    """Multiply the logits of query position ``m`` by ``t = max(log_c(m+1), 1)`` (Entropy-ABF §3.2, unnumbered).

    Scaling the query scales every logit of its row by the same ``t``; keys (and the KV cache) are
    untouched, so cached decoding stays exact.
    """

    def __init__(self, context: int, reads_positions: str | None = None):
        self.context = int(context)
        #: The method's name on the one layer that checks a call for left padding counted in its positions
        #: (``t`` depends on the absolute position, so such a row is scaled as if it were longer).
        self.reads_positions = reads_positions

    def __call__(self, module, query: torch.Tensor, key: torch.Tensor, position_ids: torch.Tensor | None):
        if position_ids is None:
            raise RuntimeError("ropekit's logit scale needs position_ids; transformers did not pass them")
        scale = entropy_logit_scale(position_ids, self.context).to(device=query.device, dtype=query.dtype)
        return query * scale[:, None, :, None], key

    def __repr__(self) -> str:
        return f"QueryLogitScale(context={self.context})"
