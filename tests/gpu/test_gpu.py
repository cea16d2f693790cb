"""GPU checks (``-m gpu``; skipped in one line without CUDA): every registered method (frequency methods, attention
methods, Entropy-ABF, CLEX, Dynamic YaRN, Dual Chunk, …) in bfloat16 under sdpa and flash_attention_2 with padded
batches, and a 32k-token Self-Extend / LM-Infinite prefill on a 1B-shaped random model within a memory bound that an
n × n score matrix would break. flash_attention_2 cases skip in one line when ``flash_attn`` is not installed.

CPU check path: ``ROPEKIT_GPU_TEST_DEVICE=cpu pytest -m gpu tests/gpu`` runs the same bodies on the CPU in bfloat16
(sdpa cases; the 32k prefill and CUDA-only checks still skip), to check the bodies on a machine without a GPU.

References: the same extended model in float32 on the CPU (whose paths the CPU suite checks against naive
O(n²) definitions), each padded row against the row alone, and plain transformers inside the window.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import ropekit
from ropekit.demo import demo_settings
from ropekit.install import rope_info
from ropekit.models.tiny import TINY_WINDOW, build_tiny_model

#: Where the bodies run: ``cuda`` (the default), or ``cpu`` to check them in bfloat16 without a GPU.
DEVICE = os.environ.get("ROPEKIT_GPU_TEST_DEVICE", "cuda")
ON_CUDA = DEVICE.startswith("cuda")
cuda_only = pytest.mark.skipif(not ON_CUDA, reason="CUDA-only check (ROPEKIT_GPU_TEST_DEVICE=cpu runs the bodies on CPU)")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(ON_CUDA and not torch.cuda.is_available(), reason="no CUDA GPU (run -m gpu on a machine with one)"),
]

#: Every registered method, with the demo's parameters for the tiny model (factor 4: its 64-token window → 256;
#: LongRoPE gets NTK's per-pair factors, the one method that cannot run on ``factor`` alone).
METHODS = demo_settings(rope_info(build_tiny_model("llama", seed=0)), factor=4.0)
#: bfloat16 logits of a random tiny model: ~3 significant digits, logits of order 1.
ATOL_BF16 = 6e-2


HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None


def _kernels():
    """sdpa always; flash_attention_2 as a case that skips in one line where it cannot run (never dropped)."""
    flash_skip = None
    if not HAS_FLASH_ATTN:
        flash_skip = "flash_attention_2: the flash_attn package is not installed (pip install flash-attn)"
    elif not ON_CUDA:
        flash_skip = "flash_attention_2 needs a CUDA GPU (the CPU check path runs sdpa only)"
    flash = pytest.param("flash_attention_2", marks=pytest.mark.skipif(flash_skip is not None, reason=flash_skip or ""))
    return ["sdpa", flash]


def _model(method: str, attn: str, device: str, dtype: torch.dtype):
    model = build_tiny_model("llama", seed=0, attn_implementation=attn if attn != "flash_attention_2" else "sdpa")
    if attn == "flash_attention_2":
        model = model.to(dtype)  # flash_attention_2 refuses float32 weights
        model.set_attn_implementation("flash_attention_2")
    model = ropekit.extend(model, method, **METHODS[method])
    return model.to(device=device, dtype=dtype).eval()


def _batch(device: str, length: int = 3 * TINY_WINDOW):
    """A left-padded batch (as generate builds it) and its rows alone."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 256, (2, length), generator=gen)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, :37] = 0
    return ids.to(device), mask.to(device)


@pytest.mark.parametrize("attn", _kernels())
@pytest.mark.parametrize("method", sorted(METHODS))
def test_bf16_padded_batch_matches_rows_alone_and_float32_cpu(method, attn):
    model = _model(method, attn, DEVICE, torch.bfloat16)
    ids, mask = _batch(DEVICE)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=pos).logits.float()
        alone = model(ids[1:, 37:], position_ids=pos[1:, 37:]).logits.float()
    assert not torch.isnan(batch[mask.bool()]).any()  # (landmark masks its own token: −∞ there)
    if method != "landmark":  # landmark's blocks follow key indices: padding moves them (float32 on CPU too)
        torch.testing.assert_close(batch[1, 37:], alone[0], atol=ATOL_BF16, rtol=0)

    reference = _model(method, "sdpa", "cpu", torch.float32)
    with torch.no_grad():
        want = reference(ids[:1].cpu()).logits
        got = model(ids[:1]).logits.float().cpu()
    torch.testing.assert_close(got, want, atol=ATOL_BF16, rtol=0)


#: bfloat16's unit roundoff: 8 significant bits, so one rounding moves a value by at most 2⁻⁸ of its size.
BF16_UNIT_ROUNDOFF = 2.0 ** -8


def bf16_logit_tolerance(reference: torch.Tensor) -> float:
    """How far bfloat16 logits may lie from exact ones: ``4·u·max|z|``. A logit is rounded once when it is stored
    (``u·|z|``), and it inherits the roundings of the hidden state it is read from — the last residual sum, the
    final norm and the head, each a relative error of order ``u`` of a vector whose image has the logits' scale —
    which is where the other three ``u·max|z|`` go. The tiny model's two layers add nothing larger: measured on the
    CPU path, the logits stay within 1.5 u·max|z| of float32."""
    return 4 * BF16_UNIT_ROUNDOFF * float(reference.abs().max())


@pytest.mark.parametrize("attn", _kernels())
@pytest.mark.parametrize("method", ["self_extend", "lm_infinite", "dual_chunk", "dynamic_yarn", "yarn"])
def test_bf16_cached_generate_equals_the_uncached_forward(method, attn):
    """Greedy generation with the KV cache gives, at every step, the logits of one uncached forward over the same
    tokens — in bfloat16 on the device, and the float32 model on the CPU — within bfloat16's rounding; and each
    generated token is the float32 argmax wherever that argmax leads by more than twice the tolerance (a lead that
    rounding within the tolerance cannot overturn; closer calls are ties bfloat16 cannot decide)."""
    model = _model(method, attn, DEVICE, torch.bfloat16)
    ids, _ = _batch(DEVICE)
    prompt = ids[:1]
    start = prompt.shape[1] - 1
    with torch.no_grad():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                             min_new_tokens=8, do_sample=False, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)
        tokens = out.sequences
        cached = torch.cat([step.float() for step in out.logits]).cpu()
        uncached = model(tokens[:, :-1]).logits[0, start:].float().cpu()
        exact = _model(method, "sdpa", "cpu", torch.float32)(tokens[:, :-1].cpu()).logits[0, start:]
    tol = bf16_logit_tolerance(exact)
    torch.testing.assert_close(cached, exact, atol=tol, rtol=0)
    torch.testing.assert_close(uncached, exact, atol=tol, rtol=0)
    torch.testing.assert_close(cached, uncached, atol=tol, rtol=0)
    top2 = exact.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 2 * tol
    generated = tokens[0, prompt.shape[1]:].cpu()
    assert torch.equal(generated[decided], exact.argmax(-1)[decided])


@pytest.mark.parametrize("attn", _kernels())
@pytest.mark.parametrize("method", ["self_extend", "lm_infinite", "dual_chunk", "harpe"])
def test_bf16_static_cache_generates_what_one_forward_computes(method, attn):
    """``generate(cache_implementation="static")`` — all of the cache's slots reach the attention function, the
    unwritten ones masked — gives at every step the float32 CPU model's logits over the same tokens, within
    bfloat16's rounding, for the methods that read key positions (tests/attention/test_static_cache.py in float32;
    Landmark takes a static cache there, through the model's own calls: generate builds it a 4-D mask)."""
    from transformers import StaticCache

    model = _model(method, attn, DEVICE, torch.bfloat16)
    ids, _ = _batch(DEVICE)
    prompt = ids[:1]
    start = prompt.shape[1] - 1
    cache = StaticCache(config=model.config, max_cache_len=prompt.shape[1] + 20)
    with torch.no_grad():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                             min_new_tokens=8, do_sample=False, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True, cache=cache)
        static = torch.cat([step.float() for step in out.logits]).cpu()
        exact = _model(method, "sdpa", "cpu", torch.float32)(out.sequences[:, :-1].cpu()).logits[0, start:]
    torch.testing.assert_close(static, exact, atol=bf16_logit_tolerance(exact), rtol=0)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_installs_on_a_model_already_on_the_device(method):
    """The order a study and the CLI use — load on the GPU, then extend — gives the model that extending on the CPU
    and moving it gives (a capability probe that built its positions on the CPU broke every method this way)."""
    model = build_tiny_model("llama", seed=0).to(device=DEVICE, dtype=torch.bfloat16)
    model = ropekit.extend(model, method, **METHODS[method]).eval()
    reference = _model(method, "sdpa", DEVICE, torch.bfloat16)
    ids, _ = _batch(DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(model(ids[:1]).logits.float(), reference(ids[:1]).logits.float(),
                                   atol=ATOL_BF16, rtol=0)


def _one_b_model(device: str = "cuda"):
    """A random model of Llama-3.2-1B's shape (2048 wide, 16 layers, 32 heads / 8 KV heads of 64) with a 4k window,
    in bfloat16 — only the shape matters for memory and speed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    with torch.device(device):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return model


@cuda_only
@pytest.mark.parametrize("method", ["self_extend", "lm_infinite"])
def test_32k_prefill_of_a_1b_shaped_model_stays_within_memory(method):
    n = 32768
    model = ropekit.extend(_one_b_model(), method, factor=8)
    ids = torch.randint(3, 32000, (1, n), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        logits = model(ids, use_cache=False, logits_to_keep=1).logits
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert torch.isfinite(logits).all()
    # one layer's n × n scores for 32 heads in bf16 would be 64 GiB; activations of a 1B model at 32k are ~1 GiB,
    # and ropekit's blocks are O(n · chunk) per head
    assert extra < 12 * 2**30, f"{extra / 2**30:.1f} GiB above the weights"


@cuda_only
def test_device_auto_resolves_to_this_gpu():
    from ropekit.runtime.devices import resolve_devices

    plan = resolve_devices()
    assert plan.device == "cuda:0" and plan.dtype in ("bfloat16", "float16")
    assert plan.attn in ("flash_attention_2", "sdpa")


@pytest.mark.skipif(not (HAS_FLASH_ATTN and ON_CUDA), reason="flash_attention_2 needs the flash_attn package and a CUDA GPU")
@pytest.mark.parametrize("method", [None, "longlora"])
def test_document_masked_loss_of_a_two_row_batch_is_the_same_under_flash(method):
    """The trainer hands flash a document mask as varlen kwargs over the flattened batch; without them the rows of a
    micro-batch above one attended across their documents. The reference: sdpa with the 4-D document mask."""
    from ropekit.train.objective import token_loss_sum

    length, sizes = 96, ((40, 56), (70, 26))
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in sizes])
    document = torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(row)]) for row in sizes])
    blocks = (document[:, :, None] == document[:, None, :]) & torch.ones(length, length).tril().bool()
    ids = torch.randint(3, 256, (2, length), generator=torch.Generator().manual_seed(1))
    labels = ids.masked_fill(positions == 0, -100)  # a document's first token is not predicted from the last one
    losses = {}
    for attn in ("sdpa", "flash_attention_2"):
        model = build_tiny_model("llama", seed=0).to(torch.bfloat16)
        if attn != "sdpa":
            model.set_attn_implementation(attn)
        if method:
            ropekit.extend(model, method, factor=2.0)
        model = model.to(DEVICE).train()
        batch = {"input_ids": ids.to(DEVICE), "labels": labels.to(DEVICE), "position_ids": positions.to(DEVICE),
                 "attention_mask": blocks[:, None].to(DEVICE)}
        with torch.no_grad():
            losses[attn] = float(token_loss_sum(model, model, torch.bfloat16, batch))
    assert abs(losses["sdpa"] - losses["flash_attention_2"]) <= 2e-2 * abs(losses["sdpa"])
