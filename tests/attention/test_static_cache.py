"""A static KV cache (``StaticCache``, ``generate(cache_implementation="static")``) hands the attention function
all of its slots, the unwritten ones masked. The methods that read key positions (Self-Extend, LM-Infinite, Dual
Chunk, HARPE's per-head RoPE, Landmark) read them as ending at the last query, which only the written slots do:
before ``ropekit.attention.masks.without_unwritten_keys`` their logits were off by 0.05–0.5 (Landmark refused).

Each method's one-pass forward is checked against its naive rule in its own test module; here the cached passes
(a static cache's first prefill, a chunk, single tokens) must equal that one pass, for each kernel's mask format.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from layer_records import sharpen
from transformers import StaticCache

import ropekit
from ropekit.attention import interface
from ropekit.attention.masks import written_keys, without_unwritten_keys
from ropekit.core.hf_compat import cache_argument
from ropekit.errors import RopekitError
from ropekit.models.tiny import build_tiny_model

WINDOW = 32
LENGTH = 60
METHODS = {
    "self_extend": {"group_size": 3, "window_size": 8},
    "lm_infinite": {"local_window": 16, "global_tokens": 3},
    "dual_chunk": {"chunk_size": 20, "local_size": 4},
    "harpe": {"strategy": "uniform", "b_min": 1e4, "b_max": 4e4},
    "landmark": {"mem_freq": 5, "top_k": 2},
}


def _model(method: str, kernel: str):
    model = build_tiny_model("llama", window=WINDOW, attn_implementation=kernel)
    sharpen(model, 4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Landmark's new token, HARPE's "needs training"
        return ropekit.extend(model, method, **METHODS[method])


def _static_passes(model, ids, cuts):
    """Logits of ``ids`` fed in the pieces ``cuts`` through one static cache with room to spare."""
    cache = StaticCache(config=model.config, max_cache_len=LENGTH + 36)
    out, start = [], 0
    with torch.no_grad():
        for end in cuts:
            out.append(model(ids[:, start:end], **{cache_argument(model): cache}, use_cache=True).logits)
            start = end
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
@pytest.mark.parametrize("method", list(METHODS))
def test_a_static_cache_computes_the_one_pass(method, kernel):
    model = _model(method, kernel)
    ids = torch.randint(3, 200, (1, LENGTH), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
    cuts = [40, 47, *range(48, LENGTH + 1)]  # the cache's first prefill (past the window), a chunk, single tokens
    got = _static_passes(model, ids, cuts)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)


def test_the_dropped_slots_are_what_broke_it(monkeypatch):
    """Teeth: with the unwritten slots left in, Self-Extend's cached passes leave the one pass."""
    model = _model("self_extend", "sdpa")
    ids = torch.randint(3, 200, (1, LENGTH), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
    monkeypatch.setattr(interface, "without_unwritten_keys", lambda key, value, mask, q_len, kernel: (key, value, mask))
    got = _static_passes(model, ids, [40, *range(41, LENGTH + 1)])
    assert (got - want).abs().max() > 1e-2


def test_generate_with_a_static_cache_equals_the_dynamic_one():
    model = _model("dual_chunk", "sdpa")
    ids = torch.randint(3, 200, (2, 44), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    kw = {"max_new_tokens": 8, "do_sample": False, "output_logits": True, "return_dict_in_generate": True,
          "pad_token_id": 0}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # past the declared window
        dynamic = model.generate(ids, attention_mask=mask, **kw)
        static = model.generate(ids, attention_mask=mask, cache_implementation="static", **kw)
    assert torch.equal(static.sequences, dynamic.sequences)
    for a, b in zip(static.logits, dynamic.logits):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)


@pytest.mark.parametrize("method", ["self_extend", "harpe"])
def test_generates_automatic_compilation_of_a_static_cache_is_off_for_these_methods(method):
    """On a GPU, generate compiles the decoding step of a static cache by itself; a compiled graph cannot read the
    written slots (written_keys), so the methods' key positions came out shifted by the unwritten ones (logits off
    by ~0.6). ropekit turns that automatic compilation off: forced here on the CPU (transformers' own switch for
    it), the static cache's generate equals the dynamic one's, and a plain model still compiles."""
    from transformers import CompileConfig

    model = _model(method, "sdpa")
    assert model.generation_config.disable_compile is True
    ids = torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(3))
    compile_config = CompileConfig(backend="aot_eager")
    compile_config._compile_all_devices = True  # what a CUDA device gets without asking
    kw = {"max_new_tokens": 6, "do_sample": False, "output_logits": True, "return_dict_in_generate": True,
          "pad_token_id": 0}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynamic = model.generate(ids, **kw)
        static = model.generate(ids, cache_implementation="static", compile_config=compile_config, **kw)
    for a, b in zip(static.logits, dynamic.logits):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
    plain = build_tiny_model("llama", window=WINDOW)
    cache = StaticCache(config=plain.config, max_cache_len=64)
    criteria = {"cache": cache, cache_argument(plain): cache}
    assert plain._valid_auto_compile_criteria(criteria, plain.generation_config.__class__(compile_config=compile_config))
    assert not model._valid_auto_compile_criteria(criteria, model.generation_config)


def test_written_keys_reads_each_mask_format():
    """Against masks written out by hand: 6 of 10 slots written, the last 2 of them the queries."""
    q_len, k_len, written = 2, 10, 6
    seen = torch.zeros(1, 1, q_len, k_len, dtype=torch.bool)
    seen[..., 0, :written - 1] = True
    seen[..., 1, :written] = True
    additive = torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float32).min)
    assert written_keys(seen, q_len, k_len, "sdpa") == written
    assert written_keys(additive, q_len, k_len, "eager") == written
    assert written_keys(torch.ones(1, written, dtype=torch.long), q_len, k_len, "flash_attention_2") == written
    # sdpa without a mask: a static cache's first prefill (top-left causal); a dynamic cache's decode step
    assert written_keys(None, 4, k_len, "sdpa") == 4
    assert written_keys(None, 1, k_len, "sdpa") == k_len
    # flash kernels' None is bottom-right aligned: a dynamic cache's chunk, nothing unwritten
    assert written_keys(None, 4, k_len, "flash_attention_2") == k_len
    # every slot written (a dynamic cache), or no cache at all
    full = torch.ones(1, 1, q_len, k_len, dtype=torch.bool)
    assert written_keys(full, q_len, k_len, "sdpa") == k_len
    assert written_keys(None, k_len, k_len, "sdpa") == k_len
    key = torch.randn(1, 2, k_len, 8)
    k, v, m = without_unwritten_keys(key, key, seen, q_len, "sdpa")
    assert k.shape[2] == v.shape[2] == m.shape[-1] == written and torch.equal(k, key[:, :, :written])


def test_a_static_cache_with_flex_attention_is_refused_in_one_line():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    q_len, k_len, written = 2, 256, 130

    def mask_mod(b, h, q, k):
        return k <= q + written - q_len

    block_mask = flex.create_block_mask(mask_mod, None, None, q_len, k_len, device="cpu")
    key = torch.randn(1, 2, k_len, 8)
    assert written_keys(block_mask, q_len, k_len, "flex_attention") == written
    with pytest.raises(RopekitError, match="static KV cache with flex_attention") as err:
        without_unwritten_keys(key, key, block_mask, q_len, "flex_attention")
    assert "\n" not in str(err.value)


def test_a_static_cache_without_room_for_the_landmarks_is_refused_in_one_line():
    """Landmark adds a token after every mem_freq: 40 plain tokens need 48 slots; a 44-slot cache cannot hold them."""
    model = _model("landmark", "sdpa")
    ids = torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(7))
    cache = StaticCache(config=model.config, max_cache_len=44)
    with torch.no_grad(), pytest.raises(RopekitError, match="needs 48 slots.*holds 44") as err:
        model(ids, **{cache_argument(model): cache}, use_cache=True)
    assert "\n" not in str(err.value)
