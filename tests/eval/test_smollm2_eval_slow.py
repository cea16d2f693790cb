"""Real-model evaluation (slow, bounded): SmolLM2-135M (8,192-token window) with and without Dynamic NTK.

Passkey: the base model retrieves at 4k and fails at 12k; ``dynamic_ntk`` with factor 2 retrieves at 12k.
Perplexity (the longest built-in held-out document, its first 4k / 12k tokens): on the tokens past the
8k window the base model's perplexity is far above the method's on the same tokens, and the method's 12k
perplexity stays at or below its 4k value. Measured (README): the base model's *whole-window* 12k
perplexity does not explode — its first 8k tokens dominate the average — so the check is on the tokens
beyond the window. One trial / one document per cell keeps the run to minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import math
import os
import time

import pytest

from ropekit.eval import get_task
from ropekit.eval.common import make_context
from ropekit.models.loading import load_model

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

SHORT, LONG = 4096, 12288


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2")


def _evaluate(loaded, task: str, lengths, method=None, params=None, **options):
    module = get_task(task)
    ctx = make_context(task, loaded.model, loaded.tokenizer, method=method, params=params, lengths=lengths,
                       key_fields=module.KEY_FIELDS, seed=0)
    start = time.perf_counter()
    module.run(ctx, lengths=lengths, **options)
    records = list(ctx.writer.records())
    rows = module.summarize(records)
    log = os.environ.get("ROPEKIT_SLOW_LOG")  # where the README's numbers are collected from
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps({"task": task, "method": method or "plain", "params": params or {},
                                 "seconds": round(time.perf_counter() - start, 1), "rows": rows}, default=str) + "\n")
    return {row["length"]: row for row in rows}, records


def _ppl_between(record, start: int, stop: int) -> float:
    """Perplexity of the record's scored tokens at positions [start, stop), from its per-position NLL curve."""
    nll = tokens = 0.0
    for pos, total, n in zip(record["curve_positions"], record["curve_nll_sum"], record["curve_tokens"]):
        if start <= pos < stop:
            nll, tokens = nll + total, tokens + n
    assert tokens > 0
    return math.exp(nll / tokens)


def test_passkey_base_within_window_then_fails_and_dynamic_ntk_restores_it(smollm2):
    base, _ = _evaluate(smollm2, "passkey", [SHORT, LONG], depths=[0.5], trials=1)
    assert base[SHORT]["accuracy"] == 1.0
    assert base[LONG]["accuracy"] == 0.0
    ntk, _ = _evaluate(smollm2, "passkey", [LONG], method="dynamic_ntk", params={"factor": 2}, depths=[0.5], trials=1)
    assert ntk[LONG]["accuracy"] == 1.0


def test_perplexity_past_the_window_rises_for_the_base_and_not_with_dynamic_ntk(smollm2):
    window = smollm2.model.config.max_position_embeddings
    options = {"score_mode": "truncate", "samples": 1}
    base, base_records = _evaluate(smollm2, "ppl", [SHORT, LONG], **options)
    ntk, ntk_records = _evaluate(smollm2, "ppl", [LONG], method="dynamic_ntk", params={"factor": 2}, **options)
    base_long = next(r for r in base_records if r["length"] == LONG)
    ntk_long = next(r for r in ntk_records if r["length"] == LONG)
    beyond_base, beyond_ntk = _ppl_between(base_long, window, LONG), _ppl_between(ntk_long, window, LONG)
    # measured on this machine: 7.59 vs 4.72 on the tokens past 8k (README)
    assert beyond_base > 1.3 * beyond_ntk
    assert ntk[LONG]["ppl"] <= 1.05 * base[SHORT]["ppl"]  # dynamic NTK is the identity within the window
    assert base[LONG]["ppl"] > ntk[LONG]["ppl"]

