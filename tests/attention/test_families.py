"""Self-Extend and LM-Infinite on every supported family: cached greedy decoding equals a loop of uncached
forwards (so prefill, the cache path and the mask plumbing agree), and degenerate settings are the plain model."""

from __future__ import annotations

import pytest
import torch

import ropekit
from family_support import applies
from ropekit.models.tiny import FAMILIES, build_tiny_model

SETTINGS = {
    "self_extend": {"group_size": 3, "window_size": 8},
    "lm_infinite": {"global_tokens": 4, "local_window": 16},
}


@pytest.mark.parametrize("family,method", [(f, m) for f in sorted(FAMILIES) for m in sorted(SETTINGS) if applies(f, m)])
def test_cached_generation_equals_uncached_loop(family, method, make_ids):
    model = ropekit.extend(build_tiny_model(family), method, **SETTINGS[method])
    prompt = make_ids(40, seed=3)
    with torch.no_grad():
        cached = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False,
                                pad_token_id=0)
        ids = prompt
        for _ in range(6):
            logits = model(ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(cached, ids)
    # the method really changes the model at this length
    plain = build_tiny_model(family)
    with torch.no_grad():
        assert not torch.allclose(model(prompt).logits, plain(prompt).logits)


@pytest.mark.parametrize("family", [f for f in sorted(FAMILIES) if applies(f, "self_extend") and applies(f, "lm_infinite")])
def test_degenerate_settings_are_the_plain_model(family, make_ids):
    ids = make_ids(30, seed=4)
    with torch.no_grad():
        want = build_tiny_model(family)(ids).logits
        se = ropekit.extend(build_tiny_model(family), "self_extend", group_size=2, window_size=32)
        lm = ropekit.extend(build_tiny_model(family), "lm_infinite", local_window=64)
        assert torch.equal(se(ids).logits, want)
        assert torch.equal(lm(ids).logits, want)
