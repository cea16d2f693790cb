"""Dual Chunk Attention: chunked relative positions that never exceed the window; training-free.

**In vLLM.** vLLM serves DCA itself (Qwen2.5-1M) from ``config.json``'s ``dual_chunk_attention_config``
(read in vLLM's source, not run here: it needs CUDA). What its code reads and does:

* ``get_rope`` (``model_executor/layers/rotary_embedding/__init__.py``) builds ``DualChunkRotaryEmbedding`` from
  ``chunk_size`` and ``local_size`` *before* looking at any RoPE scaling, with base ``rope_theta`` and
  ``rotary_dim = head_size · partial_rotary_factor``: plain RoPE. Its tables (``dual_chunk_rope.py``), with
  ``L = chunk_size − local_size``: keys at ``j mod L``; queries at ``i mod L`` (intra), ``min(i mod L + L,
  chunk_size)`` (successive) and, for every earlier chunk, the successive table's last row ``min(2L − 1,
  chunk_size)`` — ``chunk_size`` whenever ``2·local_size < chunk_size``, which ropekit requires. That is this method
  position for position.
* The attention backend ``DUAL_CHUNK_FLASH_ATTN`` (``attention/backends/dual_chunk_flash_attn.py``) reads
  ``chunk_size`` (default 8192), ``local_size`` (default 1024), ``original_max_position_embeddings`` (default 0)
  and ``sparse_attention_enabled`` / ``sparse_attention_config`` / ``_threshold`` / ``_last_q``. When
  ``original_max_position_embeddings > 0`` it multiplies keys and the softmax scale by ``0.1·ln(n/C) + 1`` (a
  temperature ropekit's DCA does not have), and sparse attention drops keys: ropekit writes neither. It requires
  ``L`` to be a multiple of the KV-cache block size, and without chunked prefill (or a prefix-cache hit) a prompt's
  prefill has no block table and runs *plain* causal attention — so the command passes
  ``--enable-chunked-prefill`` and ``--block-size 16``.
* It is a V0-engine backend built on vllm-flash-attn (the rotary tables are allocated on ``cuda``): ``VLLM_USE_V1=0``
  and ``VLLM_ATTENTION_BACKEND=DUAL_CHUNK_FLASH_ATTN`` as in Qwen's Qwen2.5-1M instructions, a CUDA GPU, and a vLLM
  that still has the V0 engine; vLLM's CPU build cannot run it. Such a vLLM reads ``rope_theta`` from the top level
  of the config (transformers 4.x names), hence the ``rope_theta`` override.
* Only the model files of the families in :data:`DUAL_CHUNK_FAMILIES` hand the config to their rotary embedding and
  attention; sliding-window layers are refused by the backend.
"""

from __future__ import annotations

from .dual_chunk_attention import make_dual_chunk
from ..errors import InvalidParameterError
from .abf import DECLARED_FACTOR
from .base import AttentionSpec, EngineConfig, EngineServing, Method, Param, original_window, register


#: Model types whose vLLM model file passes ``dual_chunk_attention_config`` to ``get_rope`` and ``Attention``.
DUAL_CHUNK_FAMILIES = ("qwen2", "qwen3")
#: The KV-cache block size the serve command sets; vLLM's DCA needs ``chunk_size − local_size`` to be a multiple.
DUAL_CHUNK_BLOCK_SIZE = 16
#: Environment of a vLLM process serving Dual Chunk Attention (its backend exists in the V0 engine only).
DUAL_CHUNK_ENV = {"VLLM_ATTENTION_BACKEND": "DUAL_CHUNK_FLASH_ATTN", "VLLM_USE_V1": "0"}
#: The config.json key vLLM reads Dual Chunk Attention from.
DUAL_CHUNK_KEY = "dual_chunk_attention_config"


def _local_default(info):
    """1/32 of the window (Qwen2.5-1M's 8,192 of 262,144)"""
    return max(1, info.window // 32)


@register
class DualChunk(Method):
    """Dual Chunk Attention (An et al. 2024, ICML, arXiv 2402.17463, §3; ChunkLlama; vLLM's form for Qwen2.5-1M).

    Positions are cut into chunks of ``L = chunk_size − local_size`` tokens; keys sit at ``j mod L``, and a query
    at ``i mod L`` against its own chunk (intra-chunk: the true distance), at ``min(i mod L + L, chunk_size)``
    against the previous chunk (successive-chunk: true distances for the first ``local_size + 1`` tokens of
    a chunk, ``i mod L ≤ local_size``) and at ``chunk_size`` against every earlier chunk (inter-chunk). Every relative position stays in
    ``[0, chunk_size]`` at any length: inside the pretrained distances with the paper's ceiling ``c − 1``, which is
    ``chunk_size = C − 1``, and one past them at the default ``chunk_size = C`` (the first key of each chunk);
    vLLM's ``dual_chunk_attention_config`` (Qwen2.5-1M: chunk 262,144, local 8,192) takes ``chunk_size`` itself. Frequencies stay the model's own; ``factor`` / ``target_length`` only declare the
    extended window. The attention is :mod:`ropekit.methods.dual_chunk_attention` (three restricted softmaxes merged by
    log-sum-exp, no n × n matrix); plain transformers has no such pattern, so the export is ropekit-only for
    transformers. vLLM computes the same positions itself on Qwen2/Qwen3 models with plain RoPE: the export then also
    writes vLLM's ``dual_chunk_attention_config`` (:meth:`vllm_config`; the module doc states what vLLM reads and
    when it is refused).

    Composition: the model's own frequencies are kept (on a pre-scaled model its scaled ones, which the chunked
    positions rotate with), and ``chunk_size`` defaults to the effective window.
    """

    name = "dual_chunk"
    title = "Dual Chunk Attention"
    summary = "Intra-, successive- and inter-chunk attention: relative positions never exceed chunk_size; no training."
    reference = "An et al. 2024, ICML, arXiv 2402.17463 (ChunkLlama); vLLM dual_chunk_attention_config (Qwen2.5-1M)"
    params = (
        Param("chunk_size", int, original_window, "the largest relative position used (vLLM's chunk_size)", minimum=2),
        Param("local_size", int, _local_default, "vLLM's local_size: a chunk's first local_size + 1 tokens see the "
              "previous chunk at true distances; chunks are chunk_size − local_size long", minimum=0),
        DECLARED_FACTOR,
    )
    changes = ("attention_pattern",)
    attention_access = ("rotates", "logits")
    needs_training = False
    uses_factor = False
    composition = "frequencies kept (the model's scaled ones, which the attention rotates with); window = the effective window"

    family = "Attention-side"

    def settings_line(self, info, params, requested=None):
        size, local = params["chunk_size"], params["local_size"]
        return f"chunk_size={size}, local_size={local} (chunks of {size - local}); distances ≤ {size}"

    def check(self, info, params):
        size, local = params["chunk_size"], params["local_size"]
        if size > info.window:
            raise InvalidParameterError(
                f"dual_chunk: chunk_size {size} is beyond the model's window {info.window}, so relative positions "
                "would reach distances it was never trained on",
                f"pass chunk_size ≤ {info.window}",
            )
        if 2 * local >= size:
            chunk = (f"the chunk of {size - local} tokens must be longer than the local part" if local < size
                     else "chunks are chunk_size − local_size tokens long")
            raise InvalidParameterError(
                f"dual_chunk: local_size {local} must be below half of chunk_size {size} ({chunk})",
                f"pass e.g. local_size={max(1, size // 32)}",
            )

    def inv_freq(self, info, params, seq_len=None, device=None):
        """The model's own frequencies: DCA changes only the positions the attention uses."""
        return self.base(info, seq_len, device)

    def attention(self, info, params):
        return AttentionSpec(
            layer_attention=make_dual_chunk,
            layer_attention_args={"chunk_size": int(params["chunk_size"]), "local_size": int(params["local_size"])},
        )

    def transformers_rope(self, info, params):
        return None

    def exports_to(self, params=None):
        """vLLM's own Dual Chunk Attention (``dual_chunk_attention_config``; Qwen2/Qwen3 models with plain RoPE, V0
        engine on CUDA) when ``chunk_size − local_size`` is a multiple of vLLM's KV-cache block size 16."""
        if params is not None and (int(params["chunk_size"]) - int(params["local_size"])) % DUAL_CHUNK_BLOCK_SIZE:
            return []
        return ["vllm (dual_chunk_attention_config)"]

    vllm_keys = (DUAL_CHUNK_KEY,)

    def vllm_config(self, info, params, *, sliding_layers=()):
        """vLLM's ``dual_chunk_attention_config`` for these parameters on a model with RoPE ``info``, or why not."""
        model_type = info.model_type
        if model_type not in DUAL_CHUNK_FAMILIES:
            return (f"vLLM serves Dual Chunk Attention only for {', '.join(DUAL_CHUNK_FAMILIES)} models "
                    f"(dual_chunk_attention_config), not '{model_type}'")
        if info.is_scaled:
            return (f"vLLM's dual-chunk rotary embedding uses plain RoPE (rope_theta), not this model's "
                    f"'{info.rope_type}' scaling that ropekit's dual_chunk rotates with")
        if info.partial_rotary_factor != 1.0:
            return "vLLM's dual-chunk RoPE would rotate the whole head, this model rotates part of it"
        if sliding_layers:
            return "vLLM's dual-chunk attention backend refuses models with sliding-window layers"
        chunk_len = int(params["chunk_size"]) - int(params["local_size"])
        if chunk_len % DUAL_CHUNK_BLOCK_SIZE:
            return (f"vLLM's dual-chunk attention needs chunk_size − local_size ({chunk_len}) to be a multiple of "
                    f"its KV-cache block size {DUAL_CHUNK_BLOCK_SIZE}")
        # no original_max_position_embeddings: vLLM would add its 0.1·ln(n/C) + 1 temperature; no sparse attention
        dca = {"chunk_size": int(params["chunk_size"]), "local_size": int(params["local_size"]),
               "sparse_attention_enabled": False}
        return EngineConfig(keys={DUAL_CHUNK_KEY: dca}, note=(
            "vLLM computes this model itself with its Dual Chunk Attention (`dual_chunk_attention_config` in "
            "config.json; V0 engine, CUDA): `ropekit export DIR --format vllm` prints the command."))

    def vllm_serve(self, config):
        """The serving plan of an export carrying ``dual_chunk_attention_config`` (module doc): the V0 backend's
        environment, chunked prefill with block size 16, and ``rope_theta`` at the top level."""
        dca = config[DUAL_CHUNK_KEY]
        if config.get("model_type") not in DUAL_CHUNK_FAMILIES:
            return f"vLLM serves Dual Chunk Attention only for {', '.join(DUAL_CHUNK_FAMILIES)} models"
        if int(dca.get("original_max_position_embeddings") or 0) > 0 or dca.get("sparse_attention_enabled"):
            return ("its dual_chunk_attention_config turns on vLLM's temperature or sparse attention, which ropekit's "
                    "dual_chunk does not compute")
        base = ((config.get("ropekit") or {}).get("base") or {}).get("rope_parameters") or {}
        theta = base.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
        return EngineServing(hf_overrides={"rope_theta": theta}, env=dict(DUAL_CHUNK_ENV),
                             args=("--block-size", str(DUAL_CHUNK_BLOCK_SIZE), "--enable-chunked-prefill",
                                   "--enforce-eager"))
