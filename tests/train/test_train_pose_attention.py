"""PoSE through the trainer: the loss it trains on is the loss of ordinary causal attention over the whole
window at PoSE's position ids, so later chunks attend to earlier ones (PoSE, Zhu et al. 2024, §3.2) — not the loss of
chunks read as separate packed sequences, which transformers infers from position jumps when no mask is
passed."""

from __future__ import annotations

import pytest
import torch

from ropekit.data import pose
from ropekit.models.tiny import build_tiny_model
from ropekit.train import train

LC, LT = 64, 256


class PoseItems(torch.utils.data.Dataset):
    def __init__(self, rows: torch.Tensor, positions: list[torch.Tensor]):
        self.rows, self.positions = rows, positions

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids = self.rows[i]
        return {"input_ids": ids, "labels": ids.clone(), "position_ids": self.positions[i],
                "attention_mask": pose.attention_mask_for(LC)}


def _balanced_samples(n: int) -> list[pose.PoseSample]:
    """PoSE draws whose second chunk is long enough and really skipped, so a lost cross-chunk view shows."""
    out, k = [], 0
    while len(out) < n:
        s = pose.pose_sample(LC, LT, generator=pose.item_generator(0, 0, k))
        if 16 <= s.chunk_lengths[0] <= LC - 16 and s.skips[1] > 0:
            out.append(s)
        k += 1
    return out


def _loss(model, items, mask_of) -> float:
    """Mean next-token NLL over the batch, one example at a time, with the mask ``mask_of(example)``."""
    total, count = 0.0, 0
    with torch.no_grad():
        for it in items:
            logits = model(input_ids=it["input_ids"][None], position_ids=it["position_ids"][None],
                           attention_mask=mask_of(it), use_cache=False).logits[0].double()
            logp = torch.log_softmax(logits[:-1], dim=-1)
            total -= float(logp.gather(1, it["labels"][1:, None]).sum())
            count += LC - 1
    return total / count


def test_pose_chunks_see_earlier_chunks_in_the_training_loss(make_config, text_dataset):
    samples = _balanced_samples(2)
    data = PoseItems(text_dataset(LC).tokens[:2].clone(), [s.position_ids for s in samples])
    items = [data[0], data[1]]
    initial = build_tiny_model("llama")
    causal = torch.ones(LC, LC, dtype=torch.bool).tril()[None, None]
    whole_window = _loss(initial, items, lambda it: causal)  # every token sees every earlier token
    as_packed = _loss(initial, items, lambda it: None)  # transformers' packed-sequence reading of the jumps
    assert abs(whole_window - as_packed) > 1e-3  # the two readings are distinguishable on this batch

    result = train(make_config("pose-mask", steps=1, train={"micro_batch_size": 2}), dataset=data, progress=False)
    assert result.losses[0][1] == pytest.approx(whole_window, rel=1e-5)
