"""Packing rows, document masks and length upsampling against naive re-computations."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from ropekit.data.packing import (
    IGNORE_INDEX,
    PackedPieces,
    PackedStream,
    UpsampleConfig,
    prepare_attention_mask,
    upsample_long,
)
from ropekit.errors import RopekitError

EOS = 0


def _docs(seed: int, n: int, lo: int = 1, hi: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(3, 255) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _naive_stream(docs):
    """Tokens and, per token, (document number, offset inside the document incl. its EOS)."""
    tokens, owner = [], []
    for d, doc in enumerate(docs):
        for k, tok in enumerate(doc + [EOS]):
            tokens.append(tok)
            owner.append((d, k))
    return tokens, owner


@pytest.mark.parametrize("reset,doc_mask", [(False, False), (True, False), (False, True), (True, True)])
def test_stream_rows_against_naive(reset, doc_mask):
    docs = _docs(1, 23)
    L = 32
    packed = PackedStream(docs, L, eos_id=EOS, drop_last=True)
    tokens, owner = _naive_stream(docs)
    n_rows = len(tokens) // L
    assert len(packed) == n_rows
    seen = []
    for r in range(n_rows):
        row = packed.row(r, reset_positions=reset, document_mask=doc_mask)
        ids = row["input_ids"].tolist()
        seen.extend(ids)
        own = [owner[r * L + t][0] for t in range(L)]
        # positions: restart at each document start and at the row start (a cut document restarts at 0)
        expected_pos, counter = [], 0
        for t in range(L):
            if t > 0 and own[t] != own[t - 1]:
                counter = 0
            expected_pos.append(counter if reset else t)
            counter += 1
        assert row["position_ids"].tolist() == expected_pos
        # labels: the ids, except a document's first token under the document mask
        expected_labels = [IGNORE_INDEX if doc_mask and t > 0 and own[t] != own[t - 1] else ids[t] for t in range(L)]
        assert row["labels"].tolist() == expected_labels
        if doc_mask:
            naive = torch.tensor([[j <= i and own[i] == own[j] for j in range(L)] for i in range(L)])
            assert row["attention_mask"].shape == (1, L, L) and row["attention_mask"].dtype == torch.bool
            assert torch.equal(row["attention_mask"][0], naive)
        else:
            assert torch.equal(row["attention_mask"], torch.ones(L, dtype=torch.long))
    # every token appears exactly once, in order (the partial last row is dropped)
    assert seen == tokens[: n_rows * L]


def test_stream_padded_last_row():
    docs = _docs(2, 5)
    L = 16
    packed = PackedStream(docs, L, eos_id=EOS, pad_id=7, drop_last=False)
    tokens, _ = _naive_stream(docs)
    assert len(packed) == math.ceil(len(tokens) / L)
    last = packed.row(len(packed) - 1, document_mask=False)
    real = len(tokens) - (len(packed) - 1) * L
    assert last["input_ids"][:real].tolist() == tokens[(len(packed) - 1) * L:]
    assert last["input_ids"][real:].tolist() == [7] * (L - real)
    assert last["labels"][real:].tolist() == [IGNORE_INDEX] * (L - real)
    assert last["attention_mask"].tolist() == [1] * real + [0] * (L - real)
    masked = packed.row(len(packed) - 1, document_mask=True)["attention_mask"][0]
    for i in range(real, L):  # padding attends to padding only, never to an empty row
        assert masked[i].tolist() == [real <= j <= i for j in range(L)]


def test_pieces_next_fit_whole():
    rng = random.Random(3)
    pieces = []
    for _ in range(12):
        n = rng.randint(2, 12)
        ids = [rng.randint(3, 255) for _ in range(n)]
        labels = [t if rng.random() < 0.5 else IGNORE_INDEX for t in ids]
        pieces.append((ids, labels))
    L = 20
    packed = PackedPieces(pieces, L, pad_id=1)
    # naive next fit
    rows, used = [], L
    for i, (ids, _) in enumerate(pieces):
        if used + len(ids) > L:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += len(ids)
    assert packed.rows == rows
    for r, members in enumerate(rows):
        row = packed.row(r, reset_positions=True, document_mask=True)
        at = 0
        for k, i in enumerate(members):
            ids, labels = pieces[i]
            n = len(ids)
            assert row["input_ids"][at:at + n].tolist() == ids
            exp = list(labels)
            if at > 0:
                exp[0] = IGNORE_INDEX  # first token of a later piece: the previous piece is masked away
            assert row["labels"][at:at + n].tolist() == exp
            assert row["position_ids"][at:at + n].tolist() == list(range(n))
            at += n
        assert row["input_ids"][at:].tolist() == [1] * (L - at)
        assert row["labels"][at:].tolist() == [IGNORE_INDEX] * (L - at)
    one_each = PackedPieces(pieces, L, pad_id=1, pack=False)
    assert one_each.rows == [[i] for i in range(len(pieces))]
    with pytest.raises(RopekitError):
        PackedPieces([([5] * 30, [5] * 30)], L, pad_id=1)


def test_document_mask_forward_equals_documents_alone():
    """sdpa and eager: each document's logits in a packed row equal the document run alone."""
    from ropekit.models.tiny import build_tiny_model

    docs = _docs(4, 3, lo=10, hi=20)
    L = sum(len(d) + 1 for d in docs)  # exactly one row, no partial documents
    packed = PackedStream(docs, L, eos_id=EOS)
    row = packed.row(0, reset_positions=True, document_mask=True)
    batch = {k: v.unsqueeze(0) for k, v in row.items()}
    model = build_tiny_model("llama", seed=1)
    for impl in ("sdpa", "eager"):
        model.set_attn_implementation(impl)
        mask = prepare_attention_mask(batch["attention_mask"], impl, torch.float32, batch["position_ids"])
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask,
                           use_cache=False).logits[0]
            at = 0
            for doc in docs:
                ids = torch.tensor([doc + [EOS]])
                alone = model(input_ids=ids, use_cache=False).logits[0]
                torch.testing.assert_close(logits[at:at + ids.shape[1]], alone, atol=1e-5, rtol=1e-5)
                at += ids.shape[1]
    # the conversion matters: eager would *add* a boolean mask as 0/1 and leak across documents
    model.set_attn_implementation("eager")
    with torch.no_grad():
        raw = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                    attention_mask=batch["attention_mask"], use_cache=False).logits[0]
    assert not torch.allclose(raw, logits, atol=1e-3)


def test_prepare_attention_mask_formats():
    docs = _docs(5, 4, lo=3, hi=8)
    L = 12
    packed = PackedStream(docs, L, eos_id=EOS)
    row = packed.row(1, reset_positions=True, document_mask=True)
    mask = row["attention_mask"].unsqueeze(0)
    assert prepare_attention_mask(mask, "sdpa") is mask
    additive = prepare_attention_mask(mask, "eager", torch.bfloat16)
    assert additive.dtype == torch.bfloat16
    assert torch.equal(additive == 0, mask)
    assert prepare_attention_mask(mask, "flash_attention_2", position_ids=row["position_ids"].unsqueeze(0)) is None
    plain = packed.row(1, reset_positions=False, document_mask=True)
    with pytest.raises(RopekitError, match="reset_positions"):
        prepare_attention_mask(plain["attention_mask"].unsqueeze(0), "flash_attention_2",
                               position_ids=plain["position_ids"].unsqueeze(0))
    two_d = torch.ones(1, L, dtype=torch.long)
    assert prepare_attention_mask(two_d, "eager") is two_d


def test_flash_refuses_restarting_positions_under_a_2d_mask():
    """transformers' flash path reads restarting positions as separate documents, but only for one unpadded row."""
    from transformers.modeling_flash_attention_utils import _is_packed_sequence, prepare_fa_kwargs_from_position_ids

    docs = _docs(5, 3, lo=4, hi=6)
    L = sum(len(d) + 1 for d in docs)
    row = PackedStream(docs, L, eos_id=EOS).row(0, reset_positions=True, document_mask=False)
    mask, positions = row["attention_mask"].unsqueeze(0), row["position_ids"].unsqueeze(0)
    assert mask.dim() == 2 and bool(mask.all())
    # transformers' own reading: one unpadded row -> three varlen blocks; two rows -> plain causal
    (cu, _), _ = prepare_fa_kwargs_from_position_ids(positions)
    assert _is_packed_sequence(positions, 1) and cu.numel() - 1 == 3
    assert not _is_packed_sequence(positions.repeat(2, 1), 2)
    with pytest.raises(RopekitError, match="document_mask"):
        prepare_attention_mask(mask, "flash_attention_2", position_ids=positions)
    assert prepare_attention_mask(mask, "sdpa", position_ids=positions) is mask
    # PoSE-style skipped positions only go up: flash reads them as one sequence, and they pass
    skipped = torch.cat([torch.arange(5), torch.arange(5) + 40]).unsqueeze(0)
    (cu, _), _ = prepare_fa_kwargs_from_position_ids(skipped)
    assert cu.tolist() == [0, 10]
    ones = torch.ones(1, 10, dtype=torch.long)
    assert prepare_attention_mask(ones, "flash_attention_2", position_ids=skipped) is ones


def test_upsample_repeat_long_exact_counts():
    lengths = [5, 50, 7, 100, 49, 3]
    chosen = upsample_long(lengths, UpsampleConfig(threshold=50, factor=3, mode="repeat_long"), seed=0)
    counts = [chosen.count(i) for i in range(len(lengths))]
    assert counts == [1, 3, 1, 3, 1, 1]
    assert chosen == sorted(chosen)  # document order kept
    assert upsample_long(lengths, None, seed=0) == list(range(len(lengths)))


def test_upsample_fractional_and_downsample_rates():
    n = 4000
    lengths = [10] * n + [1000] * n
    chosen = upsample_long(lengths, UpsampleConfig(threshold=500, factor=2.5, mode="repeat_long"), seed=1)
    tally = Counter(chosen)
    long_counts = [tally[i] for i in range(n, 2 * n)]
    assert set(long_counts) <= {2, 3}
    # each long document has 3 copies with probability 0.5: binomial(n, 0.5), 5 standard deviations
    threes = long_counts.count(3)
    assert abs(threes - n * 0.5) < 5 * math.sqrt(n * 0.25)
    assert all(tally[i] == 1 for i in range(n))
    kept = upsample_long(lengths, UpsampleConfig(threshold=500, factor=4), seed=2)  # Fu et al.: keep short w.p. 1/4
    short_kept = sum(1 for i in kept if i < n)
    assert abs(short_kept - n / 4) < 5 * math.sqrt(n * 0.25 * 0.75)
    assert [i for i in kept if i >= n] == list(range(n, 2 * n))
    # long/short frequency ratio is the factor, both ways
    assert abs((n / short_kept) - 4) < 0.5


def test_upsample_config_errors():
    for kwargs in ({"threshold": 0, "factor": 2}, {"threshold": 10, "factor": 0.5},
                   {"threshold": 10, "factor": 2, "mode": "sideways"}):
        with pytest.raises(RopekitError) as err:
            UpsampleConfig(**kwargs)
        assert "\n" not in str(err.value)


def test_padded_document_mask_loss_equals_pieces_alone():
    """Padded SFT row under the document mask: the loss is the token-average over the pieces run alone,
    and the backward pass is finite (padding is its own segment: no query row is fully masked)."""
    import torch.nn.functional as F

    from ropekit.models.tiny import build_tiny_model

    pieces = [([5, 6, 7, 8, 9], [IGNORE_INDEX, IGNORE_INDEX, 7, 8, 9]), ([10, 11, 12], [IGNORE_INDEX, 11, 12])]
    row = PackedPieces(pieces, 16, pad_id=0).row(0, reset_positions=True, document_mask=True)
    batch = {k: v.unsqueeze(0) for k, v in row.items()}
    for impl in ("sdpa", "eager"):
        model = build_tiny_model("llama", seed=2)
        model.set_attn_implementation(impl)
        model.train()
        batch_impl = dict(batch, attention_mask=prepare_attention_mask(batch["attention_mask"], impl))
        out = model(**batch_impl, use_cache=False)
        out.loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        total, count = 0.0, 0
        with torch.no_grad():
            for ids, labels in pieces:
                logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
                target = torch.tensor(labels[1:])
                total += F.cross_entropy(logits[:-1], target, ignore_index=IGNORE_INDEX, reduction="sum").item()
                count += int((target != IGNORE_INDEX).sum())
        assert out.loss.item() == pytest.approx(total / count, abs=1e-5)
