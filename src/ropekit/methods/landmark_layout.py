"""Landmark attention's token layout (Mohtashami & Jaggi 2023, arXiv 2305.16300 §3): where the landmark
tokens go in a sequence of ids, and the same insertion for positions, masks and whole training batches.

Conventions (the same everywhere in ropekit):

* a landmark follows every ``mem_freq``-th token of the stream, counted from its first token — a stream
  of ``n`` ids gets ``n // mem_freq`` landmarks, including one right after the last token when ``n`` is a
  multiple of ``mem_freq`` (so a continuation of the stream keeps the same blocks);
* a block is ``mem_freq`` tokens plus its landmark: ``mem_freq + 1`` positions of the model;
* the landmark is never a prediction target (label −100; its logit is −∞), and the *output at a landmark*
  predicts the token after the block — so the model's prediction for the token after a block's last
  token is read at the landmark. The reference LLaMA code (epfml) also trained the trivial prediction of
  the landmark itself (``include_landmark_in_loss``); ropekit does not, since landmarks are inserted by rule.

Pure functions of ids and tensors: nothing here touches a model (that is :mod:`.landmark_stream`).
"""

from __future__ import annotations

import torch

from ..errors import InvalidParameterError, RopekitError

#: What a tokenizer calls the landmark token (the reference code's name).
LANDMARK_TOKEN = "<landmark>"
IGNORE_INDEX = -100


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
