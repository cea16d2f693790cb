"""The RoPE facts of a model, read from its transformers config: what every method and attention function
needs to know about the model it works on, and nothing about the model object itself."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import UnsupportedModelError


@dataclass(frozen=True)
class RopeInfo:
    """The RoPE facts of a model, read from its transformers config."""

    model_type: str
    rope_type: str
    rope_theta: float
    head_dim: int
    rotary_dim: int
    partial_rotary_factor: float
    window: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    #: The model's own ``rope_parameters`` (a copy): what its effective frequencies are computed from when its
    #: RoPE is already scaled (``llama3``, ``yarn``, ``longrope``, …); ``None`` means plain RoPE.
    rope_parameters: dict[str, Any] | None = field(default=None, compare=False)
    #: ``config.max_position_embeddings`` when it differs from :attr:`window` (a scaled model whose config
    #: under-declares its scaled window, e.g. Qwen with ``yarn`` added): transformers' rope functions read it.
    config_window: int | None = None
    #: For RoPE per layer type (Gemma 3): which layer type these facts describe.
    layer_type: str | None = None

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def is_scaled(self) -> bool:
        """Whether the model's RoPE is already scaled (any rope type but plain ``default``)."""
        return self.rope_type != "default"

    @property
    def original_window(self) -> int:
        """The pretrained window before the model's own scaling (``original_max_position_embeddings``; for plain
        RoPE, the window itself)."""
        value = (self.rope_parameters or {}).get("original_max_position_embeddings")
        return int(value) if value else self.window

    @classmethod
    def from_config(cls, config, layer_type: str | None = None) -> "RopeInfo":
        """Read the RoPE facts of a transformers 5.x config; raise a one-line error when it has no RoPE.

        Models with RoPE per layer type (Gemma 3: ``sliding_attention`` and ``full_attention``) describe one
        type: ``layer_type``, by default the full-attention one — the global layers that see the whole input.
        """
        model_type = getattr(config, "model_type", "unknown")
        rope = getattr(config, "rope_parameters", None)
        types = layer_rope_types(config)
        if types:
            chosen = layer_type or primary_layer_type(types)
            if chosen not in types:
                raise UnsupportedModelError(f"model type '{model_type}' has no RoPE for layer type '{chosen}'",
                                            f"choose one of {', '.join(types)}")
            rope, layer_type = rope[chosen], chosen
        elif layer_type is not None:
            raise UnsupportedModelError(f"model type '{model_type}' has one RoPE for every layer, not per layer type",
                                        "leave layer_types out")
        if not rope or "rope_theta" not in rope or rope.get("rope_theta") is None:
            own = _own_rotary_setting(config)
            if own:
                # GPT-J, CodeGen: the attention builds its own sinusoid table (base 10,000 in the model file),
                # so there is no frequency setting a method could write
                raise UnsupportedModelError(
                    f"model type '{model_type}' rotates q/k with a table its attention module builds itself "
                    f"({own}), outside transformers' rope_parameters, so no method can reach its frequencies",
                    "ropekit extends models whose config carries rope_parameters, such as Llama, Mistral, "
                    "Qwen2/3, Phi-3 and GPT-NeoX",
                )
            raise UnsupportedModelError(
                f"model type '{model_type}' has no rotary position embedding (RoPE)",
                "ropekit extends RoPE models such as Llama, Mistral, Qwen2/3, Phi-3 and GPT-NeoX",
            )
        _check_numbers(model_type, rope, config)
        num_heads = config.num_attention_heads
        try:
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        except RuntimeError as e:
            if type(e).__name__ != "AmbiguousGlobalPerLayerAttributeError":
                raise
            # transformers' heterogeneous configs (Gemma 4): head_dim and more differ between layers
            raise UnsupportedModelError(
                f"model type '{model_type}' sets its attention shape per layer (its config refuses one global "
                "head_dim), which ropekit's RoPE facts and methods assume shared by every layer",
                "use a model whose layers share one head size (Gemma 3, Qwen3, Llama)") from None
        prf = float(rope.get("partial_rotary_factor", 1.0) or 1.0)
        if int(head_dim * prf) % 2:
            # transformers rounds such a dimension up: ceil(d/2) frequencies with exponents 2i/d, rotating d + 1
            # channels, which no method's formula (pairs 2i < d, exponents over d) describes
            raise UnsupportedModelError(
                f"model type '{model_type}' rotates an odd number of channels (head_dim {head_dim} × "
                f"partial_rotary_factor {prf:g} = {int(head_dim * prf)}), which transformers rounds up to "
                f"{int(head_dim * prf) + 1} with frequencies over {int(head_dim * prf)}: no method's formula describes it",
                "use a partial_rotary_factor that gives an even rotary dimension")
        declared = int(config.max_position_embeddings)
        window = effective_window(rope, declared)
        return cls(
            model_type=model_type,
            rope_type=rope.get("rope_type", "default"),
            rope_theta=float(rope["rope_theta"]),
            head_dim=int(head_dim),
            rotary_dim=int(head_dim * prf),
            partial_rotary_factor=prf,
            window=window,
            num_heads=int(num_heads),
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or num_heads),
            num_layers=int(config.num_hidden_layers),
            rope_parameters=None if rope.get("rope_type", "default") == "default" else copy.deepcopy(dict(rope)),
            config_window=None if window == declared else declared,
            layer_type=layer_type,
        )


def _check_numbers(model_type: str, rope: dict[str, Any], config) -> None:
    """Refuse a config whose RoPE numbers no formula can start from: a base that is not a finite number above 1
    (θ_i = b^(−2i/d) must fall with i), a window or original window that is not a positive whole number, no layers."""
    theta = rope.get("rope_theta")
    try:
        good_theta = not isinstance(theta, bool) and math.isfinite(float(theta)) and float(theta) > 1
    except (TypeError, ValueError):
        good_theta = False
    if not good_theta:
        raise UnsupportedModelError(f"model type '{model_type}' has rope_theta {theta!r}, which is not a RoPE base "
                                    "(a finite number above 1)", "correct rope_parameters.rope_theta in config.json")
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        # a model without layers has no attention for any method to change (it was refused as "every layer
        # attends within a sliding window", or extended as if it were a model)
        raise UnsupportedModelError(f"model type '{model_type}' has num_hidden_layers {layers!r}, which is not a "
                                    "number of layers (a whole number ≥ 1)", "correct num_hidden_layers in config.json")
    for where, value in (("max_position_embeddings", getattr(config, "max_position_embeddings", None)),
                         ("rope_parameters.original_max_position_embeddings",
                          rope.get("original_max_position_embeddings") or 1)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 1 or value != int(value):
            raise UnsupportedModelError(f"model type '{model_type}' has {where} {value!r}, which is not a window "
                                        "(a positive whole number of tokens)", f"correct {where} in config.json")


def _own_rotary_setting(config) -> str:
    """The rotary setting of a config that has no ``rope_parameters`` but rotates q/k anyway, as ``name value``,
    or "" when it has none (GPT-2, BERT: no RoPE at all)."""
    for name in ("rotary_dim", "rotary_embedding_base", "rotary_emb_base"):
        value = getattr(config, name, None)
        if value:
            return f"{name} {value}"
    if getattr(config, "position_embedding_type", None) == "rotary":
        return "position_embedding_type 'rotary'"
    return ""


def layer_rope_types(config) -> tuple[str, ...]:
    """The layer types that have RoPE settings of their own (Gemma 3), or ``()`` for one RoPE everywhere. A type no
    layer has (a Gemma 3 config whose ``layer_types`` are all sliding keeps a ``full_attention`` entry) is left out:
    the model builds no frequencies for it."""
    rope = getattr(config, "rope_parameters", None) or {}
    used = set(getattr(config, "layer_types", None) or ())
    return tuple(key for key, value in rope.items() if isinstance(value, dict) and (not used or key in used))


def primary_layer_type(types: tuple[str, ...]) -> str:
    """The layer type ropekit extends by default: the full-attention (global) layers where there are any."""
    return "full_attention" if "full_attention" in types else types[0]


#: Rope types whose ``factor`` scales an ``original_max_position_embeddings`` into the window they serve.
_SCALED_WINDOW_TYPES = ("yarn", "llama3", "longrope")


def effective_window(rope: dict[str, Any], declared: int) -> int:
    """The window a model's RoPE is built for: ``max_position_embeddings``, or for ``yarn``/``llama3``/``longrope``
    the scaled window ``factor × original_max_position_embeddings`` when the config declares less (Qwen's docs
    add ``yarn`` factor 4 over 32,768 tokens and keep ``max_position_embeddings`` at 40,960)."""
    if rope.get("rope_type") not in _SCALED_WINDOW_TYPES:
        return declared
    factor, original = rope.get("factor"), rope.get("original_max_position_embeddings")
    if not factor or not original:
        return declared
    return max(declared, int(round(float(factor) * int(original))))
