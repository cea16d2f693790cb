"""Landmark attention (Mohtashami & Jaggi 2023, "Landmark Attention: Random-Access Infinite Context Length
for Transformers", arXiv 2305.16300; summarised in LCEG, shared paper 002 §3, and notes §8).

The input is cut into blocks of ``mem_freq`` tokens and a special *landmark* token follows each block. In
attention, a query sees the tokens of its own block directly and every earlier block only through that
block's landmark: the landmark's softmax weight (among the query's own block and all landmarks) is shared
out over the block's tokens by a second softmax inside the block — the *grouped softmax* of the paper's
§3.1 (:mod:`ropekit.attention.landmark`). At inference each query keeps only the ``top_k`` blocks whose
landmarks score highest (per head), plus a local window of recent blocks, so the attention span stays
inside the trained window at any input length.

This module holds the method (parameters, defaults) and the pure sequence functions: inserting landmark
tokens into a sequence of ids (:func:`insert_landmarks`), removing them (:func:`remove_landmarks`), the
index layout behind both (:func:`landmark_layout`), and the same insertion for a whole training batch
(:func:`insert_landmarks_in_batch`, used by the trainer). What happens inside a model — the new
embedding row, landmarks inserted into plain ids inside ``forward``/``generate``, the outputs mapped back —
is :mod:`ropekit.attention.landmark_stream`.

Conventions (the same everywhere in ropekit):

* a landmark follows every ``mem_freq``-th token of the stream, counted from its first token — a stream
  of ``n`` ids gets ``n // mem_freq`` landmarks, including one right after the last token when ``n`` is a
  multiple of ``mem_freq`` (so a continuation of the stream keeps the same blocks);
* a block is ``mem_freq`` tokens plus its landmark: ``mem_freq + 1`` positions of the model;
* the landmark is never a prediction target (label −100; its logit is −∞), and the *output at a landmark*
  predicts the token after the block — so the model's prediction for the token after a block's last
  token is read at the landmark. The reference LLaMA code (epfml) also trained the trivial prediction of
  the landmark itself (``include_landmark_in_loss``); ropekit does not, since landmarks are inserted by rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import InvalidParameterError, RopekitError
from .abf import DECLARED_FACTOR
from .base import AttentionSpec, Method, Param, RopeInfo, register
from .rope import default_inv_freq

#: Tokens per block in the paper's experiments (``--mem_freq 50`` of the reference training command).
DEFAULT_MEM_FREQ = 50
#: Blocks retrieved per query and head at inference (LCEG's ``cache_top_k=5``, the paper's k = 5 runs).
DEFAULT_TOP_K = 5
#: What a tokenizer calls the landmark token (the reference code's name).
LANDMARK_TOKEN = "<landmark>"
IGNORE_INDEX = -100


def default_local_blocks(window: int, mem_freq: int, top_k: int) -> int:
    """Complete blocks before the query's own block that are always attended: as many as fit the trained
    window next to the own block and the ``top_k`` retrieved ones, ``⌊C/(mem_freq+1)⌋ − 1 − k`` (at least 0).

    The reference inference (epfml ``llama_mem.py``) sizes its local chunk the same way: chunk plus
    ``k + 1`` blocks fill the training length, so every relative position stays one the model was trained on.
    """
    return max(0, window // (mem_freq + 1) - 1 - top_k)


@register
class Landmark(Method):
    """Landmark attention (Mohtashami & Jaggi 2023, arXiv 2305.16300 §3; LCEG paper 002 §3).

    * Tokens: a landmark token after every ``mem_freq`` tokens (paper default 50; LCEG uses 63, i.e.
      blocks of 64). Installing adds the token: a new embedding row, initialised to the mean of the
      existing rows (input and output embeddings), whose id ``landmark_token_id`` is recorded in
      ``config.ropekit``; or pass ``landmark_token_id`` to use a row the vocabulary already has free.
    * Training: the grouped softmax of the paper's §3.1 over all blocks.
    * Inference (``model.eval()``): per query and head, the ``top_k`` earlier blocks whose landmarks score
      highest are attended through the same grouped softmax, together with the ``local_blocks`` blocks
      before the query's own block; retrieved blocks are moved to positions just before that local window
      (the reference implementation's re-positioning), so the span stays within the trained window.
      ``top_k = 0`` attends to every block (the training computation) at inference too.
    * The frequencies stay the model's own RoPE; ``factor`` / ``target_length`` only declare the extended
      window. The weights change (one embedding row) and the method is meant to be fine-tuned.
    """

    name = "landmark"
    title = "Landmark attention"
    summary = ("A landmark token after every block; grouped softmax gates each block by its landmark; "
               "top-k block retrieval at inference.")
    reference = "Mohtashami & Jaggi 2023, arXiv 2305.16300 §3; LCEG (paper 002) §3"
    params = (
        Param("mem_freq", int, DEFAULT_MEM_FREQ, "tokens per block: a landmark follows every mem_freq tokens", minimum=1),
        Param("top_k", int, DEFAULT_TOP_K, "blocks retrieved per query and head at inference (0: every block)", minimum=0),
        Param("local_blocks", int, None, "complete blocks before the query's own block that are always attended "
              "(default: floor(C/(mem_freq+1)) - 1 - top_k, at least 0)", minimum=0),
        Param("landmark_token_id", int, None, "id of the landmark token (default: a new token appended to the "
              "vocabulary when the method is installed)", minimum=0),
        DECLARED_FACTOR,
    )
    changes = ("attention_pattern", "weights")
    needs_training = True
    uses_factor = False

    def resolve(self, info: RopeInfo, given: dict[str, Any]) -> dict[str, Any]:
        params = super().resolve(info, given)
        if params["local_blocks"] is None:
            params["local_blocks"] = default_local_blocks(info.window, params["mem_freq"], params["top_k"])
        return params

    def inv_freq(self, info, params, seq_len=None, device=None):
        """Plain RoPE ``θ_i = b^(−2i/d)`` with the model's own base: Landmark changes tokens and attention."""
        return default_inv_freq(info.rope_theta, info.rotary_dim, device), 1.0

    def attention(self, info, params):
        from ..attention import landmark  # noqa: F401  (registers the layer attention)

        return AttentionSpec(
            layer_attention="landmark",
            layer_attention_args={
                "mem_freq": int(params["mem_freq"]),
                "top_k": int(params["top_k"]),
                "local_blocks": int(params["local_blocks"]),
            },
        )

    def install_model(self, model, info, params):
        """Add the landmark token (embedding row) and the input/output hooks; record the token id."""
        from ..attention.landmark_stream import install_landmark_inputs

        token_id = install_landmark_inputs(model, params["landmark_token_id"])
        return {**params, "landmark_token_id": token_id}

    def prepare_tokenizer(self, tokenizer, params) -> None:
        from ..attention.landmark_stream import add_landmark_token

        add_landmark_token(tokenizer, params["landmark_token_id"], strict=False)

    def transformers_rope(self, info, params):
        return None

    def exports_to(self, params=None):
        return []


# ---- sequences ------------------------------------------------------------------------------------------
def _check_mem_freq(mem_freq: int) -> int:
    if isinstance(mem_freq, bool) or not isinstance(mem_freq, int) or mem_freq < 1:
        raise InvalidParameterError(f"landmark: mem_freq must be a positive integer, got {mem_freq!r}", "pass e.g. 50")
    return mem_freq


def landmark_layout(n: int, mem_freq: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the landmarks go among ``n`` ids that start at stream position ``offset``.

    Returns ``(source, is_landmark, output_index)``:

    * ``source`` (n + L,): for every position of the sequence with landmarks, the index of the id it comes
      from — a landmark points at the token it follows (so per-token data such as a padding mask carries
      over to it);
    * ``is_landmark`` (n + L,): which positions are landmarks;
    * ``output_index`` (n,): the position whose model output is token ``t``'s prediction of the next
      token — the landmark that follows ``t`` when there is one, else ``t`` itself.

    A landmark follows token ``t`` when ``(offset + t + 1) % mem_freq == 0``.
    """
    _check_mem_freq(mem_freq)
    t = torch.arange(n)
    closes = (offset + t + 1) % mem_freq == 0  # token t is the last of its block
    before = torch.cumsum(closes.long(), 0) - closes.long()  # landmarks inserted before token t
    token_at = t + before  # position of token t in the sequence with landmarks
    total = n + int(closes.sum())
    source = torch.empty(total, dtype=torch.long)
    is_landmark = torch.zeros(total, dtype=torch.bool)
    source[token_at] = t
    landmark_at = token_at[closes] + 1
    source[landmark_at] = t[closes]
    is_landmark[landmark_at] = True
    output_index = token_at + closes.long()
    return source, is_landmark, output_index


def insert_landmarks(ids, mem_freq: int, landmark_token_id: int, *, offset: int = 0):
    """``ids`` with a landmark token after every ``mem_freq``-th token (Landmark paper §3: blocks of
    ``mem_freq`` tokens, each followed by its landmark).

    ``ids``: a list of ints, or a 1-D / 2-D (batch, n) integer tensor — returned in the same form. ``offset``
    is the stream position of ``ids[0]`` (how many tokens came before it), so that a continuation gets the
    landmarks where the whole stream would have them.
    """
    as_list = not isinstance(ids, torch.Tensor)
    tensor = torch.as_tensor(list(ids) if as_list else ids, dtype=torch.long)
    if tensor.dim() not in (1, 2):
        raise RopekitError(f"insert_landmarks takes a 1-D or 2-D tensor of ids, got {tensor.dim()}-D", "pass (n,) or (batch, n)")
    source, is_landmark, _ = landmark_layout(tensor.shape[-1], mem_freq, offset)
    out = tensor[..., source.to(tensor.device)]
    out[..., is_landmark.to(tensor.device)] = landmark_token_id
    return out.tolist() if as_list else out


def remove_landmarks(ids, landmark_token_id: int):
    """``ids`` without its landmark tokens (the inverse of :func:`insert_landmarks`); a list, or a 1-D / 2-D
    tensor whose rows hold the same number of landmarks."""
    if not isinstance(ids, torch.Tensor):
        return [int(t) for t in ids if int(t) != landmark_token_id]
    keep = ids != landmark_token_id
    if ids.dim() == 1:
        return ids[keep]
    counts = keep.sum(-1)
    if ids.dim() != 2 or bool((counts != counts[0]).any()):
        raise RopekitError("remove_landmarks: the rows hold different numbers of landmarks", "remove them row by row")
    return ids[keep].view(ids.shape[0], int(counts[0]))


def landmark_positions(positions: torch.Tensor, source: torch.Tensor, is_landmark: torch.Tensor,
                       carry: torch.Tensor | None = None, last: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Position ids for a sequence with landmarks from the position ids (B, n) of its tokens.

    A landmark takes the position after the token it follows, and every later token moves up by the
    landmarks inserted since the positions last restarted (a position not above the previous one: a new
    packed document, or left padding ending) — so consecutive positions stay consecutive, PoSE-style
    jumps keep their size, and each packed document starts where it did. ``carry`` (B,) landmarks and
    ``last`` (B,) position continue an earlier part of the same stream. Returns ``(positions with
    landmarks, carry, last)`` for the next part.
    """
    batch = positions.shape[0]
    pos = positions[:, source]  # (B, n + L): a landmark starts at the position of the token it follows
    is_lm = is_landmark.to(pos.device)[None].expand(batch, -1)
    restart = torch.zeros_like(pos, dtype=torch.bool)
    # a landmark repeats the position of the token before it, so comparing with the previous position
    # compares tokens with tokens; only tokens can restart
    restart[:, 1:] = pos[:, 1:] <= pos[:, :-1]
    if last is not None:
        restart[:, 0] = pos[:, 0] <= last
    restart &= ~is_lm
    lm = is_lm.long()
    inserted = torch.cumsum(lm, -1)  # landmarks up to and including each position
    # landmarks counted at the most recent restart (0 = none in this part, so `carry` still applies)
    index = torch.arange(pos.shape[1], device=pos.device)[None].expand(batch, -1)
    at_restart = torch.where(restart, inserted - lm, torch.zeros_like(inserted))
    last_restart = torch.cummax(torch.where(restart, index, torch.full_like(index, -1)), dim=-1).values
    base = torch.where(last_restart >= 0, at_restart.gather(1, last_restart.clamp(min=0)), torch.zeros_like(inserted))
    before = carry if carry is not None else torch.zeros(batch, dtype=torch.long, device=pos.device)
    from_carry = torch.where(last_restart >= 0, torch.zeros_like(inserted), before[:, None].expand_as(inserted))
    shifted = pos + inserted - base + from_carry
    new_carry = (inserted - base + from_carry)[:, -1] if pos.shape[1] else before
    new_last = pos[:, -1] if pos.shape[1] else last
    return shifted, new_carry, new_last


def insert_landmarks_in_batch(batch: dict[str, torch.Tensor], mem_freq: int, landmark_token_id: int) -> dict[str, torch.Tensor]:
    """A training batch (``input_ids``, ``labels``, ``position_ids``, ``attention_mask`` as the trainer
    reads them, :mod:`ropekit.train.data`) with a landmark after every ``mem_freq`` tokens of each row.

    Landmarks get label −100 (they are inserted by rule, never predicted); the output at a landmark then
    predicts the label of the token after it, as in the model's own forward on plain ids. Positions follow
    :func:`landmark_positions`. A 2-D padding mask gives a landmark the value of the token it follows; a
    square document mask ``[B, 1, L, L]`` is indexed the same way on both sides and kept causal.
    """
    ids = batch["input_ids"]
    source, is_landmark, _ = landmark_layout(ids.shape[1], mem_freq)
    source, is_landmark = source.to(ids.device), is_landmark.to(ids.device)
    out = dict(batch)
    out["input_ids"] = ids[:, source].masked_fill(is_landmark, landmark_token_id)
    if "labels" in batch:
        out["labels"] = batch["labels"][:, source].masked_fill(is_landmark, IGNORE_INDEX)
    if "position_ids" in batch:
        out["position_ids"] = landmark_positions(batch["position_ids"], source, is_landmark)[0]
    mask = batch.get("attention_mask")
    if mask is not None:
        if mask.dim() == 2:
            out["attention_mask"] = mask[:, source]
        elif mask.dim() == 4:
            square = mask[:, :, source][:, :, :, source]
            causal = torch.ones(source.numel(), source.numel(), dtype=torch.bool, device=mask.device).tril()
            out["attention_mask"] = square & causal if square.dtype == torch.bool else square * causal
        else:
            raise RopekitError(f"landmark training takes 2-D or 4-D attention masks, got {mask.dim()}-D",
                               "use the trainer's batches (ropekit.train.data.collate)")
    return out


def training_batch(model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The trainer's hook: ``batch`` with landmarks inserted when ``model`` carries Landmark attention,
    else ``batch`` itself."""
    from ..patching import installed

    record = installed(model)
    if not record or record.get("method") != Landmark.name:
        return batch
    params = record["params"]
    return insert_landmarks_in_batch(batch, int(params["mem_freq"]), int(params["landmark_token_id"]))


def landmark_settings(config) -> tuple[int, int] | None:
    """``(mem_freq, landmark_token_id)`` of a config carrying Landmark attention, else ``None``."""
    record = getattr(config, "ropekit", None)
    if not record or record.get("method") != Landmark.name:
        return None
    params = record.get("params") or {}
    if params.get("landmark_token_id") is None:
        return None  # mid-installation: the token is being added
    return int(params["mem_freq"]), int(params["landmark_token_id"])


__all__: Sequence[str] = (
    "DEFAULT_MEM_FREQ",
    "DEFAULT_TOP_K",
    "LANDMARK_TOKEN",
    "Landmark",
    "default_local_blocks",
    "insert_landmarks",
    "insert_landmarks_in_batch",
    "landmark_layout",
    "landmark_positions",
    "remove_landmarks",
    "training_batch",
)
