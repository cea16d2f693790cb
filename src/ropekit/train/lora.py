"""LoRA for context extension, with LongLoRA's "LoRA+" extras (Chen et al. 2024, ICLR; docs/methods-reference.md §6).

LongLoRA's finding is that low-rank adapters on the attention projections alone do not adapt a model to
long contexts; training the *embeddings and normalisation layers* fully as well closes most of the gap to
full fine-tuning (the reference sets ``requires_grad`` on every parameter whose name contains ``embed`` or
``norm``, ``trainable_params="embed,norm"``). Its recipe: r = 8, α = 16, dropout 0 on q/k/v/o, plus
embeddings and norms (:data:`ropekit.methods.longlora.RECIPE`), trained with S²-Attn (installed by the
``longlora`` method) and exported with the adapters merged and full attention.

Here the adapters come from peft (``LoraConfig`` / ``get_peft_model``). The extras are chosen by module,
not by parameter name: ``embed`` is the model's input embedding (``get_input_embeddings()``), ``norm``
every normalisation module (class name ending in ``Norm``: RMSNorm, LayerNorm…, weights and biases).
``merged_copy`` folds ``W + (α/r)·B·A`` into each adapted weight of a copy, giving a plain transformers
model (with the method still installed) for export.
"""

from __future__ import annotations

import copy

import torch

from ..errors import RopekitError
from .config import LoRAConfig


def _is_norm(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.LayerNorm) or type(module).__name__.endswith("Norm")


def extra_parameters(model: torch.nn.Module, extras) -> list[tuple[str, torch.nn.Parameter]]:
    """``[(name, parameter)]`` of the embedding (``embed``) and normalisation (``norm``) modules of ``model``."""
    found: dict[int, tuple[str, torch.nn.Parameter]] = {}
    names = {id(p): n for n, p in model.named_parameters()}
    if "embed" in extras:
        embedding = model.get_input_embeddings()
        for p in embedding.parameters():
            found[id(p)] = (names[id(p)], p)
    if "norm" in extras:
        for module in model.modules():
            if _is_norm(module):
                for p in module.parameters(recurse=False):
                    found[id(p)] = (names[id(p)], p)
    return sorted(found.values(), key=lambda item: item[0])


def _linear_names(model: torch.nn.Module) -> list[str]:
    names = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name and "lm_head" not in name:
            names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def apply_lora(model, cfg: LoRAConfig, seed: int = 0, own_weights=()):
    """Wrap ``model`` with LoRA adapters on ``cfg.target_modules`` and make the extras trainable.

    ``own_weights``: the installed method's own weights (:meth:`ropekit.methods.base.Method.own_weights`, CLEX's
    ODE), which stay trainable as in a full fine-tune. Every other base weight is frozen. The adapters' random init (``A`` Kaiming-uniform, ``B = 0``, so the
    wrapped model starts equal to the base) is drawn from a generator seeded with ``seed``, leaving the
    caller's global RNG untouched.
    """
    from peft import LoraConfig, get_peft_model

    present = _linear_names(model)
    missing = [t for t in cfg.target_modules if t not in present]
    if missing:
        raise RopekitError(
            f"train.lora.target_modules: {', '.join(missing)} not found in this model",
            f"this model's linear layers are: {', '.join(present)}",
        )
    peft_cfg = LoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules), bias="none",
    )
    import warnings

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft still reads transformers' deprecated `is_gradient_checkpointing` (a FutureWarning, not ours)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, peft_cfg)
    base = wrapped.get_base_model()
    for _, p in extra_parameters(base, cfg.trainable):
        p.requires_grad_(True)
    for p in own_weights:
        p.requires_grad_(True)
    return wrapped


def is_peft(model) -> bool:
    return hasattr(model, "merge_and_unload") and hasattr(model, "get_base_model")


def base_model(model):
    """The transformers model inside a peft wrapper (or ``model`` itself)."""
    return model.get_base_model() if is_peft(model) else model


def merged_copy(model):
    """A plain transformers model equal to the adapted ``model``: a deep copy with every adapter merged."""
    if not is_peft(model):
        return model
    clone = copy.deepcopy(model)
    return clone.merge_and_unload()
