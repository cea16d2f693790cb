"""Generation-based evaluations (passkey, NIAH, RULER, LongBench) on a model whose RoPE follows the longest input
seen (Dynamic NTK): a prompt generated after a longer one used the longer one's frequencies, so a sample's answer
depended on the samples before it. Each generation now starts from the installed state, as in a fresh process."""

from __future__ import annotations

import torch

import ropekit
from ropekit.eval.common import greedy_generate
from ropekit.install import rope_info
from ropekit.models.tiny import build_tiny_model


def _frequencies_used(model, prompt: list[int]) -> torch.Tensor:
    """The rotary module's inverse frequencies as its first forward of this generation left them."""
    rotary = model.model.rotary_emb
    seen: list[torch.Tensor] = []
    handle = rotary.register_forward_hook(lambda module, args, out: seen.append(module.inv_freq.clone()))
    try:
        greedy_generate(model, prompt, 1)
    finally:
        handle.remove()
    return seen[0]


def test_a_prompt_after_a_longer_one_gets_its_own_frequencies():
    def fresh():
        return ropekit.extend(build_tiny_model("llama"), "dynamic_ntk", factor=2.0)

    model = fresh()
    window = rope_info(model).original_window
    long_prompt = list(range(3, 3 + 3 * window))
    medium = list(range(5, 5 + window + window // 2))  # past the window, shorter than the first
    greedy_generate(model, long_prompt, 2)
    used = _frequencies_used(model, medium)
    alone = _frequencies_used(fresh(), medium)
    torch.testing.assert_close(used, alone, rtol=0, atol=0)
    after_long_without_reset = _frequencies_used(fresh(), long_prompt)
    assert (after_long_without_reset - alone).abs().max() > 1e-6  # the two lengths' frequencies do differ
