"""CLEX: continuous, length-dependent frequency scaling learned as a neural ODE (the ODE is in :mod:`.clex_ode`)."""

from __future__ import annotations

import math
import warnings

import torch

from ..errors import InvalidParameterError
from .base import ROPE_THETA, Method, Param, combine_length_dependence, original_window, register
from .clex_ode import CLEXFrequencies, attach_clex
from ..core.rope import default_inv_freq

#: t_max when neither ``max_factor`` nor a target is given (the reference code's default; LCEG used 32 on
#: Llama-2-7B, 16 on Llama-3-8B and 64 on Phi-2 — LCEG (Lu et al. 2024), appendix "implementation details").
DEFAULT_MAX_FACTOR = 16


def _default_max_factor(info):
    """⌈factor⌉ when a factor or target length is given, else 16"""
    return DEFAULT_MAX_FACTOR


@register
class CLEX(Method):
    """CLEX (Chen et al. 2024, ICLR, arXiv 2310.16450 §3; LCEG (Lu et al. 2024) §3 and appendix; docs/methods-reference.md §7).

    The log-frequencies ``z(t) = log θ(t)`` follow ``dz/dt = W_down·σ(W_up·(z + log ξ(t))) + ∂_t log ξ(t)``
    from ``z(1) = log θ``, ``ξ(t)`` the NTK-aware basis at ``α = 2t − 1`` (:mod:`ropekit.methods.clex_ode`).
    The ODE's weights are trained with the model: each training step draws a scale ``t ∈ {1 … t_max}`` and
    sees ``n`` positions spread over ``[0, n·t)`` (:meth:`training_step_hook`). At inference ``t = n/C``
    (``inference_scale='continuous'``) or ``⌈n/C⌉`` (``'ceil'``, the reference code), capped at ``t_max``;
    inputs within the window get the model's own frequencies, bit-identically. ``n`` is each batch row's own
    length (its largest position + 1), so a padded row runs at its own ``t``, as it would alone.

    Cached decoding past the window is not CLEX's reference behaviour: the reference (DAMO-NLP-SG/CLEX,
    ``modeling_llama_clex.py``) caches keys before RoPE and re-rotates them all at the current ``t`` each step,
    while here the cache holds keys rotated at the ``t`` of the call that cached them, so a decode step whose
    ``t`` has moved since differs from a full forward (as with transformers' dynamic NTK). The first such step
    warns once per process. Exact alternatives: full forwards (``use_cache=False``); with
    ``inference_scale='ceil'``, ``t`` moves only when the length crosses a multiple of ``C`` and decode steps
    between crossings are exact (:mod:`ropekit.methods.clex_ode`).

    ``W_down`` starts at zero, so before training CLEX is NTK-aware scaling with ``α = 2t − 1`` applied at
    the input's own scale — and plain RoPE within the window.

    Installed as rope type ``ropekit_clex`` (frequencies at ``t = 1``) plus the ODE module ``clex`` on every
    rotary-embedding module; plain transformers has nothing equivalent, so the export is ropekit-only and
    ``ropekit.load`` restores the trained ODE weights from the checkpoint.

    Composition: the ODE starts from the effective frequencies, ``z(1) = log θ^eff``, with ``t = n/C`` for ``C``
    the effective window and the model's own attention factor — so the untrained ODE is NTK's per-pair ratio
    ``(2t − 1)^(−2i/(d−2))`` applied to ``θ^eff``. Refused on a base whose frequencies themselves change with
    the length (transformers' ``dynamic``, LongRoPE with two sets): two schedules would have to be composed.
    """

    name = "clex"
    title = "CLEX (continuous length extrapolation)"
    summary = "Frequencies as a learned, continuous function of the length (neural ODE on log θ); trained."
    reference = "Chen et al. 2024, ICLR, arXiv 2310.16450 (CLEX); LCEG (Lu et al. 2024, arXiv 2409.12181) §3"
    params = (
        Param("max_factor", int, _default_max_factor, "t_max: the largest scale trained and served; inputs "
              "beyond t_max·C reuse t_max", minimum=1),
        Param("factor", float, None, "target length / window: sets max_factor = ⌈factor⌉ when it is not given",
              minimum=1.0),
        Param("time_dt", float, 0.01, "step of the fixed-step RK4 integrator (the reference's time_dt)",
              minimum=0.0, exclusive_minimum=True, maximum=1.0),
        Param("param_factor", int, 1, "ODE network width = param_factor × rotary dimension (the amplification)",
              minimum=1),
        Param("act", str, "tanh", "ODE network activation σ (LCEG: silu on Llama, tanh on Phi-2)",
              choices=("tanh", "silu")),
        Param("inference_scale", str, "continuous", "t from the length n: n/C (continuous) or ⌈n/C⌉ (the "
              "reference code)", choices=("continuous", "ceil")),
        Param("original_max_position_embeddings", int, original_window, "pretrained window C the scale is "
              "relative to", minimum=2),
        Param("init_seed", int, 0, "seed of W_up's random initialisation (W_down starts at zero)", minimum=0),
        ROPE_THETA,
    )
    changes = ("frequencies", "length_dependent", "weights")
    needs_training = True
    uses_factor = False
    schedules_itself = True
    replaces_rotary_output = True

    def settings_line(self, info, params, requested=None):
        return f"ODE-evolved frequencies, t ≤ {params['max_factor']:g} (untrained ODE = NTK with α = 2t − 1)"

    def resolve(self, info, given):
        params = super().resolve(info, given)
        factor, max_factor = params["factor"], params["max_factor"]
        if factor is None:
            return params
        if given.get("max_factor") is None:
            params["max_factor"] = math.ceil(factor - 1e-9)
        elif max_factor != math.ceil(factor - 1e-9):
            raise InvalidParameterError(
                f"clex: max_factor {max_factor} contradicts factor {factor:g} (which sets max_factor "
                f"{math.ceil(factor - 1e-9)})",
                "pass only one of max_factor and factor (or target_length)",
            )
        return params

    def not_applicable(self, info):
        if info.rotary_dim <= 2:
            return "needs a rotary dimension above 2 (the NTK time embedding divides by d − 2)"
        return None

    def check(self, info, params):
        why = self.not_applicable(info)
        if why is not None:
            raise InvalidParameterError(f"clex {why}", "use a model with a rotary dimension of at least 4")

    composition = "the ODE starts from the effective frequencies, z(1) = log θ^eff, and t = n/C on the effective window"

    def length_dependence(self, info, params):
        return combine_length_dependence(super().length_dependence(info, params),
                                         ("continuous", params["original_max_position_embeddings"]))

    def frequencies_at(self, rotary, seq_len, layer_type=None):
        """The ODE's frequencies for an input of ``seq_len`` tokens (``t = n/C``), with the model's attention factor."""
        base = rotary.inv_freq
        if seq_len is None:
            return base.clone(), rotary.attention_scaling
        with torch.no_grad():
            return rotary.clex.inv_freq_for_length(int(seq_len), base), rotary.attention_scaling

    def inv_freq(self, info, params, seq_len=None, device=None):
        """The frequencies at ``t = 1`` (the model's own): the rotary module's starting point ``z(1) = log θ``."""
        if info.is_scaled:
            return self.base(info, seq_len, device)
        return default_inv_freq(params["rope_theta"], info.rotary_dim, device), 1.0

    def max_position_embeddings(self, info, params):
        return int(params["original_max_position_embeddings"]) * int(params["max_factor"])

    def attach(self, rotary, info, params) -> None:
        """Give ``rotary`` the ODE module ``clex`` and let it compute cos/sin (:func:`.clex_ode.attach_clex`)."""
        attach_clex(rotary, CLEXFrequencies(
            info.rotary_dim,
            rope_theta=params["rope_theta"],
            window=params["original_max_position_embeddings"],
            max_factor=params["max_factor"],
            time_dt=params["time_dt"],
            param_factor=params["param_factor"],
            act=params["act"],
            inference_scale=params["inference_scale"],
            init_seed=params["init_seed"],
            device=rotary.inv_freq.device,
        ))

    def own_weights(self, model):
        """The ODE's weights ``φ`` (``up_proj``, ``down_proj`` of every :class:`CLEXFrequencies`): CLEX learns them
        jointly with the model (§3), so they train under LoRA too."""
        return [p for module in model.modules() if isinstance(module, CLEXFrequencies) for p in module.parameters()]

    def training_step_hook(self, model, step, generator) -> None:
        """Draw this step's scale ``t ~ U{1 … t_max}`` (the reference's ``sample_random_times``) and the seed of its
        positions from ``generator``, for every CLEX module of ``model``."""
        for module in model.modules():
            if isinstance(module, CLEXFrequencies):
                if not module.up_proj.requires_grad and not getattr(module, "_warned_frozen", False):
                    module._warned_frozen = True
                    warnings.warn("clex: the ODE weights are frozen (requires_grad is off), so only the scale sampling "
                                  "applies", stacklevel=2)
                scale = int(torch.randint(1, module.max_factor + 1, (1,), generator=generator))
                seed = int(torch.randint(0, 2**62, (1,), generator=generator))
                module.set_training_scale(scale, seed)
