"""The RoPE facts of a model, read from its transformers config: what every method and attention function
needs to know about the model it works on, and nothing about the model object itself."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_config(cls, config) -> "RopeInfo":
        """Read the RoPE facts of a transformers 5.x config; raise a one-line error when it has no RoPE."""
        model_type = getattr(config, "model_type", "unknown")
        rope = getattr(config, "rope_parameters", None)
        if not rope or "rope_theta" not in rope or rope.get("rope_theta") is None:
            raise UnsupportedModelError(
                f"model type '{model_type}' has no rotary position embedding (RoPE)",
                "ropekit extends RoPE models such as Llama, Mistral, Qwen2/3, Phi-3 and GPT-NeoX",
            )
        if any(isinstance(v, dict) for v in rope.values()):
            raise UnsupportedModelError(
                f"model type '{model_type}' has per-layer-type RoPE settings, which ropekit does not extend yet",
                "use a model with one rope_parameters dict (Llama, Mistral, Qwen2/3, Phi-3, GPT-NeoX)",
            )
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        prf = float(rope.get("partial_rotary_factor", 1.0) or 1.0)
        return cls(
            model_type=model_type,
            rope_type=rope.get("rope_type", "default"),
            rope_theta=float(rope["rope_theta"]),
            head_dim=int(head_dim),
            rotary_dim=int(head_dim * prf),
            partial_rotary_factor=prf,
            window=int(config.max_position_embeddings),
            num_heads=int(num_heads),
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or num_heads),
            num_layers=int(config.num_hidden_layers),
        )
