"""Fixtures of the trainer tests: small configs on the tiny Llama and small text datasets."""

from __future__ import annotations

import pytest
import torch

from ropekit.data.local_text import stdlib_documents
from ropekit.train.config import deep_merge, parse_config
from ropekit.train.data import packed_dataset


def base_raw(out_dir, *, seq_len: int = 64, steps: int = 4) -> dict:
    return {
        "model": "tiny",
        "data": {"seq_len": seq_len, "sources": [{"path": "builtin", "max_documents": 20}]},
        "train": {"max_steps": steps, "lr": 3e-3, "micro_batch_size": 2, "grad_accum": 1, "threads": 1,
                  "seed": 0, "warmup_steps": 0, "schedule": "constant"},
        "output": {"dir": str(out_dir), "log_every": 1000, "keep_last": None},
    }


@pytest.fixture
def make_config(tmp_path):
    """``make_config(name, seq_len=64, steps=4, **sections)``: a validated config in ``tmp_path/name``;
    ``sections`` are merged into the base (e.g. ``train={"ema": {"decay": 0.9}}``)."""

    def make(name: str = "run", *, seq_len: int = 64, steps: int = 4, **sections):
        raw = base_raw(tmp_path / name, seq_len=seq_len, steps=steps)
        stages = sections.pop("stages", None)
        raw = deep_merge(raw, sections)
        if stages is not None:
            raw["stages"] = stages
            raw["train"].pop("max_steps", None)
        return parse_config(raw)

    return make


class _Rows(torch.utils.data.Dataset):
    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids = self.rows[i]
        n = ids.numel()
        return {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(n),
                "attention_mask": torch.ones(n, dtype=torch.long)}


@pytest.fixture
def rows_dataset():
    """``rows_dataset(rows)``: fixed causal-LM items, one per row of token ids, every token a label."""
    return _Rows


@pytest.fixture(scope="session")
def text_tokens() -> list[bytes]:
    """A few kilobytes of the built-in corpus (bytes = token ids of the byte-level tiny models)."""
    return stdlib_documents(60_000, "train")


@pytest.fixture
def text_dataset(text_tokens):
    """``text_dataset(seq_len, n=None)``: plain packed causal-LM items from the built-in text."""

    def make(seq_len: int, n: int | None = None):
        ds = packed_dataset(text_tokens, seq_len)
        if n is not None:
            ds.tokens, ds.count = ds.tokens[:n], min(n, ds.count)
        return ds

    return make


@pytest.fixture
def snapshot():
    """``snapshot(model)``: clones of the trainable parameters by name."""

    def take(model) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    return take
