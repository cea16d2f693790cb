"""Dynamic YaRN: YaRN whose scale factor follows the input length, so short inputs see the plain model."""

from __future__ import annotations

from .yarn import YaRN, yarn_mscale
from .base import FACTOR, ORIGINAL_WINDOW, ROPE_THETA, combine_length_dependence, register
from .ntk_by_parts import BETA_FAST, BETA_SLOW, BLEND, TRUNCATE, _ByParts, ramp_param


def length_factor(seq_len: int | None, window: int, cap: float) -> float:
    """``s(L) = min(max(1, L/C), s_max)``: the factor YaRN is evaluated at for an input of ``L`` tokens."""
    if seq_len is None:
        return 1.0
    return min(max(1.0, float(seq_len) / window), cap)


@register
class DynamicYaRN(_ByParts):
    """Dynamic YaRN (Peng et al. 2023, §3.4 "Dynamic Scaling" applied to YaRN; the per-request YaRN users ask
    engines for, vLLM #18728).

    For an input whose longest position is ``L − 1`` the frequencies and temperature are YaRN's at
    ``s(L) = min(max(1, L/C), s_max)`` (``s_max`` = ``factor``): NTK-by-parts ``θ'_i = (1 − γ_i)·θ_i/s(L) +
    γ_i·θ_i`` (YaRN §3.2, NTK-by-parts) and the attention factor ``0.1·ln s(L) + 1`` (YaRN §3.4's recommended temperature). Inside the window
    ``s = 1``: the plain model, bit for bit — what static YaRN loses on short prompts.

    Schedule: every input gets the factor of its own length (ropekit's length pre-hook on the rotary module),
    so a result never depends on what ran before — unlike transformers' dynamic rule, which keeps the longest
    length seen until an input fits the window again, and whose reset leaves the temperature at its last
    value. transformers' own update (it fires for rope types named ``dynamic``) only ever recomputes the same
    values: the declared window is the original one. The YaRN authors' own ``LlamaDynamicYaRNScaledRotaryEmbedding``
    (jquesnelle/yarn) differs too: it only ever grows the factor, never resets it, has no cap and can start from a
    fine-tuned factor; ropekit follows §3.4's definition, ``s`` from the current length.

    KV cache: as with transformers' Dynamic NTK, keys already cached keep the rotation and temperature of
    the factor they were computed with; when generation grows the input past the window, later queries use
    a larger factor than the cached keys (measured in ``tests/methods/test_dynamic_yarn.py``: cached and
    uncached next-token log-probabilities then differ, while inside the window they agree exactly). Prefill
    the whole prompt plus the expected generation length, or use static YaRN, where that matters.

    Composition: as YaRN's, at the factor ``s(L)``.
    """

    name = "dynamic_yarn"
    title = "Dynamic YaRN"
    summary = "YaRN at s = L/C for an input of L tokens (capped at factor): the plain model inside the window."
    reference = "Peng et al. 2023, arXiv 2309.00071, §3.4: the §3.2 frequencies and the §3.4 temperature at s = L/C (§3.3); vLLM #18728"
    params = (FACTOR, ORIGINAL_WINDOW, BETA_FAST, BETA_SLOW, BLEND, ramp_param("dim"), TRUNCATE, ROPE_THETA)
    changes = ("frequencies", "attention_factor", "length_dependent")

    family = "YaRN & LongRoPE"

    demo_params = YaRN.demo_params  # the same demo ramp as YaRN's

    def settings_line(self, info, params, requested=None):
        s = params.get("factor", 1.0)
        return f"s=min(L/{params['original_max_position_embeddings']}, {s:g}), β={params['beta_fast']:g}, α={params['beta_slow']:g}"

    def length_dependence(self, info, params):
        own = ("per_input", params["original_max_position_embeddings"]) if params["factor"] > 1.0 else ("static", None)
        return combine_length_dependence(super().length_dependence(info, params), own)

    def inv_freq(self, info, params, seq_len=None, device=None):
        length = None if seq_len is None else int(seq_len)
        factor = length_factor(length, params["original_max_position_embeddings"], params["factor"])
        inv_freq, model_factor = self.scaled_inv_freq(info, {**params, "factor": factor}, seq_len, device)
        return inv_freq, model_factor * yarn_mscale(factor)

    def max_position_embeddings(self, info, params):
        # transformers starts its own dynamic update past the declared window: it must be the original one
        return int(params["original_max_position_embeddings"])
