"""Landmark attention with a KV cache whose calls mix passing ``position_ids`` and not (Landmark paper §3: the
landmarks inserted so far shift every later token's position): a prefill followed by token-by-token steps gives
the logits of one forward over the whole sequence, whichever calls pass the plain model's positions."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import ropekit
from ropekit.core.hf_compat import cache_argument
from ropekit.models.tiny import build_tiny_model

MEM_FREQ, PREFILL, LENGTH = 7, 20, 60


def landmarked(family="llama", seed=6):
    torch.manual_seed(seed)
    return ropekit.extend(build_tiny_model(family), "landmark", mem_freq=MEM_FREQ, top_k=2, local_blocks=1).eval()


def random_ids(n, batch=1, seed=9):
    return torch.randint(0, 256, (batch, n), generator=torch.Generator().manual_seed(seed))


def finite(logits):
    """The landmark's logit is −∞ in every output: compare the rest."""
    return torch.where(torch.isinf(logits), torch.zeros_like(logits), logits).float()


#: Which calls pass position_ids: (the prefill, step t after the prefill).
PATTERNS = {
    "prefill without, steps with": (False, lambda t: True),
    "prefill with, steps without": (True, lambda t: False),
    "prefill without, steps alternate": (False, lambda t: t % 2 == 0),
    "prefill with, steps alternate": (True, lambda t: t % 3 == 1),
}


@torch.no_grad()
def stepwise(model, ids, mask, prefill_with, step_with):
    """A prefill of ``PREFILL`` tokens, then one token per call on the cache; positions (where passed) are the
    plain model's default ``0 … n−1``, which a call without them gets."""
    batch = ids.shape[0]

    def call(start, stop, with_positions):
        kwargs = {"position_ids": torch.arange(start, stop)[None].expand(batch, -1)} if with_positions else {}
        if mask is not None:
            kwargs["attention_mask"] = mask[:, :stop]
        kwargs[cache_argument(model)] = cache
        return model(input_ids=ids[:, start:stop], use_cache=True, **kwargs).logits

    cache = DynamicCache(config=model.config)
    outs = [call(0, PREFILL, prefill_with)]
    outs += [call(t, t + 1, step_with(t)) for t in range(PREFILL, ids.shape[1])]
    return finite(torch.cat(outs, 1))


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_mixed_position_ids_on_a_cache_equal_one_forward(family, pattern):
    model = landmarked(family)
    ids = random_ids(LENGTH)
    with torch.no_grad():
        whole = finite(model(input_ids=ids).logits)
    steps = stepwise(model, ids, None, *PATTERNS[pattern])
    assert (steps - whole).abs().max().item() < 1e-4


@pytest.mark.filterwarnings("ignore:landmark. a row is left-padded")  # 3 pads, not a multiple of mem_freq: said
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_mixed_position_ids_with_left_padding_in_a_batch(pattern):
    """Two rows, one left-padded by 3 tokens, with the padding mask on every call: the same positions whether
    passed or not, so the stepwise logits are the whole forward's for both rows."""
    model = landmarked()
    ids = random_ids(LENGTH, batch=2, seed=4)
    mask = torch.ones_like(ids)
    mask[1, :3], ids[1, :3] = 0, 0
    with torch.no_grad():
        whole = finite(model(input_ids=ids, attention_mask=mask).logits)
    steps = stepwise(model, ids, mask, *PATTERNS[pattern])
    assert (steps - whole)[mask.bool()].abs().max().item() < 1e-4
