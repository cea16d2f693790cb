"""Landmark attention inside a transformers model: the landmark token, and landmarks inserted into plain ids.

Installing (:func:`install_landmark_inputs`, called by ``ropekit.extend(model, "landmark", …)``; removing a
method calls :func:`remove_landmark_inputs`, which takes the hooks away and leaves the embedding row):

* **The token.** Without ``landmark_token_id`` the embedding matrix grows by one row
  (``resize_token_embeddings``, so ``config.vocab_size`` follows) and the new id is that row; the input
  and output rows start as the mean of the existing rows (what the reference training script does). Most
  tokenizers fill their embedding matrix — they have no free id — so this is the usual case, and
  :func:`add_landmark_token` then gives such a tokenizer ``<landmark>`` at exactly that id (``len(tokenizer)``).
  A tokenizer smaller than the matrix (padded vocabularies) cannot name the new row; pass
  ``landmark_token_id=len(tokenizer)`` to use a free padded row instead. A given id is used as it is:
  no row is added and no weight changes (this is also how ``ropekit.load`` restores the method).
* **Hooks on the decoder** (``model.base_model``, so ``model(...)``, ``generate`` and code that calls the
  decoder directly all pass through them) and one on the output embedding (the landmark's logit is −∞:
  it is never predicted or generated).

What the decoder hook does per call — the *stream* of a call is the ids it sees together with those
cached before them, and its mode is fixed by its first call:

* **Plain ids** (no landmark id in them): landmarks are inserted after every ``mem_freq``-th token of the
  stream (:func:`~ropekit.methods.landmark_layout.landmark_layout`, counting the tokens already cached, so
  ``generate``, chunked prefill and one long forward see the same sequence); a 2-D attention mask and the
  position ids are extended to match (:func:`~ropekit.methods.landmark_layout.landmark_positions`) — a call
  without position ids gets the plain model's, ``plain tokens so far + 0 … n−1``, extended the same way, so the
  calls of one stream may mix passing them and not; and the decoder's output is mapped back to one vector per
  plain token — the output at the landmark for the last token of a block. So logits, ``logits_to_keep``,
  ``labels`` and every evaluation work on plain ids. The per-layer ``hidden_states``/``attentions`` (when
  requested) keep the landmark positions.
* **Ids that already hold landmarks** (the trainer's batches, :mod:`ropekit.methods.landmark_layout`): passed
  through; the output keeps one position per id.

The landmark layout of the cached keys lives on the KV cache object; a cache filled without it (before
installing, or by hand) is refused. ``inputs_embeds``, 4-D masks on plain ids, and beam search (its cache
reordering does not reorder the layout) are not supported; greedy decoding and sampling are.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass

import torch

from .landmark_attention import LANDMARKS_KWARG, LandmarkInputs
from ..core.hf_compat import cache_argument
from ..errors import InvalidParameterError, RopekitError
from .landmark_layout import LANDMARK_TOKEN, landmark_layout, landmark_positions

#: On a KV cache: the landmark layout of what it holds.
STREAM_ATTR = "_ropekit_landmark_stream"
#: On the output embedding: the landmark token's id (kept after removal, so re-installing reuses the row).
TOKEN_ATTR = "_ropekit_landmark_token"
#: On the model: ``(mem_freq, landmark_token_id)`` while installed, and the hook handles that removal undoes.
SETTINGS_ATTR = "_ropekit_landmark_settings"
HOOKS_ATTR = "_ropekit_landmark_hooks"


@dataclass
class _Stream:
    """Landmark layout of what a KV cache holds."""

    explicit: bool  # the caller's ids hold the landmarks
    plain_seen: int = 0  # plain tokens so far (plain-id streams)
    is_landmark: torch.Tensor | None = None  # (B, cached keys)
    carry: torch.Tensor | None = None  # (B,) landmarks since positions last restarted
    last_position: torch.Tensor | None = None  # (B,) position of the last token


# ---- the token ----------------------------------------------------------------------------------------------
def _add_embedding_row(model) -> int:
    """Grow the vocabulary by one row, set to the mean of the existing rows; return its id."""
    rows = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(rows + 1, mean_resizing=False)
    with torch.no_grad():
        inputs = model.get_input_embeddings().weight
        inputs[rows] = inputs[:rows].mean(dim=0)
        head = model.get_output_embeddings()
        if head is not None and head.weight is not inputs:
            head.weight[rows] = head.weight[:rows].mean(dim=0)
            if getattr(head, "bias", None) is not None:
                head.bias[rows] = head.bias[:rows].mean()
    return rows


def install_landmark_inputs(model, landmark_token_id: int | None, mem_freq: int) -> int:
    """Add the landmark token (unless ``landmark_token_id`` names an existing row) and the hooks; return the id.

    Installing again (a curriculum re-installing the method) adds no second row: a model that already
    carries a landmark token keeps it; the hooks are replaced.
    """
    rows = model.get_input_embeddings().weight.shape[0]
    head = model.get_output_embeddings()
    if landmark_token_id is None:
        landmark_token_id = getattr(head, TOKEN_ATTR, None) if head is not None else None
        if landmark_token_id is None or landmark_token_id >= rows:
            landmark_token_id = _add_embedding_row(model)
            head = model.get_output_embeddings()
    elif not 0 <= landmark_token_id < rows:
        raise InvalidParameterError(
            f"landmark: landmark_token_id {landmark_token_id} is outside the vocabulary ({rows} embedding rows)",
            "leave it out to add a new token, or pass the id of a free row")
    remove_landmark_inputs(model)
    decoder = model.base_model
    setattr(decoder, SETTINGS_ATTR, (int(mem_freq), int(landmark_token_id)))
    hooks = [decoder.register_forward_pre_hook(_before_decoder, with_kwargs=True),
             decoder.register_forward_hook(_after_decoder, with_kwargs=True)]
    if head is not None:
        setattr(head, TOKEN_ATTR, int(landmark_token_id))
        hooks.append(head.register_forward_hook(_mask_landmark_logit))
    setattr(model, HOOKS_ATTR, hooks)
    return int(landmark_token_id)


def remove_landmark_inputs(model) -> None:
    """Take the hooks of :func:`install_landmark_inputs` away; the embedding row (and its id) stay."""
    for handle in getattr(model, HOOKS_ATTR, ()):
        handle.remove()
    if hasattr(model, HOOKS_ATTR):
        delattr(model, HOOKS_ATTR)
    if hasattr(model.base_model, SETTINGS_ATTR):
        delattr(model.base_model, SETTINGS_ATTR)


def add_landmark_token(tokenizer, landmark_token_id: int, *, strict: bool = True) -> bool:
    """Give ``tokenizer`` the special token ``<landmark>`` at ``landmark_token_id``; returns whether it has it.

    Works when the id is the tokenizer's next one (``len(tokenizer)`` — the case of a tokenizer with no free
    id, whose model got a new embedding row) or the tokenizer already maps ``<landmark>`` to it. Otherwise
    raises a one-line error, or with ``strict=False`` leaves the tokenizer as it is and returns False: the
    model inserts landmarks by id, so plain text ids never need the token.
    """
    vocab = tokenizer.get_vocab()
    if vocab.get(LANDMARK_TOKEN) == landmark_token_id:
        return True
    if LANDMARK_TOKEN not in vocab and len(tokenizer) == landmark_token_id:
        tokenizer.add_special_tokens({"additional_special_tokens": [LANDMARK_TOKEN]})
        if tokenizer.convert_tokens_to_ids(LANDMARK_TOKEN) == landmark_token_id:
            return True
    if strict:
        raise RopekitError(
            f"the tokenizer ({len(tokenizer)} tokens) cannot name the landmark id {landmark_token_id}",
            "the model inserts landmarks into plain ids itself; to name them, install with landmark_token_id=len(tokenizer)")
    return False


# ---- the hooks ----------------------------------------------------------------------------------------------
def _as_kwargs(module, args, kwargs) -> dict:
    if not args:
        return dict(kwargs)
    names = list(inspect.signature(module.forward).parameters)
    return {**dict(zip(names, args)), **kwargs}


def _before_decoder(module, args, kwargs):
    mem_freq, token_id = getattr(module, SETTINGS_ATTR)
    kwargs = _as_kwargs(module, args, kwargs)
    ids = kwargs.get("input_ids")
    if ids is None:
        if kwargs.get("inputs_embeds") is not None:
            raise RopekitError("Landmark attention needs input_ids, not inputs_embeds",
                               "pass token ids: the landmark token is inserted between them")
        return None
    name = cache_argument(module)
    cache = kwargs.get(name)
    if cache is None and name != "past_key_values":
        cache = kwargs.pop("past_key_values", None)  # a caller still using the deprecated name
        if cache is not None:
            kwargs[name] = cache
    stream = getattr(cache, STREAM_ATTR, None) if cache is not None else None
    if stream is None:
        if cache is not None and cache.get_seq_length() > 0:
            raise RopekitError("the KV cache was filled without Landmark attention's bookkeeping",
                               "start from an empty KV cache on the extended model")
        stream = _Stream(explicit=bool((ids == token_id).any()))
        use_cache = kwargs.get("use_cache")
        if use_cache is None:
            use_cache = bool(getattr(module.config, "use_cache", False))
        if cache is None and use_cache:
            from transformers import DynamicCache

            cache = kwargs[name] = DynamicCache(config=module.config)
        if cache is not None:
            setattr(cache, STREAM_ATTR, stream)
    if stream.explicit:
        chunk_landmarks, output_index = ids == token_id, None
    else:
        chunk_landmarks, output_index = _insert_into_call(kwargs, stream, mem_freq, token_id)
    previous = stream.is_landmark
    if previous is not None and previous.shape[0] != chunk_landmarks.shape[0]:
        raise RopekitError("the batch size changed while continuing a KV cache", "start a new cache for a new batch")
    is_landmark = chunk_landmarks if previous is None else torch.cat([previous.to(ids.device), chunk_landmarks], dim=1)
    if cache is not None:
        _check_room(cache, is_landmark.shape[-1], mem_freq)
        stream.is_landmark = is_landmark
    kwargs[LANDMARKS_KWARG] = LandmarkInputs(is_landmark=is_landmark, output_index=output_index)
    return (), kwargs


def _check_room(cache, needed: int, mem_freq: int) -> None:
    """A cache of fixed size (``StaticCache``; ``generate`` sizes it for the plain tokens) must hold the landmarks
    too, one after every ``mem_freq`` tokens: refuse in one line before transformers fails on an index."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return
    sliding = getattr(cache, "is_sliding", None)
    sliding = list(sliding) if isinstance(sliding, (list, tuple)) else [False] * len(layers)
    # a sliding-window layer keeps only its window by design; a full layer of fixed size must hold everything
    limits = [layer.get_max_length() for layer, slides in zip(layers, sliding)
              if not slides and callable(getattr(layer, "get_max_length", None))]
    if not limits or any(limit is None or limit < 0 for limit in limits):
        return  # a dynamic layer grows as needed
    limit = min(limits)
    if 0 < limit < needed:
        raise RopekitError(
            f"landmark attention: with its landmarks (one after every {mem_freq} tokens) this input needs {needed} "
            f"slots of the KV cache, and the static cache holds {limit}",
            f"use the default dynamic cache, or pass a StaticCache with max_cache_len ≥ {needed} plus "
            f"(1 + 1/{mem_freq}) × the tokens still to generate")


def _insert_into_call(kwargs: dict, stream: _Stream, mem_freq: int, token_id: int):
    """Insert the landmarks into this call's plain ids, mask and positions (in ``kwargs``); advance ``stream``.

    Returns this call's landmark flags (B, positions) and the position of each plain token's output.
    """
    ids = kwargs["input_ids"]
    if bool((ids == token_id).any()):
        raise RopekitError("these ids hold landmark tokens, but the stream started with plain ids",
                           "pass plain ids throughout (ropekit inserts the landmarks), or landmarks from the start")
    batch, n = ids.shape
    source, chunk_landmarks, output_index = (t.to(ids.device) for t in landmark_layout(n, mem_freq, stream.plain_seen))
    kwargs["input_ids"] = ids[:, source].masked_fill(chunk_landmarks, token_id)
    mask = kwargs.get("attention_mask")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            raise RopekitError("Landmark attention on plain ids takes a 2-D attention mask",
                               "pass a (batch, length) padding mask, or ids that already hold the landmarks")
        seen = stream.plain_seen + n
        if mask.shape[1] != seen:
            raise RopekitError(f"the attention mask covers {mask.shape[1]} tokens, not {seen} (cached and new)",
                               "pass the mask of every token so far, as generate does")
        if stream.plain_seen == 0:
            _warn_if_left_padding_shifts_blocks(mask, mem_freq)
        whole, _, _ = landmark_layout(seen, mem_freq)
        kwargs["attention_mask"] = mask[:, whole.to(mask.device)]
    positions = kwargs.get("position_ids")
    if positions is None:
        # the plain model's default, its tokens' consecutive positions counting the cached ones (§3: a landmark
        # is one more position of the stream), through the same path as given ones: a call without position ids
        # must still advance `carry`, or a later call that passes them would count no landmark before it
        positions = torch.arange(stream.plain_seen, stream.plain_seen + n, device=ids.device).expand(batch, -1)
    elif positions.dim() != 2:
        raise RopekitError("Landmark attention takes 2-D position_ids (batch, length)", "pass (batch, length) positions")
    moved, carry, last = landmark_positions(positions, source, chunk_landmarks, stream.carry, stream.last_position)
    kwargs["position_ids"] = moved
    stream.carry, stream.last_position = carry, last
    stream.plain_seen += n
    return chunk_landmarks[None].expand(batch, -1), output_index


def _warn_if_left_padding_shifts_blocks(mask: torch.Tensor, mem_freq: int) -> None:
    """Blocks count from the batch's first column, padding included (one layout keeps the batch rectangular): a
    row left-padded by a number of tokens that is not a multiple of ``mem_freq`` gets its landmarks at other tokens
    than the row alone would, so its outputs differ from the unpadded row's. Said once, with the alternatives."""
    leading = (mask.to(torch.long).cumsum(-1) == 0).sum(-1)
    if bool((leading % mem_freq != 0).any()):
        warnings.warn(
            f"landmark: a row is left-padded by a number of tokens that is not a multiple of mem_freq={mem_freq}, so "
            "its blocks are shifted and its outputs differ from the row run alone; pad on the right, pad each row "
            f"to a multiple of {mem_freq} tokens, or run such rows one at a time",
            stacklevel=3,
        )


def _after_decoder(module, args, kwargs, output):
    inputs = kwargs.get(LANDMARKS_KWARG)
    if not isinstance(inputs, LandmarkInputs) or inputs.output_index is None:
        return None
    if isinstance(output, tuple):
        return (output[0][:, inputs.output_index],) + output[1:]
    output.last_hidden_state = output.last_hidden_state[:, inputs.output_index]
    return output


def _mask_landmark_logit(module, args, output):
    token_id = getattr(module, TOKEN_ATTR, None)
    if token_id is None or not isinstance(output, torch.Tensor) or token_id >= output.shape[-1]:
        return None
    index = torch.tensor([token_id], device=output.device)
    return output.index_fill(-1, index, float("-inf"))
