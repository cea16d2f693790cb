"""Self-Extend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning").

The rope stays plain; attention changes (:mod:`ropekit.methods.self_extend_attention`): neighbours closer than
``W`` keep their true relative positions, older keys are seen at grouped positions (floor division by
``G``), so every relative position stays inside the pretrained window up to the reach ``G·(C − W + ⌊W/G⌋)``
(the LongLM README's ``(C − W)·G + W`` when ``G`` divides ``W``).
"""

from __future__ import annotations

import math

from .self_extend_attention import make_self_extend, self_extend_reach
from ..errors import InvalidParameterError
from .base import AttentionSpec, Method, Param, RopeInfo, register

#: Group size when neither ``group_size`` nor a target (``factor`` / ``target_length``) is given: the LongLM
#: README's example (G = 32 with W = 1024 reaches 99,328 tokens on a 4k Llama-2).
DEFAULT_GROUP_SIZE = 32
#: Neighbour window of the LongLM README and of LCEG's runs (W = 1024 on 4k Llama-2, i.e. C/4).
DEFAULT_WINDOW_SIZE = 1024


def default_window_size(info: RopeInfo) -> int:
    """1024 (LongLM README, LCEG), or C/4 on models whose window C is below 4096 (the same W/C as Llama-2)"""
    return max(1, min(DEFAULT_WINDOW_SIZE, info.window // 4))


def smallest_group_size(window: int, window_size: int, target: int) -> int:
    """The smallest ``G ≥ 1`` whose reach :func:`self_extend_reach` covers ``target`` tokens.

    Starts from the LongLM README's bound ``(C − W)·G + W ≥ target``, which no smaller ``G`` meets (the reach is
    at most that), and steps up while ``⌊W/G⌋`` leaves the reach short.
    """
    group = max(1, math.ceil((target - window_size) / (window - window_size)))
    while self_extend_reach(window, group, window_size) < target:
        group += 1
    return group


@register
class SelfExtend(Method):
    """Self-Extend (Jin et al. 2024, arXiv 2401.01325 §3, and its code; LCEG (Lu et al. 2024) Eq. 13 restates it with
    ``⌊(i − j)/G⌋``, which can differ by one from the per-position floors ``⌊i/G⌋ − ⌊j/G⌋`` used here).

    For a query at ``i`` and a key at ``j ≤ i`` the relative position is ``i − j`` when ``i − j < W``, else
    ``(⌊i/G⌋ + W − ⌊W/G⌋) − ⌊j/G⌋`` (floor division — the paper's definition; LongLM's 4.38 code used ``/``
    for the query and is wrong when ``G ∤ W``). No training; the frequencies are the model's own.

    ``group_size`` G defaults to the smallest one whose reach ``G·(C − W + ⌊W/G⌋)`` (the LongLM README's
    ``(C − W)·G + W`` when ``G`` divides ``W``) covers ``factor·C`` when a
    target is given, else 32 (README example). ``window_size`` W defaults to 1024 (README, LCEG) capped at
    C/4 on small models, and must stay below the window C.

    Composition: the frequencies are the model's own scaled ones ``θ^eff`` (and its attention factor), and the
    grouped queries and keys are re-rotated with the same ``θ^eff`` at every length (on a switching LongRoPE
    base, the set of the current length); ``C`` in the defaults and the reach is the effective window.
    """

    name = "self_extend"
    title = "Self-Extend"
    summary = "Tuning-free: neighbours keep true positions, far keys are seen at grouped (floor(pos/G)) positions."
    reference = "Jin et al. 2024, arXiv 2401.01325 §3; LCEG (Lu et al. 2024, arXiv 2409.12181) §3"
    params = (
        Param("group_size", int, None, "G: far keys are seen at floor(position/G) (default: smallest G whose "
              "reach covers factor·C, else 32)", minimum=1),
        Param("window_size", int, default_window_size, "W: keys closer than W keep their true relative position "
              "(must be below the model's window)", minimum=1),
        Param("factor", float, None, "target length / window: picks group_size when it is not given", minimum=1.0),
    )
    changes = ("attention_pattern",)
    attention_access = ("rotates", "logits")
    needs_training = False
    composition = "frequencies kept (the model's scaled ones, which the attention rotates with); window = the effective window"

    family = "Attention-side"

    def sized_by_target(self, params):
        # a group size given sets the reach G·(C − W + ⌊W/G⌋) on its own
        return super().sized_by_target(params) and "group_size" not in params

    def settings_line(self, info, params, requested=None):
        return f"G={params['group_size']}, W={params['window_size']} (reach {self.reach(info, params)})"

    def resolve(self, info, given):
        params = super().resolve(info, given)
        window, w = info.window, params["window_size"]
        if params["group_size"] is None:
            if params["factor"] is not None and params["factor"] > 1.0:
                target = math.ceil(params["factor"] * window - 1e-6)
                params["group_size"] = smallest_group_size(window, w, target)
            else:
                params["group_size"] = DEFAULT_GROUP_SIZE
        self._check_reach(info, params)
        return params

    def check(self, info, params):
        w, window = params["window_size"], info.window
        if w >= window:
            raise InvalidParameterError(
                f"self_extend: window_size {w} must be below the model's window ({window} tokens)",
                f"pass e.g. --param window_size={max(1, min(DEFAULT_WINDOW_SIZE, window // 4))}",
            )

    def _check_reach(self, info, params) -> None:
        factor = params["factor"]
        if factor is None:
            return
        target = math.ceil(factor * info.window - 1e-6)
        reach = self.reach(info, params)
        if reach < target:
            need = smallest_group_size(info.window, params["window_size"], target)
            raise InvalidParameterError(
                f"self_extend: group_size {params['group_size']} reaches only {reach} tokens, below the target {target}",
                f"pass group_size ≥ {need} or leave it out to derive it",
            )

    def reach(self, info, params):
        """The longest input whose pairs all stay inside the window (:func:`.self_extend_attention.self_extend_reach`)."""
        return self_extend_reach(info.window, params["group_size"], params["window_size"])

    def max_position_embeddings(self, info, params):
        return self.reach(info, params)

    def inv_freq(self, info, params, seq_len=None, device=None):
        """The model's own frequencies: Self-Extend changes only attention."""
        return self.base(info, seq_len, device)

    def attention(self, info, params):
        return AttentionSpec(
            layer_attention=make_self_extend,
            layer_attention_args={
                "group_size": params["group_size"],
                "window_size": params["window_size"],
                "reach": self.reach(info, params),
            },
        )

    def transformers_rope(self, info, params):
        return None

    def exports_to(self, params=None):
        return []
