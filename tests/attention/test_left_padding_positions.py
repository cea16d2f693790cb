"""A model called with a left-padding mask and no ``position_ids`` numbers every row from column 0, padding
included. Plain RoPE does not care (only differences of positions enter a logit); Self-Extend, LM-Infinite and Dual
Chunk do (``⌊i/G⌋``, the first ``G`` positions, the chunk boundaries are not shift-invariant), and so does
Entropy-ABF's logit scale ``max(log_c(i + 1), 1)`` of the absolute position ``i``: the padded row then
differs from the row alone, and one warning per method says so and names the fix. ``generate`` passes
``cumsum(mask) − 1`` and says nothing."""

from __future__ import annotations

import warnings

import pytest
import torch
from layer_records import sharpen

import ropekit
from ropekit.attention import interface
from ropekit.models.tiny import build_tiny_model

METHODS = {
    "self_extend": {"group_size": 3, "window_size": 8},
    "lm_infinite": {"local_window": 16, "global_tokens": 3},
    "dual_chunk": {"chunk_size": 20, "local_size": 4},
    # t = max(log_c(i + 1), 1) of the absolute query position; layer 1 (not the first) checks
    "entropy_abf": {"skip_layers": [0]},
}
PADS = 5


def _said(method, call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call()
    return out, [str(w.message) for w in caught if str(w.message).startswith(f"{method}: a left-padded row")]


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
@pytest.mark.parametrize("method", list(METHODS))
def test_positions_that_count_the_padding_are_said_once(method, kernel, monkeypatch):
    monkeypatch.setattr(interface, "_SAID", set())
    model = build_tiny_model("llama", window=32, attn_implementation=kernel)
    sharpen(model, 4.0)
    ropekit.extend(model, method, **METHODS[method])
    row = torch.randint(3, 200, (1, 50), generator=torch.Generator().manual_seed(1))
    ids = torch.cat([torch.cat([torch.zeros(1, PADS, dtype=torch.long), row], 1),
                     torch.randint(3, 200, (1, 50 + PADS), generator=torch.Generator().manual_seed(2))])
    mask = torch.ones_like(ids)
    mask[0, :PADS] = 0
    with torch.no_grad():
        alone = model(row).logits[0]
        renumbered, said = _said(method, lambda: model(ids, attention_mask=mask,
                                                       position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits)
        assert not said  # generate's positions: the row is the row alone
        torch.testing.assert_close(renumbered[0, PADS:], alone, atol=2e-5, rtol=0)
        counted, said = _said(method, lambda: model(ids, attention_mask=mask).logits)
        assert len(said) == 1 and "position_ids = attention_mask.cumsum(-1) - 1" in said[0] and "\n" not in said[0]
        assert (counted[0, PADS:] - alone).abs().max() > 1e-3  # the warning is about a real difference
        _, again = _said(method, lambda: model(ids, attention_mask=mask))
        assert not again  # once per method and process
        out, said = _said(method, lambda: model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                                                         pad_token_id=0))
    assert not said


def test_right_padding_and_no_padding_say_nothing(monkeypatch):
    monkeypatch.setattr(interface, "_SAID", set())
    model = build_tiny_model("llama", window=32)
    ropekit.extend(model, "self_extend", **METHODS["self_extend"])
    ids = torch.randint(3, 200, (2, 50), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, -7:] = 0
    with torch.no_grad():
        _, said = _said("self_extend", lambda: (model(ids, attention_mask=mask), model(ids)))
    assert not said
