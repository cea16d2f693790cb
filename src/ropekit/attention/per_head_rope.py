"""Per-head RoPE (HARPE): each KV group rotates its queries and keys with its own base."""

from __future__ import annotations

import torch

from ..core.rope import default_inv_freq, rotate
from .masks import key_positions


class PerHeadRotation:
    """Rotate queries and keys per KV group: group ``g`` uses ``θ_{g,i} = b_g^(−2i/d)`` (HARPE Eq. 6–8).

    The model's shared rotary embedding is the identity for HARPE, so queries/keys (and cached keys)
    arrive unrotated. Query head ``h`` belongs to group ``h // (heads / kv_heads)``. Only the first
    ``rotary_dim`` channels rotate (partial-rotary models). cos/sin are built exactly as transformers
    builds them, so equal bases reproduce the plain model bit for bit.
    """

    def __init__(self, bases: list[float], rotary_dim: int):
        self.bases = [float(b) for b in bases]
        self.rotary_dim = int(rotary_dim)
        self.inv_freq = torch.stack([default_inv_freq(b, self.rotary_dim) for b in self.bases])  # (G, rot/2)

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        inv = self.inv_freq.to(positions.device)
        freqs = positions[:, None, :, None].float() * inv[None, :, None, :]  # (B, G, L, rot/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def __call__(self, module, query: torch.Tensor, key: torch.Tensor, position_ids: torch.Tensor | None):
        if position_ids is None:
            raise RuntimeError("HARPE's per-head rotation needs position_ids; transformers did not pass them")
        groups = len(self.bases)
        batch, heads, q_len, dim = query.shape
        if key.shape[1] != groups:
            raise RuntimeError(f"HARPE was set up for {groups} KV groups but the layer has {key.shape[1]}")
        cos_q, sin_q = self._cos_sin(position_ids, query.dtype)
        q = query.reshape(batch, groups, heads // groups, q_len, dim)
        q = rotate(q, cos_q[:, :, None], sin_q[:, :, None]).reshape(batch, heads, q_len, dim)
        cos_k, sin_k = self._cos_sin(key_positions(position_ids, key.shape[2]), key.dtype)
        return q, rotate(key, cos_k, sin_k)

    def __repr__(self) -> str:
        return f"PerHeadRotation(bases={self.bases}, rotary_dim={self.rotary_dim})"
