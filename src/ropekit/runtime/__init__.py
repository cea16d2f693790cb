"""Process-level utilities every layer may use: CPU threads and determinism, the on-disk cache, progress
display, quiet third-party output, and outputs written whole or not at all (atomic.py).

Nothing here knows about RoPE, methods or models; it imports only the standard library (torch, rich and
transformers only inside the functions that need them), so importing it is cheap.
"""

from .atomic import atomic_dir, atomic_file, check_target, clean_leftovers
from .cache import cache_root, save_model_atomically, settings_key
from .logs import quiet_transformers, route_deepspeed_logs_to_stderr
from .progress import ProgressTask, progress
from .threads import default_threads, deterministic, torch_threads, usable_cores

__all__ = [
    "atomic_dir",
    "atomic_file",
    "check_target",
    "clean_leftovers",
    "ProgressTask",
    "cache_root",
    "default_threads",
    "deterministic",
    "progress",
    "quiet_transformers",
    "route_deepspeed_logs_to_stderr",
    "save_model_atomically",
    "settings_key",
    "torch_threads",
    "usable_cores",
]
