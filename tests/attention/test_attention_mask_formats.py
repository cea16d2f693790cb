"""Every ropekit layer attention (Self-Extend, LM-Infinite, Dual Chunk Attention, S²-Attn in training mode,
Landmark in training and retrieval mode) called with every mask format transformers passes (none, flash 2-D padding, sdpa 4-D
bool, eager 4-D additive, flex ``BlockMask``) on a batch with one right- and one left-padded row, with and
without a KV cache: the fast path equals the naive per-pair reference of the method's own rule
(:mod:`pair_reference`), given the canonical sdpa mask. A new method is one more entry in ``METHODS``."""

from __future__ import annotations

import pytest
import torch
from kernel_masks import FORMATS, kernel_mask
from pair_reference import rule_attention

from ropekit.attention import interface
from ropekit.methods.dual_chunk_attention import DualChunkAttention
from ropekit.methods.landmark_attention import (
    LANDMARKS_KWARG,
    LandmarkAttention,
    LandmarkInputs,
)
from ropekit.methods.lm_infinite_attention import LambdaAttention
from ropekit.methods.longlora_attention import ShiftedSparseAttention
from ropekit.methods.self_extend_attention import SelfExtendAttention
from ropekit.core.rope import default_inv_freq

BATCH, HEADS, KV_HEADS, DIM, LENGTH = 2, 4, 2, 16, 72
PADS = ((6, "right"), (9, "left"))  # row 0: 6 padding tokens at the end; row 1: 9 at the start
ATOL = 2e-5
BLOCK = 6  # Landmark: a landmark closes every 6 keys


def inv_freq() -> torch.Tensor:
    return default_inv_freq(10000.0, DIM)


def landmarks(k_len: int) -> dict:
    flags = (torch.arange(k_len) % BLOCK == BLOCK - 1)[None].expand(BATCH, -1)
    return {LANDMARKS_KWARG: LandmarkInputs(is_landmark=flags)}


# name: (layer attention, module mode, cached steps allowed, extra kwargs for k_len)
METHODS = {
    "self_extend": (lambda: SelfExtendAttention(inv_freq, group_size=4, window_size=16, chunk=24), "eval", True,
                    None),
    "lm_infinite": (lambda: LambdaAttention(20, 3, inv_freq, chunk_size=16), "eval", True, None),
    # chunks of L = 30 − 4 = 26 tokens: the 72 keys span three, and every cached query lies past the first
    "dual_chunk": (lambda: DualChunkAttention(inv_freq, 30, 4, chunk=16), "eval", True, None),
    "s2_attn": (lambda: ShiftedSparseAttention(0.25), "train", False, None),
    "landmark_grouped": (lambda: LandmarkAttention(inv_freq, BLOCK - 1, top_k=2, local_blocks=1, chunk=20), "train",
                         True, landmarks),
    "landmark_retrieval": (lambda: LandmarkAttention(inv_freq, BLOCK - 1, top_k=2, local_blocks=1, chunk=20), "eval",
                           True, landmarks),
}


def _no_kernel(*args, **kwargs):
    raise AssertionError("the plain kernel must not run: every case here is past the method's window")


def batch(padded: bool, q_len: int, seed: int = 0):
    """Rotated-looking q (B, H, Lq, D), k/v (B, H_kv, Lk, D), the padding mask (B, Lk) and the queries'
    positions (B, Lq) as generate builds them (left padding: real tokens from 0, padding at 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, HEADS, q_len, DIM, generator=gen) * 1.5
    k = torch.randn(BATCH, KV_HEADS, LENGTH, DIM, generator=gen) * 1.5
    v = torch.randn(BATCH, KV_HEADS, LENGTH, DIM, generator=gen)
    real = torch.ones(BATCH, LENGTH, dtype=torch.long)
    if padded:
        for b, (n, side) in enumerate(PADS):
            if side == "left":
                real[b, :n] = 0
            else:
                real[b, LENGTH - n:] = 0
    pos = (real.cumsum(-1) - 1).masked_fill(real == 0, 1)
    pos[0] = torch.arange(LENGTH)  # the right-padded row keeps its arange positions
    return q, k, v, real, pos[:, LENGTH - q_len:]


def plain_attention(q, k, v, allowed, scale) -> torch.Tensor:
    """(B, Lq, H, D) float64 plain softmax attention under ``allowed`` (B|1, 1, Lq, Lk): the teeth."""
    k = k.double().repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.double().repeat_interleave(HEADS // KV_HEADS, dim=1)
    logits = (q.double() @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    return (torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v).transpose(1, 2)


# cached steps: a chunk of 8 queries, or (no mask) one decoding step — without a mask a longer chunk is sdpa's
# static-cache prefill (top-left aligned), which the dispatcher cuts to Lq = Lk before a method sees it
# (tests/attention/test_static_cache.py)
CASES = [(method, fmt, q_len) for method, (_, _, cached, _) in METHODS.items() for fmt in FORMATS
         for q_len in ((LENGTH, 1 if fmt == "none" else 8) if cached else (LENGTH,))]


@pytest.mark.parametrize("method,fmt,q_len", CASES)
def test_fast_path_equals_the_rule_for_every_mask_format(method, fmt, q_len):
    make, mode, _, extra = METHODS[method]
    attend = make()
    module = torch.nn.Module().train(mode == "train")
    q, k, v, real, pos = batch(padded=fmt != "none", q_len=q_len)
    scale = DIM ** -0.5
    kwargs = {"position_ids": pos, **(extra(LENGTH) if extra else {})}
    mask = kernel_mask(fmt, real, q_len)
    out, weights = attend(module, q, k, v, mask, scaling=scale, dropout=0.0, kernel=_no_kernel, **dict(kwargs))
    assert weights is None and out.shape == (BATCH, q_len, HEADS, DIM)
    canonical = kernel_mask("sdpa", real, q_len)
    want = rule_attention(attend, module, q, k, v, canonical, scaling=scale, **dict(kwargs))
    rows = real[:, LENGTH - q_len:].bool()  # real query rows (padding rows are discarded by the model)
    torch.testing.assert_close(out.double()[rows], want[rows], rtol=0, atol=ATOL)
    # teeth: the method is not plain attention here
    plain = plain_attention(q, k, v, canonical, scale)
    assert (out.double()[rows] - plain[rows]).abs().max() > 1e-3


@pytest.mark.parametrize("method", list(METHODS))
def test_the_rule_reads_every_mask_format_alike(method):
    """The rule itself gets the same answer from every format (it reads them through ``AttentionMask``)."""
    make, mode, _, extra = METHODS[method]
    attend = make()
    module = torch.nn.Module().train(mode == "train")
    q, k, v, real, pos = batch(padded=True, q_len=LENGTH, seed=1)
    kwargs = {"position_ids": pos, **(extra(LENGTH) if extra else {})}
    rows = real.bool()
    want = rule_attention(attend, module, q, k, v, kernel_mask("sdpa", real, LENGTH), scaling=0.3, **dict(kwargs))
    for fmt in ("flash", "eager", "flex"):
        got = rule_attention(attend, module, q, k, v, kernel_mask(fmt, real, LENGTH), scaling=0.3, **dict(kwargs))
        torch.testing.assert_close(got[rows], want[rows], rtol=0, atol=1e-12, msg=lambda m, fmt=fmt: f"{fmt}: {m}")


@pytest.mark.parametrize("boundaries", [False, True], ids=["flash_wrapper_position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("method", ["self_extend", "lm_infinite", "dual_chunk", "s2_attn"])
def test_a_padding_free_packed_row_attends_within_its_documents(method, boundaries):
    """What a flash kernel gets for a padding-free packed batch (DataCollatorWithFlattening): one row, no mask,
    positions restarting per document (and cu_seq_lens). transformers' flash kernel attends within each document;
    so must the methods (they attended across documents before). The reference: the method's rule given the
    block-diagonal causal mask transformers builds for the same row under sdpa."""
    make, mode, _, _ = METHODS[method]
    attend = make()
    module = torch.nn.Module().train(mode == "train")
    sizes = (30, LENGTH - 30)
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, HEADS, LENGTH, DIM, generator=gen) * 1.5
    k = torch.randn(1, KV_HEADS, LENGTH, DIM, generator=gen) * 1.5
    v = torch.randn(1, KV_HEADS, LENGTH, DIM, generator=gen)
    pos = torch.cat([torch.arange(n) for n in sizes])[None]
    document = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    block_diagonal = (document[:, None] == document[None, :]) & torch.ones(LENGTH, LENGTH).tril().bool()
    kwargs = {"position_ids": pos}
    if boundaries:  # DataCollatorWithFlattening's kwargs, straight to the layer attention
        cu = torch.tensor([0, sizes[0], LENGTH], dtype=torch.int32)
        kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(sizes), max_length_k=max(sizes))

        def run(values):
            return attend(module, q, k, values, None, scaling=DIM ** -0.5, dropout=0.0, kernel=_no_kernel,
                          **dict(kwargs))[0]
    else:  # restarting positions alone, through ropekit's flash_attention_2 function (it finds the documents)
        module.ropekit_transforms, module.ropekit_attend = (), attend
        flash = interface._make_attention("flash_attention_2")

        def run(values):
            return flash(module, q, k, values, None, scaling=DIM ** -0.5, dropout=0.0, **dict(kwargs))[0]
    out = run(v)
    want = rule_attention(attend, module, q, k, v, block_diagonal[None, None], scaling=DIM ** -0.5, **dict(kwargs))
    torch.testing.assert_close(out.double(), want, rtol=0, atol=ATOL)
    # teeth: the second document's outputs do not move when only the first one's values change
    moved = v.clone()
    moved[:, :, :sizes[0]] += 10.0
    assert torch.equal(run(moved)[:, sizes[0]:], out[:, sizes[0]:])


@pytest.mark.parametrize("method", ["self_extend", "lm_infinite", "dual_chunk", "s2_attn"])
def test_packed_rows_of_a_larger_batch_attend_within_their_documents(method):
    """The trainer's document masks reach a flash kernel as varlen kwargs over the flattened batch (transformers
    finds documents from positions only in a one-row batch): two rows of two documents each, given no mask. The
    reference: the method's rule under the block-diagonal causal 4-D mask of each row."""
    from ropekit.train.data import document_varlen_kwargs

    make, mode, _, _ = METHODS[method]
    attend = make()
    module = torch.nn.Module().train(mode == "train")
    sizes = ((30, LENGTH - 30), (45, LENGTH - 45))
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, HEADS, LENGTH, DIM, generator=gen) * 1.5
    k = torch.randn(2, KV_HEADS, LENGTH, DIM, generator=gen) * 1.5
    v = torch.randn(2, KV_HEADS, LENGTH, DIM, generator=gen)
    pos = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in sizes])
    document = torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(row)]) for row in sizes])
    causal = torch.ones(LENGTH, LENGTH).tril().bool()
    blocks = (document[:, :, None] == document[:, None, :]) & causal  # (2, L, L)

    class FlashModel:  # what document_varlen_kwargs reads of a model: its attention implementation
        config = type("C", (), {"_attn_implementation": "flash_attention_2"})()

    kwargs = {"position_ids": pos, **document_varlen_kwargs(blocks[:, None], FlashModel(), pos)}
    assert kwargs["cu_seq_lens_k"].tolist() == [0, 30, LENGTH, LENGTH + 45, 2 * LENGTH]
    out, _ = attend(module, q, k, v, None, scaling=DIM ** -0.5, dropout=0.0, kernel=_no_kernel, **dict(kwargs))
    want = rule_attention(attend, module, q, k, v, blocks[:, None], scaling=DIM ** -0.5, **dict(kwargs))
    torch.testing.assert_close(out.double(), want, rtol=0, atol=ATOL)

