"""What a context-extension method is: typed parameters, validation, and what it changes in a model.

A :class:`Method` is a small stateless object. Given the facts of a model's RoPE (:class:`RopeInfo`) and
the user's parameters it can

* resolve and validate the parameters (defaults come from the papers or from the model),
* compute the shared inverse frequencies and attention factor (the transformers rope-init contract),
* describe attention-side changes (per-head RoPE, logit scaling) as an :class:`AttentionSpec`,
* say, format by format, how it is written for a runtime other than ropekit — or why it cannot be, in one line:
  transformers' own ``rope_parameters`` (:meth:`Method.transformers_rope`), llama.cpp's named GGUF RoPE keys
  (:meth:`Method.gguf_rope`), the ``config.json`` keys with which vLLM computes it itself (:meth:`Method.vllm_config`,
  :meth:`Method.vllm_serve`); the ropekit format (rope type ``ropekit_<name>`` and the recorded parameters,
  :meth:`Method.frozen_params`) holds every method.

Installing a method into a model, and writing the formats, is :mod:`ropekit.install`'s job; a method only says what
to install and what to write. A method is one unit — ``methods/<name>.py`` and its helper modules
``methods/<name>_*.py`` (its kernel ``_attention``, its search ``_search``) — plus one line in the registry
(``methods/__init__.py``). No module outside the methods package names a method (``tests/methods/
test_method_units.py``); inside it a unit may build on another (YaRN on NTK-by-parts, LongRoPE's search on the PI,
NTK and YaRN closed forms).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from ..core.base_rope import base_frequencies, length_dependence
from ..core.params import Param
from ..core.rope_info import RopeInfo
from ..core.schema import MAX_POSITIONS
from ..errors import InvalidParameterError

#: Vocabulary for :attr:`Method.changes`.
CHANGES = {
    "frequencies": "the inverse frequency of each rotary dimension (shared by heads and layers)",
    "frequencies_per_head": "a different RoPE base per attention head (per KV group on GQA models)",
    "length_dependent": "frequencies recomputed from the current input length",
    "attention_factor": "a constant attention-logit scale (via cos/sin)",
    "logit_scale_per_position": "an attention-logit scale that depends on the query position",
    "attention_pattern": "which keys a query sees, or the relative positions it sees them at",
    "weights": "adds or trains weights",
}


def two_digits(x: float) -> float:
    """``x`` to two significant digits (settings shown in a table read better round)."""
    digits = 1 - int(math.floor(math.log10(abs(x))))
    return float(round(x, digits))


def short_number(x: float) -> str:
    """A number as a settings line shows it: thousands separated, no decimals, from 100 up."""
    return f"{x:,.0f}" if x >= 100 else f"{x:g}"


def original_window(info: RopeInfo) -> int:
    """the model's window (max_position_embeddings)"""
    return info.window


def model_theta(info: RopeInfo) -> float:
    """the model's rope_theta"""
    return info.rope_theta


FACTOR = Param("factor", float, 1.0, "scale factor s = target length / original window", minimum=1.0,
               maximum=MAX_POSITIONS)
ORIGINAL_WINDOW = Param(
    "original_max_position_embeddings", int, original_window, "pretrained window C the scaling is relative to", minimum=2
)
ROPE_THETA = Param("rope_theta", float, model_theta, "RoPE base b the method starts from", minimum=1.0, exclusive_minimum=True)


#: llama.cpp's YaRN correction betas for the Llama architecture: its context defaults, which it does not read from a
#: GGUF (``src/llama-context.cpp``); a method can be written as GGUF ``yarn`` only with these.
LLAMACPP_YARN_BETAS = (32.0, 1.0)


@dataclass(frozen=True)
class GGUFKeys:
    """llama.cpp's own RoPE keys for an installation (:meth:`Method.gguf_rope`): ``scaling_type`` ``none``
    (plain RoPE with ``freq_base``), ``linear`` (``factor``) or ``yarn`` (``factor`` over
    ``original_context_length``, llama.cpp's betas :data:`LLAMACPP_YARN_BETAS`). The GGUF writer checks the keys
    numerically against the installed frequencies and writes the exact per-pair ``rope_freqs`` form instead when
    they differ."""

    scaling_type: str
    freq_base: float
    factor: float | None = None
    original_context_length: int | None = None


@dataclass(frozen=True)
class EngineConfig:
    """``config.json`` keys with which an engine (vLLM) computes a method itself rather than through its RoPE, and
    the model card's sentence about it (:meth:`Method.vllm_config`)."""

    keys: dict[str, Any]
    note: str


@dataclass(frozen=True)
class EngineServing:
    """How vLLM serves a directory carrying a method's :attr:`Method.vllm_keys` (:meth:`Method.vllm_serve`):
    ``hf_overrides``, extra command-line arguments after ``--max-model-len`` and environment variables."""

    hf_overrides: dict[str, Any]
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class AttentionSpec:
    """Attention-side changes a method needs, applied by ropekit's attention functions.

    * ``logit_scale_context`` — multiply the logits of query position ``i`` by ``max(log_c(i+1), 1)``
      (Entropy-ABF) on every layer except ``skip_layers``.
    * ``head_bases`` — one RoPE base per KV group (HARPE); the shared rotary embedding becomes the
      identity and each head is rotated with its own frequencies.
    """

    logit_scale_context: int | None = None
    skip_layers: frozenset[int] = field(default_factory=frozenset)
    head_bases: list[float] | None = None
    #: A layer-attention factory ``factory(info, inv_freq, layer_idx, **layer_attention_args)`` from
    #: :mod:`ropekit.attention`: for methods that change which keys a query sees or at what relative position
    #: (Self-Extend, LM-Infinite, S²-Attn, Landmark).
    layer_attention: Callable[..., Any] | None = None
    layer_attention_args: dict[str, Any] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return self.logit_scale_context is None and self.head_bases is None and self.layer_attention is None


class Method(abc.ABC):
    """Base class of every registered method; subclasses set the class attributes and override hooks."""

    name: ClassVar[str]
    title: ClassVar[str]
    summary: ClassVar[str]
    reference: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()
    changes: ClassVar[tuple[str, ...]] = ("frequencies",)
    needs_training: ClassVar[bool] = False
    #: Why the method installed on a model and not fine-tuned is not the method at all (None: it is — possibly a
    #: weaker form, as frozen PI): ``ropekit recommend`` measures no such frozen candidate.
    untrained_note: ClassVar[str | None] = None
    #: Whether ``factor`` drives the method's math (else it only declares the extended window).
    uses_factor: ClassVar[bool] = True
    #: How the method applies to a model whose RoPE is already scaled (``llama3``, ``yarn``, ``longrope``, …):
    #: the rule on the model's effective frequencies θ^eff and window (``ropekit methods`` shows it).
    composition: ClassVar[str] = ""
    #: What the method's attention-side part does with the attention computation, for the capability check:
    #: ``rotates`` — re-rotates queries/keys in the model's rotary layout; ``logits`` — computes attention itself.
    attention_access: ClassVar[tuple[str, ...]] = ()
    #: Whether a length-dependent method recomputes its frequencies by its own means (Dynamic NTK through
    #: transformers' dynamic update, CLEX through its module); others switch through ropekit's rotary hook.
    schedules_itself: ClassVar[bool] = False
    #: Whether the method computes the rotary module's cos/sin itself (CLEX), in the common half-split form.
    replaces_rotary_output: ClassVar[bool] = False

    # ---- parameters -------------------------------------------------------------------------
    @property
    def scale_only(self) -> bool:
        """Whether the scale ``s`` is the method's whole reach: ``factor`` defaults to 1, where the method computes
        the model's own RoPE (PI, NTK, YaRN, …), so a factor left out extends nothing."""
        scale = next((p for p in self.params if p.name == "factor"), None)
        return self.uses_factor and scale is not None and scale.default == 1.0

    def sized_by_target(self, params: dict[str, Any]) -> bool:
        """Whether ``params`` (as given) still leave the method's size to a target length: a factor-driven method
        given neither ``factor`` nor ``target_length`` (nor a parameter of its own that sets its reach)."""
        return self.uses_factor and "factor" not in params and "target_length" not in params

    def training_problem(self, params: dict[str, Any], seq_len: int) -> tuple[str, str] | None:
        """``(problem, fix)`` when training with ``params`` (as written; defaults not filled) on sequences of
        ``seq_len`` tokens could not train the method, checked when a training config is read; None when it can."""
        return None

    def adapter_problem(self, params: dict[str, Any], extras: tuple[str, ...]) -> tuple[str, str] | None:
        """``(problem, fix)`` when training with LoRA adapters whose fully trained extras are ``extras`` (``embed``,
        ``norm``) would leave a weight the method needs untrained, checked when a training config is read;
        None when it would not (default: the method needs nothing beyond what the adapters reach)."""
        return None

    def own_weights(self, model: torch.nn.Module) -> list[torch.nn.Parameter]:
        """The weights the method itself added to ``model`` (CLEX's ODE) — trained with the model, and kept
        trainable under LoRA, which freezes every other base weight; default none."""
        return []

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def resolve(self, info: RopeInfo, given: dict[str, Any]) -> dict[str, Any]:
        """Validate ``given`` and fill every default; unknown names raise one line listing the known ones."""
        known = {p.name for p in self.params}
        for key in given:
            if key not in known:
                raise InvalidParameterError(
                    f"{self.name}: unknown parameter '{key}'",
                    f"known parameters: {', '.join(sorted(known)) or 'none'}",
                )
        out: dict[str, Any] = {}
        for p in self.params:
            value = p.coerce(self.name, given[p.name]) if given.get(p.name) is not None else p.default_for(info)
            out[p.name] = value
        if info.is_scaled and any(p is ROPE_THETA for p in self.params) and out["rope_theta"] != info.rope_theta:
            raise InvalidParameterError(
                f"{self.name}: rope_theta cannot change on a model whose RoPE is already scaled "
                f"('{info.rope_type}', base {info.rope_theta:g})",
                "leave rope_theta out (the scaled frequencies are the starting point), or use abf to change the base",
            )
        self._check_window(info, out)
        self.check(info, out)
        return out

    def _check_window(self, info: RopeInfo, params: dict[str, Any]) -> None:
        """Refuse a declared window past :data:`MAX_POSITIONS` (a factor of 1e300 would otherwise be written)."""
        try:
            declared = float(self.max_position_embeddings(info, params))
        except (OverflowError, ValueError, ZeroDivisionError):
            declared = math.inf
        except TypeError:  # a parameter left to the model or the input (factor None): no window declared yet
            return
        if not declared <= MAX_POSITIONS:
            factor = params.get("factor")
            what = f"factor {factor:g}" if isinstance(factor, float) else "these parameters"
            raise InvalidParameterError(
                f"{self.name}: {what} declares a window of {declared:.3g} tokens, past {MAX_POSITIONS:,} (2^24): "
                "positions there are not exact in float32, in which transformers computes the rotary angles",
                f"pass a factor ≤ {MAX_POSITIONS / max(info.window, 1):g} for this model's {info.window}-token window",
            )

    def check(self, info: RopeInfo, params: dict[str, Any]) -> None:
        """Cross-parameter and model-dependent validation; raise :class:`InvalidParameterError`."""

    # ---- what it does -----------------------------------------------------------------------
    @abc.abstractmethod
    def inv_freq(
        self, info: RopeInfo, params: dict[str, Any], seq_len: int | None = None, device=None
    ) -> tuple[torch.Tensor, float]:
        """Shared inverse frequencies (length rotary_dim/2) and the cos/sin attention factor."""

    def attention(self, info: RopeInfo, params: dict[str, Any]) -> AttentionSpec | None:
        """Attention-side changes, or ``None`` when the method only changes the shared frequencies."""
        return None

    def install_model(self, model: torch.nn.Module, info: RopeInfo, params: dict[str, Any]) -> dict[str, Any]:
        """Model-level changes besides frequencies and attention (Landmark: a new token and input hooks); returns
        the parameters to record, e.g. the id of an added token. Default: none."""
        return params

    def uninstall_model(self, model: torch.nn.Module, params: dict[str, Any]) -> None:
        """Undo :meth:`install_model`'s hooks when the method is removed (weights it added stay); default none."""

    def training_batch(self, batch: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The trainer's batch as this method trains on it (Landmark: landmark tokens inserted); default unchanged."""
        return batch

    def prepare_tokenizer(self, tokenizer, params: dict[str, Any]) -> None:
        """Adjust a tokenizer saved with the extended model (Landmark: its special token); default nothing."""

    def attach(self, rotary: torch.nn.Module, info: RopeInfo, params: dict[str, Any]) -> None:
        """Add the method's own modules (learned weights) to a freshly built rotary-embedding module; default none."""

    def training_step_hook(self, model: torch.nn.Module, step: int, generator: torch.Generator) -> None:
        """Called by the trainer before each optimizer step (``generator`` is seeded by the run's seed and
        ``step``), e.g. to draw CLEX's scale for the step; default nothing."""

    def length_dependence(self, info: RopeInfo, params: dict[str, Any]) -> tuple[str, int | None]:
        """How the installed frequencies depend on the input length: ``("static", None)``, ``("switch", L)``
        (one set up to ``L`` tokens, another beyond), ``("continuous", L)`` (recomputed beyond ``L`` at the longest
        length seen, transformers' dynamic rule) or ``("per_input", L)`` (recomputed at each input's own length beyond
        ``L``).

        Default: the model's own dependence (a LongRoPE or Dynamic-NTK base) — methods that depend on the
        length themselves combine theirs with it (:func:`combine_length_dependence`).
        """
        return length_dependence(info)

    def frequencies_at(self, rotary: torch.nn.Module, seq_len: int | None,
                       layer_type: str | None = None) -> tuple[torch.Tensor, float]:
        """``(inv_freq, attention factor)`` an installed rotary module uses for an input of ``seq_len`` tokens
        (``None``: the set it starts with), for ``layer_type``'s layers on a model with RoPE per layer type.
        Default: its rope-init function at that length."""
        from ..adapters.transformers import rotary_frequencies

        return rotary_frequencies(rotary, seq_len, layer_type)

    def base(self, info: RopeInfo, seq_len: int | None = None, device=None) -> tuple[torch.Tensor, float]:
        """``(θ^eff, attention factor)``: the model's own frequencies, the starting point of every rule."""
        return base_frequencies(info, seq_len, device)

    def max_position_embeddings(self, info: RopeInfo, params: dict[str, Any]) -> int:
        """The window the extended model declares (``config.max_position_embeddings``)."""
        return int(round(info.window * params.get("factor", 1.0)))

    def transformers_rope(self, info: RopeInfo, params: dict[str, Any]) -> dict[str, Any] | None:
        """``rope_parameters`` with which plain transformers builds exactly this model, or ``None``."""
        return None

    def exports_to(self, params: dict[str, Any] | None = None) -> list[str]:
        """Which runtimes can run the exported model without ropekit (``transformers``, ``vllm``)."""
        return []

    # ---- export hooks, one per format (install/ dispatches to them) ---------------------------------
    #: ``config.json`` keys through which vLLM computes the method itself (:meth:`vllm_config` writes them); an
    #: export of any other method drops them (a loaded config must not make vLLM run another method).
    vllm_keys: ClassVar[tuple[str, ...]] = ()

    def gguf_rope(self, info: RopeInfo, params: dict[str, Any]) -> GGUFKeys | None:
        """llama.cpp's own RoPE keys that may compute this installation on a model with plain RoPE (checked
        numerically by the writer), or ``None``: the GGUF then holds the exact per-pair ``rope_freqs`` form.
        Default ``None``. Attention-side changes and length-dependent frequencies are refused by the writer from
        :attr:`changes` and :meth:`length_dependence`."""
        return None

    def vllm_config(self, info: RopeInfo, params: dict[str, Any], *,
                    sliding_layers: tuple[int, ...] = ()) -> EngineConfig | str | None:
        """The ``config.json`` keys (:attr:`vllm_keys`) with which vLLM computes the method itself, a one-line reason
        why it cannot, or ``None`` (default) when vLLM serves the method through its RoPE alone."""
        return None

    def vllm_serve(self, config: dict[str, Any]) -> EngineServing | str:
        """How vLLM serves an exported ``config.json`` that carries this method's :attr:`vllm_keys`, or a one-line
        reason why it would compute something else. Only methods with :attr:`vllm_keys` are asked."""
        return f"vLLM does not compute {self.name} itself"

    def not_applicable(self, info: RopeInfo) -> str | None:
        """Why this method cannot be installed into a model with ``info``, or ``None`` when it can."""
        if self.uses_factor and "frequencies" in self.changes and info.rotary_dim <= 2:
            return "needs a rotary dimension above 2"
        return None

    def frozen_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Parameters that rebuild exactly this installation without recomputing anything (used by ``load``)."""
        return dict(params)

    def reach(self, info: RopeInfo, params: dict[str, Any]) -> int | None:
        """The longest input the method is meant for, when it has a hard limit (else ``None``)."""
        return None

    def position_dependent_rotation(self, params: dict[str, Any]) -> str | None:
        """Why some positions rotate with other frequencies than the rest (LongRoPE's first n̂ tokens), or ``None``.

        Such a method computes the rotary module's cos/sin per position (in the module's standard form), and no
        format with one frequency per rotary pair for every position (transformers' ``longrope``, GGUF's
        ``rope_freqs``) holds it."""
        return None

    @property
    def frequencies_only(self) -> bool:
        """Whether, at inference, the method changes only the shared frequencies and the attention factor — so a
        format with one rescale factor per rotary pair (transformers' ``longrope``, GGUF's ``rope_freqs``) holds it."""
        return set(self.changes) <= {"frequencies", "length_dependent", "attention_factor", "weights"}

    def example_params(self, info: RopeInfo) -> dict[str, Any]:
        """Parameters that install the method at 2× the window (``inspect`` builds its export check from them)."""
        return {"factor": 2.0} if any(p.name == "factor" for p in self.params) else {}

    # ---- how ropekit's own reports show it ------------------------------------------------------
    #: The study report's method family: its figures draw one panel of small multiples per family.
    family: ClassVar[str] = "Other"

    def demo_params(self, info: RopeInfo, factor: float) -> dict[str, Any]:
        """Parameters for ``ropekit demo`` on the built-in 64-token model at scale ``factor``: ``factor`` and the
        method's defaults. A method whose papers' defaults are meant for 4k-token models scales them here."""
        return {"factor": factor}

    def settings_line(self, info: RopeInfo, params: dict[str, Any], requested: dict[str, Any] | None = None) -> str:
        """The resolved ``params`` that matter, in a few words (the demo table's settings column); ``requested``
        are the parameters as given. Default: every parameter set, ``name=value``."""
        shown = {k: v for k, v in params.items() if v is not None}
        return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description (what ``ropekit methods --json`` prints)."""
        return {
            "name": self.name,
            "title": self.title,
            "summary": self.summary,
            "reference": self.reference,
            "params": {
                p.name: {
                    "type": p.type.__name__,
                    "default": p.describe_default(),
                    "help": p.help,
                    **({"choices": list(p.choices)} if p.choices else {}),
                    **({"minimum": p.minimum} if p.minimum is not None else {}),
                }
                for p in self.params
            },
            "changes": list(self.changes),
            "composition": self.composition,
            "needs_training": self.needs_training,
            "exports_to": self.exports_to(),
        }


_REGISTRY: dict[str, Method] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: add a method to the registry under ``cls.name``."""
    if cls.name in _REGISTRY:
        raise ValueError(f"method '{cls.name}' registered twice")
    _REGISTRY[cls.name] = cls()
    return cls


def registered() -> dict[str, Method]:
    return dict(_REGISTRY)




def combine_length_dependence(*parts: tuple[str, int | None]) -> tuple[str, int | None]:
    """The dependence of frequencies that depend on the length in several ways (the model's own RoPE and the
    method's): per-input beats continuous beats switch beats static, and recomputation starts at the shortest
    length."""
    order = {"static": 0, "switch": 1, "continuous": 2, "per_input": 3}
    kinds = [kind for kind, _ in parts]
    lengths = [length for _, length in parts if length is not None]
    kind = max(kinds, key=order.__getitem__)
    if kind == "switch" and len({length for k, length in parts if k == "switch"}) > 1:
        kind = "continuous"  # two switches at different lengths: three regimes, recomputed by length
    return kind, (min(lengths) if lengths else None)
