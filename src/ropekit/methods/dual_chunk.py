"""Dual Chunk Attention: chunked relative positions that never exceed the window; training-free."""

from __future__ import annotations

from ..attention.dual_chunk import make_dual_chunk
from ..errors import InvalidParameterError
from .abf import DECLARED_FACTOR
from .base import AttentionSpec, Method, Param, original_window, register


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
    ``[0, chunk_size]``, inside the pretrained window, at any length. The paper's ceiling ``c − 1`` is
    ``chunk_size = C − 1``; vLLM's ``dual_chunk_attention_config`` (Qwen2.5-1M: chunk 262,144, local 8,192) takes
    ``chunk_size`` itself. Frequencies stay the model's own; ``factor`` / ``target_length`` only declare the
    extended window. The attention is :mod:`ropekit.attention.dual_chunk` (three restricted softmaxes merged by
    log-sum-exp, no n × n matrix); plain transformers has no such pattern, so the export is ropekit-only for
    transformers. vLLM computes the same positions itself on Qwen2/Qwen3 models with plain RoPE: the export then also
    writes vLLM's ``dual_chunk_attention_config`` (:mod:`ropekit.install.vllm`, which states what vLLM reads and
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

    def check(self, info, params):
        size, local = params["chunk_size"], params["local_size"]
        if size > info.window:
            raise InvalidParameterError(
                f"dual_chunk: chunk_size {size} is beyond the model's window {info.window}, so relative positions "
                "would reach distances it was never trained on",
                f"pass chunk_size ≤ {info.window}",
            )
        if 2 * local >= size:
            raise InvalidParameterError(
                f"dual_chunk: local_size {local} must be below half of chunk_size {size} (the chunk of "
                f"{size - local} tokens must be longer than the local part)",
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
        if params is not None and (int(params["chunk_size"]) - int(params["local_size"])) % 16:
            return []
        return ["vllm (dual_chunk_attention_config)"]
