"""ropekit's on-disk cache: where trained built-in models and tokenised data live, and atomic writes into it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .logs import quiet_transformers


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$ROPEKIT_CACHE``, else ``~/.cache/ropekit``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("ROPEKIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ropekit"


def settings_key(settings: dict[str, Any]) -> str:
    """A short stable hash of JSON-able ``settings``: the name of the cache entry they produce."""
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def save_model_atomically(model, path: Path, meta: dict[str, Any], *, meta_file: str,
                          extra: Callable[[Path], Any] | None = None) -> Path:
    """Write ``model`` (``save_pretrained``), ``meta`` (as JSON in ``meta_file``) and whatever ``extra(directory)``
    saves (a tokenizer) to a temporary directory next to ``path``, then rename it into place.

    A crash leaves at most a ``.tmp-*`` directory, never a half-written ``path``; if another process finished
    the same entry first, its copy is kept.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a cache entry is an ordinary directory
        with quiet_transformers():
            model.save_pretrained(tmp)
            if extra is not None:
                extra(tmp)
        (tmp / meta_file).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        if path.exists():  # a damaged or stale entry with the same key: move it aside first
            trash = Path(tempfile.mkdtemp(prefix=f".old-{path.name}-", dir=path.parent))
            os.replace(path, trash / "entry")
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(tmp, path)
        except OSError:
            if not (path / meta_file).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
