"""Saving an extended model so that plain transformers loads the same model wherever it can.

Where transformers has the method, ``config.json`` holds transformers' own ``rope_parameters``; otherwise
it keeps rope type ``ropekit_<name>``, which plain transformers refuses loudly and :func:`ropekit.load`
restores. ``config.ropekit`` always records the method, its parameters and the base model's RoPE, and a
``ROPEKIT.md`` beside the weights says which case applies.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from ..core.jsonsafe import json_safe
from ..methods import get_method
from .model_rope import base_info, text_config
from .rope_types import transformers_builds

_EXPORT_NOTE = """# Extended with ropekit

Method: `{method}` — parameters in `config.json` under `ropekit`.

{how}
"""


def _with_base_rope(config, record):
    """Context: ``config`` temporarily carries the base model's RoPE (so family validators accept it)."""

    class _Swap:
        def __enter__(self):
            self.saved = (config.rope_parameters, config.max_position_embeddings)
            config.rope_parameters = copy.deepcopy(record["base"]["rope_parameters"])
            config.max_position_embeddings = record["base"]["max_position_embeddings"]

        def __exit__(self, *exc):
            config.rope_parameters, config.max_position_embeddings = self.saved
            return False

    return _Swap()


def save_pretrained(model: PreTrainedModel, out_dir: str | Path, tokenizer=None) -> dict[str, Any]:
    """Save ``model`` so that plain transformers rebuilds the same model wherever it has the method.

    * Methods with an exact transformers equivalent (PI → ``linear``, NTK/ABF → ``rope_theta``, YaRN →
      ``yarn``, Dynamic NTK with transformers' rule → ``dynamic``, NTK-by-parts with ``ramp='dim'`` →
      ``yarn`` with attention factor 1) are written as that equivalent — when the model family's own
      config accepts it (Phi-3's accepts only plain RoPE and LongRoPE).
    * Otherwise the config keeps rope type ``ropekit_<name>``: plain transformers then refuses to build
      the model (``KeyError: 'ropekit_<name>'``, or the family's own validation error) instead of
      silently giving a different one. ``ropekit.load`` restores every method.

    Returns a report: method, ``transformers`` (plain loading gives the same model), ``vllm``.
    """
    out = Path(out_dir)
    config = text_config(model)
    record = getattr(config, "ropekit", None)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        if record:
            get_method(record["method"]).prepare_tokenizer(tokenizer, record["params"])
        tokenizer.save_pretrained(out)
    if not record:
        model.save_pretrained(out)
        return {"method": None, "path": str(out), "transformers": True, "vllm": True}
    with _with_base_rope(config, record):  # weights are unaffected; the config is rewritten below
        model.save_pretrained(out)
    m = get_method(record["method"])
    info = base_info(config)
    native = m.transformers_rope(info, record["params"])
    config_path = out / "config.json"
    data = json.loads(config_path.read_text())
    if native is not None:
        base_rope = record["base"]["rope_parameters"]
        if "partial_rotary_factor" in base_rope:
            native["partial_rotary_factor"] = base_rope["partial_rotary_factor"]
        if not transformers_builds(data, native):
            native = None
    if native is not None:
        data["rope_parameters"] = native
        # transformers' `dynamic` reads max_position_embeddings as the original window
        data["max_position_embeddings"] = info.window if native["rope_type"] == "dynamic" else config.max_position_embeddings
    else:
        data["rope_parameters"] = json_safe(dict(config.rope_parameters))
        data["max_position_embeddings"] = config.max_position_embeddings
    data["ropekit"] = json_safe(record)
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    exports = m.exports_to(record["params"]) if native is not None else []
    how = (
        "Plain transformers loads this directory to the same model (rope type "
        f"`{native['rope_type']}`)." if native is not None else
        f"Plain transformers cannot build this model: it refuses rope type `ropekit_{m.name}` "
        "(a KeyError, or the model family's own validation error). Load it with `ropekit.load(path)`."
    )
    (out / "ROPEKIT.md").write_text(_EXPORT_NOTE.format(method=m.name, how=how))
    return {
        "method": m.name,
        "path": str(out),
        "transformers": native is not None,
        "vllm": "vllm" in exports,
        "rope_parameters": native or data["rope_parameters"],
    }
