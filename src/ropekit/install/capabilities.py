"""One capability check: which methods a model can take exactly, and why not otherwise.

``inspect`` lists a method as applicable exactly when ``extend`` accepts it, because both ask
:func:`why_not` here. A model's relevant features are read from the model itself (:func:`model_features`):
the rotary layout its own code applies, where the rotated channels sit, an attention-logit softcap,
attention sinks, sliding-window layers, RoPE per layer type, and the RoPE scaling it already carries. Every
refusal is one line naming the family, the feature and what to use instead.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..adapters.transformers import attention_modules, model_file_global, rotary_attention_factor, rotary_modules
from ..core.base_rope import length_dependence
from ..core.rope_info import RopeInfo, layer_rope_types
from ..errors import RopekitError
from ..methods import Method
from .model_rope import rope_info, text_config

#: What a method's attention-side part does with the attention computation (``Method.attention_access``):
#: ``rotates`` — re-rotates queries/keys in the model's rotary layout; ``logits`` — computes attention itself.
ACCESS = ("rotates", "logits")


@dataclass(frozen=True)
class ModelFeatures:
    """What decides whether a method applies exactly to a model."""

    family: str
    rope_type: str
    window: int
    rotary_layout: str  # "half" (the two halves pair up) or "interleaved" (adjacent channels pair up)
    rotary_position: str  # "leading" (the first d channels rotate) or "trailing" (MLA: a slice at the end)
    rotary_output: str  # "standard" (cos/sin of the two halves' angles) or "other" (its own format)
    softcap: float | None
    sinks: bool
    sliding_layers: tuple[int, ...]
    full_layers: tuple[int, ...]
    layer_rope_types: tuple[str, ...]
    length_dependence: str
    attention_interface: bool = True  # its attention runs through transformers' AttentionInterface
    nope_layers: tuple[int, ...] = ()  # layers whose attention applies no RoPE
    #: Where RoPE applies is decided outside the attention (its decoder passes position embeddings to some
    #: layers only), so ``nope_layers`` cannot be read off the attention module.
    rope_layers_unknown: bool = False
    #: Attention modules found, and the decoder's layers: fewer modules than layers is a hybrid (linear attention or
    #: state-space layers between them), whose layer numbering ropekit's attention transforms do not follow.
    attention_layers: int = 0
    layers: int = 0
    #: Why ropekit's rope type would not reach the rotary modules the layers use, or "" (they are built from
    #: copies of the config, or recompute their frequencies from config keys of their own at every call).
    rotary_unreached: str = ""

    def describe(self) -> dict:
        """JSON-ready facts for ``ropekit inspect``."""
        return {
            "rotary_layout": self.rotary_layout,
            "rotary_position": self.rotary_position,
            "rotary_output": self.rotary_output,
            "attention_softcap": self.softcap,
            "attention_sinks": self.sinks,
            "sliding_window_layers": list(self.sliding_layers),
            "rope_per_layer_type": list(self.layer_rope_types),
            "attention_interface": self.attention_interface,
            "layers_without_rope": None if self.rope_layers_unknown else list(self.nope_layers),
            "rope_length_dependence": self.length_dependence,
        }


def _rotary_layout(model) -> str:
    """Ask the model file's own ``rotate_half`` (the function its attention applies) which channels pair up. A file
    without one that rotates adjacent pairs its own way — as complex numbers (Llama 4's ``view_as_complex``) or with
    ``rotate_every_two`` (GPT-J, CodeGen) — is interleaved."""
    if model_file_global(model, "rotate_every_two") is not None:
        return "interleaved"
    rotate = model_file_global(model, "rotate_half")
    if rotate is None:
        try:
            source = inspect.getsource(sys.modules[type(model).__module__])
        except (KeyError, OSError, TypeError):
            return "half"
        return "interleaved" if "view_as_complex(" in source else "half"
    probe = rotate(torch.arange(4.0))
    return "half" if torch.equal(probe, torch.tensor([-2.0, -3.0, 0.0, 1.0])) else "interleaved"


def _rotary_output(model) -> str:
    """Whether the rotary module returns ``(cos, sin)`` of ``[θ·m, θ·m]`` times its attention factor — the form a
    method that computes cos/sin itself (CLEX) must reproduce — probed on four positions."""
    modules = [m for m in model.modules() if hasattr(m, "rope_type") and hasattr(m, "inv_freq")]
    if not modules:
        return "other"
    rotary = modules[0]
    inv_freq = rotary.inv_freq.float()
    positions = torch.arange(4, device=inv_freq.device)[None]
    with torch.no_grad():
        out = rotary(torch.zeros(1, 4, 2 * inv_freq.numel(), device=inv_freq.device), positions)
    if not isinstance(out, tuple) or len(out) != 2 or out[0].shape[-1] != 2 * inv_freq.numel():
        return "other"
    angles = positions[..., None].float() * inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    scale = rotary_attention_factor(rotary)
    standard = torch.allclose(out[0].float(), emb.cos() * scale, atol=1e-6) and torch.allclose(
        out[1].float(), emb.sin() * scale, atol=1e-6
    )
    return "standard" if standard else "other"


def _dispatches_attention(cls) -> bool:
    """Whether the family's attention runs through transformers' AttentionInterface (Falcon's does not): its flag
    for custom attention functions, or transformers' own test of whether the implementation can be switched (which
    reads the model file for the interface call; StableLM uses the interface without the flag)."""
    if getattr(cls, "_supports_attention_backend", False):
        return True
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    return bool(can_set()) if callable(can_set) else False


#: The conditions under which transformers' model files apply RoPE in an attention module (the ``if`` right before
#: ``apply_rotary_pos_emb``), and when a module under each applies none.
_ROPE_GUARDS = {
    # SmolLM3, Llama 4, Mistral Large 4: `no_rope_layers`
    "self.use_rope": lambda m: not m.use_rope,
    # AFMoE: RoPE on the local (sliding) layers only
    "self.is_local_attention": lambda m: not m.is_local_attention,
    # Cohere 2 MoE: RoPE where the layer slides, or where the config forces it
    "self.sliding_window is not None or self.force_rope": lambda m: m.sliding_window is None and not m.force_rope,
    # EXAONE 4 / 4.5 / MoE: global NoPE in hybrid models
    "self.sliding_window is None or self.is_sliding": lambda m: m.sliding_window is not None and not m.is_sliding,
    # Cohere 2: RoPE only where the layer slides
    "self.sliding_window is not None": lambda m: m.sliding_window is None,
}


@functools.lru_cache(maxsize=None)
def _rope_guard(cls) -> str | None:
    """The condition ``cls.forward`` applies RoPE under, read off its source (None: always, or unreadable)."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return None
    for guard in (*_ROPE_GUARDS, _CALLER_GUARD):
        # the guard's `if` (a comment may follow), then the rotation inside its block (indented deeper, before the
        # block ends): apply_rotary_pos_emb, Llama 4's apply_rotary_emb
        found = re.search(rf"^(\s*)if {re.escape(guard)}:[ \t]*(?:#.*)?\n((?:\1\s+.*\n|\s*\n)*?)\1\s+.*apply_rotary\w*\(",
                          source, re.MULTILINE)
        if found:
            return guard
    return None


#: The guard of attention modules that rotate whenever their decoder passes them position embeddings (LaraMini,
#: Granite SWA and hybrid, Beam, MuseSpark): which layers get none is decided by the decoder, not by the module.
_CALLER_GUARD = "position_embeddings is not None"


def _rope_layers_unknown(model) -> bool:
    """Whether some attention module applies RoPE only when its caller passes position embeddings."""
    return any(_rope_guard(type(module)) == _CALLER_GUARD for module in attention_modules(model))


def _rotary_unreached(model, config) -> str:
    """Why a rope type ropekit writes into the config would not reach the rotary modules the layers use, or ""."""
    for _, _, rotary in rotary_modules(model):
        own = getattr(rotary, "config", None)
        if own is not None and own is not config and type(own) is type(config):
            return ("its rotary embeddings are built from copies of the config (RoPE bases per layer), which the "
                    "config's rope type ropekit writes does not reach")
        try:
            forward = inspect.getsource(type(rotary).forward)
        except (OSError, TypeError):
            continue
        if "rope_init_fn(self.config)" in forward:
            return ("its rotary embedding recomputes its frequencies from the config at every call and reads "
                    "scaling keys of its own (short_mscale, long_mscale) for any scaled rope type")
    return ""


def _nope_layers(model) -> tuple[int, ...]:
    """The layers whose attention applies no RoPE, as the model file decides (:data:`_ROPE_GUARDS`)."""
    found = []
    for module in attention_modules(model):
        guard = _rope_guard(type(module))
        try:
            if guard in _ROPE_GUARDS and _ROPE_GUARDS[guard](module):
                found.append(int(module.layer_idx))
        except AttributeError:  # a module without the attributes its own condition names: take it as RoPE
            continue
    return tuple(sorted(found))


def _layer_kinds(config) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(sliding, full)`` layer indices: from ``layer_types``, else every layer slides when a window is set."""
    layers = int(config.num_hidden_layers)
    types = getattr(config, "layer_types", None)
    if types:
        sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    elif getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        sliding = tuple(range(layers))
    else:
        sliding = ()
    return sliding, tuple(i for i in range(layers) if i not in sliding)


def model_features(model) -> ModelFeatures:
    """The features of ``model`` that decide which methods apply (its RoPE facts raise when it has none)."""
    config = text_config(model)
    info: RopeInfo = rope_info(model)
    sliding, full = _layer_kinds(config)
    has_sinks = any(isinstance(getattr(m, "sinks", None), torch.nn.Parameter) for m in model.modules())
    trailing = getattr(config, "qk_rope_head_dim", None) is not None and getattr(config, "qk_nope_head_dim", None)
    return ModelFeatures(
        family=info.model_type,
        rope_type=info.rope_type,
        window=info.window,
        rotary_layout=_rotary_layout(model),
        rotary_position="trailing" if trailing else "leading",
        rotary_output=_rotary_output(model),
        softcap=getattr(config, "attn_logit_softcapping", None),
        sinks=has_sinks,
        sliding_layers=sliding,
        full_layers=full,
        layer_rope_types=layer_rope_types(config),
        length_dependence=length_dependence(info)[0],
        attention_interface=_dispatches_attention(type(model)),
        nope_layers=_nope_layers(model),
        rope_layers_unknown=_rope_layers_unknown(model),
        attention_layers=len(attention_modules(model)),
        layers=int(config.num_hidden_layers),
        rotary_unreached=_rotary_unreached(model, config),
    )


class Refusal(NamedTuple):
    """Why a method cannot be installed exactly: one line (``problem``, ``fix``) and the feature in a word or two."""

    problem: str
    fix: str
    feature: str


def _switch_that_fits(method: Method, info: RopeInfo, params: dict | None) -> int | None:
    """The length a method with its own switch would have to switch at to combine with the model's switching RoPE
    (LongRoPE on Phi-3.5: the model's original window, not the effective one), when that setting is accepted."""
    kind, at = length_dependence(info)
    if kind != "switch" or params is None or params.get("original_max_position_embeddings") in (None, at):
        return None
    given = {k: v for k, v in params.items() if v is not None}
    try:
        moved = method.resolve(info, {**given, "original_max_position_embeddings": at})
    except RopekitError:
        return None
    return at if method.length_dependence(info, moved)[0] == kind else None


def why_not(method: Method, info: RopeInfo, features: ModelFeatures, params: dict | None = None, *,
            example: bool = True) -> Refusal | None:
    """A :class:`Refusal` when ``method`` (with resolved ``params``, or its :meth:`~Method.example_params`) cannot
    be installed exactly into a model with ``features``, else ``None``.

    ``example=False`` (with ``params=None``) asks only what holds whatever the parameters are: the installer asks it
    when the user's own parameters do not resolve, so that a refusal of the example setting (a switch length the
    user may have set right) does not hide the user's parameter error."""
    family = features.family
    generic = method.not_applicable(info)
    if generic is not None:
        return Refusal(f"{method.name} on {family}: {generic}", "use another method", "rotary dimension")
    if params is None and example:
        try:
            params = method.resolve(info, method.example_params(info))
        except RopekitError:
            params = None
    access = set(method.attention_access)
    rescales = bool({"frequencies", "frequencies_per_head", "length_dependent"} & set(method.changes))
    if features.rotary_unreached and (rescales or method.replaces_rotary_output):
        return Refusal(f"{method.name} on {family}: {features.rotary_unreached}",
                       "use the model as it is, or an attention-side method where its attention allows one",
                       "rotary modules out of reach")
    frequency_alternative = "use a frequency method (pi, ntk, yarn, llama3, longrope, abf, dynamic_ntk)"
    static_alternative = "use a method with static frequencies (pi, ntk, yarn, llama3, abf) or an attention-side method"
    combined = method.length_dependence(info, params)[0] if params is not None else features.length_dependence
    if features.length_dependence != "static":
        if method.schedules_itself:
            return Refusal(
                f"{method.name} on {family}: its frequencies follow the input length on a schedule of their own, "
                f"and this model's '{features.rope_type}' RoPE already changes with the length",
                static_alternative,
                "own length schedule",
            )
        if combined != features.length_dependence:
            how = ("are recomputed for each input's own length" if combined == "per_input"
                   else "switch at another length than this model's RoPE does")
            fix = static_alternative
            at = _switch_that_fits(method, info, params)
            if at is not None:  # LongRoPE's switch defaults to the effective window; the model's set switches earlier
                fix = (f"pass --param original_max_position_embeddings={at} to switch where this model's RoPE does, "
                       f"or {static_alternative}")
            return Refusal(
                f"{method.name} on {family}: its frequencies {how}, and this model's "
                f"'{features.rope_type}' RoPE already changes with the length on its own schedule",
                fix,
                "other switch length",
            )
        if "frequencies_per_head" in method.changes:
            return Refusal(
                f"{method.name} on {family}: its per-head rotation is fixed at installation, and this model's "
                f"'{features.rope_type}' RoPE changes with the input length",
                frequency_alternative,
                "length-dependent RoPE",
            )
    if "frequencies_per_head" in method.changes and features.rope_type != "default":
        return Refusal(
            f"{method.name} on {family}: its per-head bases replace plain RoPE, and this model's RoPE is already "
            f"scaled ('{features.rope_type}')",
            frequency_alternative,
            "already scaled",
        )
    if features.layer_rope_types:
        if "frequencies_per_head" in method.changes or "weights" in method.changes and "frequencies" in method.changes:
            return Refusal(
                f"{method.name} on {family}: this model has RoPE per layer type "
                f"({', '.join(features.layer_rope_types)}), and {method.name} replaces one RoPE for all layers",
                frequency_alternative,
                "RoPE per layer type",
            )
        if combined != "static":
            return Refusal(
                f"{method.name} on {family}: frequencies that change with the input length are not composed "
                f"with RoPE per layer type ({', '.join(features.layer_rope_types)})",
                static_alternative,
                "RoPE per layer type",
            )
    if access or {"logit_scale_per_position", "frequencies_per_head"} & set(method.changes):
        if features.layers and features.attention_layers != features.layers:
            # the installer's own count (install_transforms), asked here too so that inspect agrees with extend
            return Refusal(
                f"{method.name} on {family}: found {features.attention_layers} attention modules for "
                f"{features.layers} layers (the others are another kind of layer), and {method.name} changes the "
                "attention of every layer",
                frequency_alternative,
                "hybrid layers",
            )
    if access or "logit_scale_per_position" in method.changes:
        if not features.attention_interface:
            return Refusal(
                f"{method.name} on {family}: its attention does not run through transformers' AttentionInterface, "
                f"so {method.name}'s own attention would be recorded but never run",
                frequency_alternative,
                "no AttentionInterface",
            )
        if features.rope_layers_unknown and "rotates" in access:
            return Refusal(
                f"{method.name} on {family}: its attention applies RoPE only where the decoder passes position "
                f"embeddings, so which layers carry none cannot be read off the model, and {method.name} re-rotates "
                "queries and keys in every layer it changes",
                frequency_alternative,
                "layers without RoPE",
            )
        if features.nope_layers and "rotates" in access:
            layers = features.nope_layers
            shown = ", ".join(map(str, layers[:6])) + (", …" if len(layers) > 6 else "")
            return Refusal(
                f"{method.name} on {family}: layers {shown} apply no RoPE (NoPE), and {method.name} re-rotates "
                "queries and keys in every layer it changes",
                frequency_alternative,
                "layers without RoPE",
            )
    per_position = params is not None and method.position_dependent_rotation(params) is not None
    if (method.replaces_rotary_output or per_position) and features.rotary_output != "standard":
        return Refusal(
            f"{method.name} on {family}: the rotary embedding returns cos/sin in a form of its own, which "
            f"{method.name} (computing them itself) does not reproduce",
            frequency_alternative,
            "rotary output form",
        )
    if "rotates" in access:
        if features.rotary_position == "trailing":
            return Refusal(
                f"{method.name} on {family}: multi-head latent attention puts RoPE on a separate slice at the end "
                f"of each query and key, which {method.name} does not re-rotate",
                frequency_alternative,
                "MLA slice",
            )
        if features.rotary_layout != "half":
            return Refusal(
                f"{method.name} on {family}: the interleaved rotary layout (adjacent channels pair up) is not "
                f"the half-split layout {method.name} re-rotates queries and keys in",
                frequency_alternative,
                "interleaved layout",
            )
    if "logits" in access:
        if features.softcap:
            return Refusal(
                f"{method.name} on {family}: the attention-logit softcap ({features.softcap:g}) is not applied "
                f"by {method.name}'s own attention",
                frequency_alternative,
                "softcap",
            )
        if features.sinks:
            return Refusal(
                f"{method.name} on {family}: attention sinks are not part of {method.name}'s own attention",
                frequency_alternative,
                "sinks",
            )
        if not features.full_layers:
            return Refusal(
                f"{method.name} on {family}: every layer attends within a sliding window, so no layer has the "
                "long-range attention it changes",
                frequency_alternative,
                "all layers sliding",
            )
    return None
