"""Loading a model saved by ropekit with its method restored."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM

from ..adapters import transformers as hf
from ..errors import ModelLoadError
from ..methods import get_method
from .installer import install_resolved
from .registration import register

def load(path: str | Path, *, dtype: torch.dtype | str | None = None, attn_implementation: str | None = None):
    """Load a model saved by :func:`save_pretrained` (or any transformers directory) with its method restored.

    The model is built with the base model's RoPE (recorded at export) and the method is installed again
    with its recorded parameters, so a ropekit-only method comes back exactly — except an export frozen at one
    length (``freeze_length``), which is loaded as the static model its config describes. ``attn_implementation``
    defaults to sdpa where the family supports it, else eager.
    """
    register()  # a frozen export's config may name a ropekit_<name> rope type
    path = Path(path)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"no config.json in '{path}': ropekit.load opens a saved model directory",
                             "for a built-in name (tiny, smollm2), a .gguf file or a hub id use "
                             f"ropekit.load_model('{path}').model")
    try:
        data = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"'{config_path}' is not valid JSON ({err.msg} at line {err.lineno})", "re-export the model") from None
    record = data.pop("ropekit", None) if isinstance(data, dict) else None
    if record is not None and not isinstance(record, dict):
        raise ModelLoadError(f"'{config_path}' has a 'ropekit' entry that is not ropekit's record (a mapping of "
                             f"method and parameters) but {type(record).__name__} {str(record)[:40]!r}",
                             "re-export the model, or remove that key to load the model as it is")
    frozen = bool(record) and (record.get("export") or {}).get("freeze_length") is not None
    if frozen:  # the static model its config describes, not the length-following method it was frozen from
        record = None
        if data.get("model_type") not in CONFIG_MAPPING:
            raise ModelLoadError(f"unknown model_type {data.get('model_type')!r} in '{config_path}'", "re-export the model")
        config = CONFIG_MAPPING[data["model_type"]].from_dict(data)
    elif record:
        data.pop("dual_chunk_attention_config", None)  # written for vLLM by the export; ropekit restores the method
        for key in (record.get("export") or {}).get("legacy_keys") or ():
            data.pop(key, None)  # transformers 4.x's names of the export's RoPE: the base model's are restored below
        try:
            data["rope_parameters"] = copy.deepcopy(record["base"]["rope_parameters"])
            data["max_position_embeddings"] = record["base"]["max_position_embeddings"]
            m = get_method(record["method"])
            layer_params = record.get("layer_params") or {None: record["params"]}
            given = {layer_type: m.frozen_params(params) for layer_type, params in layer_params.items()}
        except (KeyError, TypeError):
            raise ModelLoadError(f"the 'ropekit' record in '{config_path}' is incomplete", "re-export the model") from None
        if data.get("model_type") not in CONFIG_MAPPING:
            raise ModelLoadError(f"unknown model_type {data.get('model_type')!r} in '{config_path}'", "re-export the model")
        config = CONFIG_MAPPING[data["model_type"]].from_dict(data)
    else:
        config = AutoConfig.from_pretrained(path)
    kwargs: dict[str, Any] = {"config": config, "attn_implementation": attn_implementation or _default_attention(config)}
    if dtype is not None:
        kwargs["dtype"] = dtype
    adds_weights = bool(record) and "weights" in m.changes
    try:
        with _expecting_rotary_weights(config) if adds_weights else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError, RuntimeError, EOFError, SafetensorError) as err:
        # a truncated or damaged weights file: the reader's message, on one line, naming the directory
        reason = " ".join(str(err).split())[:300] or type(err).__name__
        raise ModelLoadError(f"cannot load the weights in '{path}' ({type(err).__name__}: {reason})",
                             "re-export the model; a killed or interrupted copy leaves damaged weights") from None
    if record:
        before = set(model.state_dict())
        install_resolved(model, m, given)
        # the rope type config.json carries (yarn, longrope …): what `inspect` shows for the saved directory
        model._ropekit_written_rope_type = (record.get("export") or {}).get("rope_type")
        _restore_added_weights(model, path, [k for k in model.state_dict() if k not in before])
    model.eval()
    return model


def _default_attention(config) -> str:
    """``sdpa`` where the family's model class supports it, else ``eager`` (Gemma 2, gpt-oss)."""
    cls = hf.causal_lm_class(config)
    return "sdpa" if cls is None or hf.supports_sdpa(cls) else "eager"


#: Checkpoint keys of modules a method attaches to a rotary embedding (CLEX's ODE): the base model that
#: ``load`` builds first does not have them yet, and ``_restore_added_weights`` reads them after ``extend``.
_ROTARY_CHILD_WEIGHTS = r"rotary_emb\.[^.]+\."


@contextlib.contextmanager
def _expecting_rotary_weights(config):
    """While loading the base model, tell transformers that rotary-module weights in the checkpoint are expected
    (its ``_keys_to_ignore_on_load_unexpected``), so that its load report does not call them unexpected."""
    cls = hf.causal_lm_class(config)
    if cls is None:
        yield
        return
    with hf.expecting_unexpected_keys(cls, [_ROTARY_CHILD_WEIGHTS]):
        yield


def _restore_added_weights(model, path: Path, keys: list[str]) -> None:
    """Load the weights ``keys`` that ``extend`` added to ``model`` (a method's own modules) from the checkpoint
    in ``path`` (``model.safetensors``, or the shards its index names)."""
    if not keys:
        return
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({weight_map[k] for k in keys if k in weight_map})
    else:
        files = ["model.safetensors"] if (path / "model.safetensors").is_file() else []
    found: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(path / name), framework="pt") as handle:
            present = set(handle.keys())
            found.update({k: handle.get_tensor(k) for k in keys if k in present})
    missing = [k for k in keys if k not in found]
    if missing:
        raise ModelLoadError(
            f"'{path}' has no saved weights for {', '.join(missing)} (the method's own modules)",
            "save the extended model with ropekit.save_pretrained or `ropekit extend --out`",
        )
    model.load_state_dict(found, strict=False)
