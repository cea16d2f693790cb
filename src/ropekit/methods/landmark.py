"""Landmark attention (Mohtashami & Jaggi 2023, "Landmark Attention: Random-Access Infinite Context Length
for Transformers", arXiv 2305.16300; summarised in LCEG (Lu et al. 2024) §3; docs/methods-reference.md §7).

The input is cut into blocks of ``mem_freq`` tokens and a special *landmark* token follows each block. In
attention, a query sees the tokens of its own block directly and every earlier block only through that
block's landmark: the landmark's softmax weight (among the query's own block and all landmarks) is shared
out over the block's tokens by a second softmax inside the block — the *grouped softmax* of the paper's
§3.1 (:mod:`ropekit.methods.landmark_attention`). At inference each query keeps only the ``top_k`` blocks whose
landmarks score highest (per head), plus a local window of recent blocks, so the attention span stays
inside the trained window at any input length.

This module holds the method (parameters, defaults, what installing and removing it does). The token
layout — inserting landmark tokens into ids, positions, masks and training batches — is
:mod:`.landmark_layout`; what happens inside a model (the new embedding row, landmarks inserted into plain
ids inside ``forward``/``generate``, the outputs mapped back) is :mod:`.landmark_stream`; the attention
itself is :mod:`ropekit.methods.landmark_attention`.

Conventions: :mod:`.landmark_layout`.
"""

from __future__ import annotations

from typing import Any

from .landmark_attention import make_landmark
from .abf import DECLARED_FACTOR
from .base import AttentionSpec, Method, Param, RopeInfo, register
from .landmark_layout import (  # noqa: F401  (the layout's names are part of this method's API)
    LANDMARK_TOKEN,
    insert_landmarks,
    insert_landmarks_in_batch,
    landmark_layout,
    landmark_positions,
    remove_landmarks,
)
from .landmark_stream import add_landmark_token, install_landmark_inputs, remove_landmark_inputs

#: Tokens per block in the paper's experiments (``--mem_freq 50`` of the reference training command).
DEFAULT_MEM_FREQ = 50
#: Blocks retrieved per query and head at inference (LCEG's ``cache_top_k=5``, the paper's k = 5 runs).
DEFAULT_TOP_K = 5


def default_local_blocks(window: int, mem_freq: int, top_k: int) -> int:
    """Complete blocks before the query's own block that are always attended: as many as fit the trained
    window next to the own block and the ``top_k`` retrieved ones, ``⌊C/(mem_freq+1)⌋ − 1 − k`` (at least 0).

    The reference inference (epfml ``llama_mem.py``) sizes its local chunk the same way: chunk plus
    ``k + 1`` blocks fill the training length, so every relative position stays one the model was trained on.
    """
    return max(0, window // (mem_freq + 1) - 1 - top_k)


@register
class Landmark(Method):
    """Landmark attention (Mohtashami & Jaggi 2023, arXiv 2305.16300 §3; LCEG (Lu et al. 2024) §3).

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

    Composition: the frequencies are the model's own scaled ones ``θ^eff`` (and its attention factor), which the
    retrieved blocks are re-positioned with; the default local blocks are sized from the effective window.
    """

    name = "landmark"
    title = "Landmark attention"
    summary = ("A landmark token after every block; grouped softmax gates each block by its landmark; "
               "top-k block retrieval at inference.")
    reference = "Mohtashami & Jaggi 2023, arXiv 2305.16300 §3; LCEG (Lu et al. 2024, arXiv 2409.12181) §3"
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
    attention_access = ("rotates", "logits")
    composition = "frequencies kept (the model's scaled ones); blocks sized from the effective window"
    needs_training = True
    untrained_note = ("its landmark token is a new embedding row (the mean of the vocabulary's) that only "
                      "fine-tuning teaches to summarise a block: untrained, the retrieval it gates is arbitrary")
    uses_factor = False

    family = "Attention-side"

    def demo_params(self, info, factor):
        """A landmark every ``C/8 − 1`` tokens (8 blocks per window: the paper's 50-token blocks would leave one
        block in a 64-token window), top-2 retrieval."""
        return {"mem_freq": max(2, info.window // 8 - 1), "top_k": 2, "factor": factor}

    def settings_line(self, info, params, requested=None):
        return f"landmark every {params['mem_freq']} tokens, top-{params['top_k']} blocks + {params['local_blocks']} local (untrained)"

    def resolve(self, info: RopeInfo, given: dict[str, Any]) -> dict[str, Any]:
        params = super().resolve(info, given)
        if params["local_blocks"] is None:
            params["local_blocks"] = default_local_blocks(info.window, params["mem_freq"], params["top_k"])
        return params

    def inv_freq(self, info, params, seq_len=None, device=None):
        """The model's own frequencies: Landmark changes tokens and attention."""
        return self.base(info, seq_len, device)

    def attention(self, info, params):
        return AttentionSpec(
            layer_attention=make_landmark,
            layer_attention_args={
                "mem_freq": int(params["mem_freq"]),
                "top_k": int(params["top_k"]),
                "local_blocks": int(params["local_blocks"]),
            },
        )

    def install_model(self, model, info, params):
        """Add the landmark token (embedding row) and the input/output hooks; record the token id."""
        token_id = install_landmark_inputs(model, params["landmark_token_id"], int(params["mem_freq"]))
        return {**params, "landmark_token_id": token_id}

    def uninstall_model(self, model, params):
        """Remove the hooks; the landmark token's embedding row stays (removing a method never touches weights)."""
        remove_landmark_inputs(model)

    def training_problem(self, params, seq_len):
        """A landmark after every ``mem_freq`` tokens is trained through the later tokens that retrieve its block
        (§3): a sequence of at most ``mem_freq`` tokens holds none that could, and the landmark stays untrained."""
        mem_freq = int(params.get("mem_freq", self.param("mem_freq").default))
        if seq_len > mem_freq:
            return None
        return (f"landmark with mem_freq {mem_freq} in sequences of {seq_len} tokens: no token follows a block, so the "
                "landmark is never trained",
                f"make data.seq_len larger than mem_freq (several blocks: e.g. {4 * (mem_freq + 1)}), or lower mem_freq")

    def adapter_problem(self, params, extras):
        """The landmark token's input embedding is learned (§3: it is what lets attention to the landmark stand
        for its block); LoRA adapters on the projections do not reach it, so the embedding must train as an extra."""
        if "embed" in extras:
            return None
        return ("landmark under train.lora without `embed` in train.lora.trainable: the landmark token's embedding "
                "row would not train", "add embed to train.lora.trainable (LongLoRA's recipe trains it: [embed, norm])")

    def training_batch(self, batch, params):
        """The trainer's batches get a landmark after every ``mem_freq`` tokens (:func:`insert_landmarks_in_batch`)."""
        return insert_landmarks_in_batch(batch, int(params["mem_freq"]), int(params["landmark_token_id"]))

    def prepare_tokenizer(self, tokenizer, params) -> None:
        add_landmark_token(tokenizer, params["landmark_token_id"], strict=False)

    def transformers_rope(self, info, params):
        return None

    def exports_to(self, params=None):
        return []


