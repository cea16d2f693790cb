"""The end of a training run: the weights exported as a plain model that carries its method.

:func:`export_model` saves with :func:`ropekit.save_pretrained` (LoRA merged first), so ``ropekit.load(DIR)``
gives the model back with its method, plus ``ropekit_train.json`` (the step, stage, tokens seen, skipped steps
and the run's config). The directory is built beside its final path and renamed into place.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..install import save_pretrained
from ..runtime import quiet_transformers
from . import checkpoint as ckpt
from .lora import merged_copy

FINAL_DIR = "final"
FINAL_EMA_DIR = "final-ema"
TRAIN_INFO = "ropekit_train.json"


def export_model(directory: Path, *, strategy, model, unwrapped, rebuild: Callable[[], Any], tokenizer,
                 info: dict[str, Any]) -> None:
    """Save the current weights of ``model`` to ``directory`` — collective.

    Under FSDP or ZeRO-3 the full weights are gathered on the main process and loaded into ``rebuild()`` (a
    fresh copy of the model with the same method and adapters): the sharded modules cannot be saved or merged
    as they are.
    """
    if strategy.gathers_on_export:
        state = strategy.acc.get_state_dict(model)
        if not strategy.is_main:
            return
        source = rebuild()
        source.load_state_dict(state)
    elif not strategy.is_main:
        return
    else:
        source = unwrapped
    plain = merged_copy(source)
    was_training = plain.training
    plain.eval()
    tmp = directory.parent / f".tmp-{directory.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with quiet_transformers():
            save_pretrained(plain, tmp, tokenizer=tokenizer)
        ckpt.write_json_atomic(tmp / TRAIN_INFO, info)
        ckpt.replace_dir(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if was_training and plain is source:
            plain.train()
