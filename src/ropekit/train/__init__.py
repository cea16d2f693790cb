"""Training for context extension: YAML configs, the one training loop (:mod:`ropekit.train.loop`) and its
parts (strategy, objective, loss guard, EMA, checkpoints, trackers, export), LoRA, curricula.

>>> from ropekit.train import load_config, train
>>> cfg = load_config("tiny.yaml").with_overrides(out_dir="runs/x", max_steps=10)
>>> result = train(cfg)                       # DIR/metrics.jsonl, DIR/checkpoints/step-N, DIR/final
>>> model = ropekit.load(result.final_dir)     # the method comes back with the weights

``ropekit train CONFIG.yaml [--out DIR] [--max-steps N] [--resume]`` is the command-line front end;
``ropekit train --example NAME`` prints a ready config.
"""

from .config import ConfigError, TrainConfig, load_config, parse_config, parse_yaml
from .examples import EXAMPLES, example_names, example_yaml
from .trainer import StepInfo, TrainingAborted, TrainResult, train

__all__ = [
    "EXAMPLES",
    "ConfigError",
    "StepInfo",
    "TrainConfig",
    "TrainResult",
    "TrainingAborted",
    "example_names",
    "example_yaml",
    "load_config",
    "parse_config",
    "parse_yaml",
    "train",
]
