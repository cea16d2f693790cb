"""``AttentionMask`` against "may attend" masks written out here with Python loops, for every format
transformers hands an attention function — built by transformers' own mask builders (``masking_utils``):
none, the flash kernels' 2-D padding mask, sdpa's 4-D bool mask, eager's 4-D additive mask and
flex-attention's ``BlockMask`` — on left- and right-padded batches, with and without a KV cache."""

from __future__ import annotations

import pytest
import torch
from kernel_masks import FORMATS, kernel_mask
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from transformers.masking_utils import sdpa_mask

from ropekit.attention.masks import AttentionMask, key_positions, query_key_positions
from ropekit.errors import RopekitError


def reference(real: list[list[int]], q_len: int, window: int | None = None) -> torch.Tensor:
    """(B, Lq, Lk) bool from the definition: query row ``r`` is key ``r + Lk − Lq`` and may attend to key
    ``k`` iff ``k ≤ r + Lk − Lq``, key ``k`` is a real token, and (window) ``r + Lk − Lq − k < window``."""
    k_len = len(real[0])
    off = k_len - q_len
    return torch.tensor([[[k <= r + off and real[b][k] == 1 and (window is None or r + off - k < window)
                           for k in range(k_len)] for r in range(q_len)] for b in range(len(real))])


def padding(side: str, k_len: int = 12, pads: tuple[int, ...] = (0, 4)) -> list[list[int]]:
    """1 = real token: row ``b`` has ``pads[b]`` padding tokens on the ``side``."""
    rows = []
    for n in pads:
        row = [1] * k_len
        for t in range(n):
            row[t if side == "left" else k_len - 1 - t] = 0
        rows.append(row)
    return rows


CASES = {
    # name: (padding side, pads per row, query length); 12 keys
    "unpadded": ("left", (0, 0), 12),
    "left": ("left", (0, 4), 12),
    "right": ("right", (3, 0), 12),
    "left-cache": ("left", (2, 5), 5),
    "right-cache": ("right", (0, 3), 5),  # right padding inside the cache (a chunked prefill)
    "left-decode": ("left", (0, 6), 1),
}


def _check(mask: AttentionMask, want: torch.Tensor) -> None:
    """Every view the attention functions use agrees with ``want`` (B, Lq, Lk)."""
    batch, q_len, k_len = want.shape
    full = mask.block(0, q_len, 0, k_len)
    assert full.dtype == torch.bool and full.dim() == 4 and full.shape[1:] == (1, q_len, k_len)
    torch.testing.assert_close(full.expand(batch, 1, q_len, k_len)[:, 0], want, rtol=0, atol=0)
    q0, q1, k0, k1 = q_len // 3, q_len, 2, k_len - 1
    torch.testing.assert_close(mask.block(q0, q1, k0, k1)[:, 0].expand(batch, -1, -1), want[:, q0:q1, k0:k1],
                               rtol=0, atol=0)
    rows = torch.tensor([q_len - 1, 0, q_len // 2])  # any order, repeats allowed
    got = mask.rows(rows, 1, k_len)[:, 0].expand(batch, -1, -1)
    torch.testing.assert_close(got, want[:, rows, 1:], rtol=0, atol=0)
    torch.testing.assert_close(mask.seen_keys().expand(batch, k_len), want.any(dim=1), rtol=0, atol=0)
    torch.testing.assert_close(mask.active_queries().expand(batch, q_len), want.any(dim=2), rtol=0, atol=0)


@pytest.mark.parametrize("case,fmt", [(case, fmt) for case in CASES for fmt in FORMATS
                                      if fmt != "none" or not any(CASES[case][1])])  # no mask cannot pad
def test_every_format_reads_as_the_reference_mask(case, fmt):
    side, pads, q_len = CASES[case]
    real = padding(side, 12, pads)
    mask = AttentionMask(kernel_mask(fmt, real, q_len), q_len, 12, batch=2, heads=4)
    _check(mask, reference(real, q_len))
    # plain causal is known without reading a matrix only where the format says so (no 4-D mask, no BlockMask)
    assert mask.is_causal == (fmt in ("none", "flash") and not any(pads))


def test_plain_causal_is_bottom_right_aligned():
    """No mask: queries are the last ``Lq`` keys (a cached step sees every earlier key)."""
    mask = AttentionMask(None, 3, 5)
    assert mask.is_causal and mask.batch == 1
    assert mask.block(0, 3, 0, 5)[0, 0].tolist() == [[True, True, True, False, False],
                                                      [True, True, True, True, False],
                                                      [True, True, True, True, True]]


def test_a_2d_mask_longer_than_the_keys_is_cut_from_the_right_and_a_shorter_one_hides_the_rest():
    """Sliding/chunked caches keep the last keys (``flash_attention_mask`` slices ``[:, -Lk:]``); a static cache
    has slots past the mask that were never written (transformers' ``_upad_input`` drops them)."""
    real = padding("left", 9, (0, 2))
    longer = torch.tensor([[1, 0, 1] + row for row in real])  # three older tokens the keys no longer hold
    _check(AttentionMask(longer, 9, 9), reference(real, 9))
    shorter = torch.tensor([row[:7] for row in real])  # keys 7 and 8 are unwritten slots
    want = reference([row[:7] + [0, 0] for row in real], 9)
    _check(AttentionMask(shorter, 9, 9), want)
    assert not AttentionMask(shorter, 9, 9).is_causal


def test_a_4d_mask_longer_than_the_keys_is_cut_to_the_first_keys():
    """sdpa's static-cache masks cover every slot; the kernel uses the first ``Lk`` (``[..., :Lk]``)."""
    real = padding("left", 10, (0, 3))
    want = reference(real, 4)
    bool_mask = sdpa_mask(batch_size=2, q_length=4, kv_length=10, q_offset=6, attention_mask=torch.tensor(real).bool(),
                          allow_is_causal_skip=False)
    wider = torch.cat([bool_mask, torch.ones(2, 1, 4, 5, dtype=torch.bool)], dim=-1)
    _check(AttentionMask(wider, 4, 10), want)
    additive = torch.zeros(2, 1, 4, 15).masked_fill(~wider, float("-inf"))  # −∞ as well as dtype-min
    _check(AttentionMask(additive, 4, 10), want)


@pytest.mark.parametrize("fmt", ["none", "flash"])
def test_the_sliding_window_of_flash_kernels_is_applied_where_the_mask_lacks_it(fmt):
    real = padding("left", 12, (0, 0) if fmt == "none" else (0, 5))
    mask = AttentionMask(kernel_mask(fmt, real, 7), 7, 12, sliding_window=4)
    _check(mask, reference(real, 7, window=4))
    assert not mask.is_causal


def test_a_4d_mask_with_equal_heads_is_read_and_one_with_different_heads_is_refused():
    want = reference(padding("right", 8, (2, 0)), 8)
    per_head = want[:, None].expand(2, 3, 8, 8)
    _check(AttentionMask(per_head, 8, 8), want)
    differs = per_head.clone()
    differs[:, 1, 5, 0] = ~differs[:, 1, 5, 0]
    with pytest.raises(RopekitError) as err:
        AttentionMask(differs, 8, 8)
    assert "differs between heads" in str(err.value) and "\n" not in str(err.value)


def test_an_additive_mask_with_other_biases_is_refused():
    bias = torch.zeros(1, 1, 4, 4)
    bias[0, 0, 3, 1] = -5.0  # a soft bias is not a yes/no mask
    with pytest.raises(RopekitError) as err:
        AttentionMask(bias, 4, 4)
    assert "other than 0 and −∞" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("bad", [torch.ones(2, 4, 4), torch.ones(1, 1, 4, 3), torch.ones(1, 1, 2, 4), "causal"])
def test_unreadable_masks_are_refused_in_one_line(bad):
    with pytest.raises(RopekitError) as err:
        AttentionMask(bad, 4, 4)
    assert "\n" not in str(err.value)


# ---- flex attention: block structure and mask_mod ---------------------------------------------------------
def _block_mask(q_len, k_len, block, partial, full, mask_mod):
    """A BlockMask from explicit block lists: ``partial``/``full`` are sets of (query block, key block)."""
    rows = -(-q_len // block)

    def lists(blocks):
        num = torch.zeros(1, 1, rows, dtype=torch.int32)
        idx = torch.zeros(1, 1, rows, -(-k_len // block), dtype=torch.int32)
        for qb in range(rows):
            cols = sorted(kb for (r, kb) in blocks if r == qb)
            num[0, 0, qb] = len(cols)
            idx[0, 0, qb, :len(cols)] = torch.tensor(cols, dtype=torch.int32)
        return num, idx

    (num, idx), (fnum, fidx) = lists(partial), lists(full)
    return BlockMask.from_kv_blocks(num, idx, fnum, fidx, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(q_len, k_len))


def test_flex_full_blocks_ignore_mask_mod_partial_blocks_apply_it_absent_blocks_hide():
    """``flex_attention`` skips ``mask_mod`` on full blocks and skips absent blocks altogether."""
    def even_keys(b, h, q, kv):
        return kv % 2 == 0

    mask = AttentionMask(_block_mask(8, 12, 4, partial={(0, 0), (1, 2)}, full={(0, 1), (1, 0)}, mask_mod=even_keys),
                         8, 12, batch=1, heads=2)
    want = torch.tensor([[[(r // 4, k // 4) in {(0, 1), (1, 0)} or ((r // 4, k // 4) in {(0, 0), (1, 2)} and k % 2 == 0)
                           for k in range(12)] for r in range(8)]])
    _check(mask, want)


def test_flex_mask_mod_of_transformers_sees_batch_and_cache_offset():
    """Built with ``create_block_mask`` (no compile) from transformers' own pieces, as its flex builder does."""
    from transformers.masking_utils import (
        add_offsets_to_mask_function,
        and_masks,
        causal_mask_function,
        padding_mask_function,
    )

    real = padding("left", 16, (0, 7))
    fn = add_offsets_to_mask_function(and_masks(causal_mask_function, padding_mask_function(torch.tensor(real).bool())),
                                      q_offset=10, kv_offset=0)
    block_mask = create_block_mask(fn, B=2, H=None, Q_LEN=6, KV_LEN=16, device="cpu", BLOCK_SIZE=4)
    _check(AttentionMask(block_mask, 6, 16, batch=2, heads=3), reference(real, 6))


def test_flex_masks_that_cannot_be_read_exactly_are_refused_in_one_line():
    def per_head(b, h, q, kv):
        return (kv <= q) & ((h == 0) | (kv > 0))

    def scalar_only(b, h, q, kv):
        return torch.tensor(int(kv) <= int(q))

    causal = create_block_mask(lambda b, h, q, kv: kv <= q, B=None, H=None, Q_LEN=8, KV_LEN=8, device="cpu")
    heads = create_block_mask(per_head, B=None, H=None, Q_LEN=8, KV_LEN=8, device="cpu")
    scalar = create_block_mask(lambda b, h, q, kv: kv <= q, B=None, H=None, Q_LEN=8, KV_LEN=8, device="cpu")
    scalar.mask_mod = scalar_only
    for block_mask, q_len, why in ((causal, 7, "BlockMask for (8, 8)"), (heads, 8, "differs between heads"),
                                   (scalar, 8, "cannot evaluate")):
        with pytest.raises(RopekitError) as err:
            AttentionMask(block_mask, q_len, 8, heads=2).block(0, q_len, 0, 8)
        assert why in str(err.value) and "\n" not in str(err.value), str(err.value)
    # one head: nothing to disagree with
    _check(AttentionMask(heads, 8, 8, heads=1), torch.ones(8, 8, dtype=torch.bool).tril()[None])


# ---- positions ----------------------------------------------------------------------------------------------
def test_key_positions_and_defaults():
    q_pos = torch.tensor([[7, 8], [3, 4]])
    assert key_positions(q_pos, 2) is q_pos
    assert key_positions(q_pos, 5).tolist() == [[4, 5, 6, 7, 8], [0, 1, 2, 3, 4]]
    q, k = query_key_positions(None, 2, 6, "cpu")
    assert q.tolist() == [[4, 5]] and k.tolist() == [[0, 1, 2, 3, 4, 5]] and q.dtype == torch.long
