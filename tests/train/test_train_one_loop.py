"""The one training loop: pre-training from scratch runs through it and equals a naive loop written here.

The reference loops below are independent of ropekit's training code: the next-token loss from
``log_softmax`` by hand, the gradient norm and its clipping by hand, AdamW as Loshchilov & Hutter's
Algorithm 2 (decoupled weight decay; Kingma & Ba's bias-corrected moments), and the warm-up + cosine schedule
from its definition.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from ropekit.models.tiny import build_tiny_model
from ropekit.train import builtin_base, loop, pretrain, trainer

STEPS, BATCH, WINDOW, PEAK = 6, 4, 32, 3e-3
BETAS, EPS, DECAY, CLIP = (0.9, 0.95), 1e-8, 0.01, 1.0


def tiny():
    return build_tiny_model("llama", seed=3, vocab_size=64, hidden_size=32, num_layers=2, num_heads=2,
                            num_kv_heads=1, window=WINDOW).train()


def batches(steps: int) -> list[torch.Tensor]:
    """Two random batches in turn (seen again, so the loss falls within a few steps)."""
    gen = torch.Generator().manual_seed(11)
    pair = [torch.randint(0, 64, (BATCH, WINDOW), generator=gen) for _ in range(2)]
    return [pair[s % 2] for s in range(steps)]


def schedule(step: int) -> float:
    """Linear warm-up over the first 5 % of the steps (at least one), then cosine decay to 10 % of the peak."""
    warmup = max(1, STEPS // 20)
    if step < warmup:
        return PEAK * (step + 1) / warmup
    progress = (step - warmup) / (STEPS - warmup)
    return PEAK * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def naive_pretraining(model, data: list[torch.Tensor]) -> list[float]:
    """Mean next-token cross-entropy, global-norm clipping at 1 and AdamW, each written out."""
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    losses = []
    for t, ids in enumerate(data, start=1):
        logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)
        loss = -logp.gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        losses.append(float(loss.detach()))
        lr = schedule(t - 1)
        with torch.no_grad():
            norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
            scale = min(1.0, CLIP / (norm + 1e-6))
            for i, p in enumerate(params):
                g = p.grad * scale
                p.mul_(1 - lr * DECAY)
                m[i] = BETAS[0] * m[i] + (1 - BETAS[0]) * g
                v[i] = BETAS[1] * v[i] + (1 - BETAS[1]) * g * g
                m_hat = m[i] / (1 - BETAS[0] ** t)
                v_hat = v[i] / (1 - BETAS[1] ** t)
                p.sub_(lr * m_hat / (v_hat.sqrt() + EPS))
                p.grad = None
    return losses


def test_pretraining_through_the_loop_equals_a_naive_loop():
    data = batches(STEPS)
    model = tiny()
    reference = copy.deepcopy(model)
    seen_lr = []
    losses = pretrain.pretrain(model, lambda s: {"input_ids": data[s], "attention_mask": None},
                               lambda s: seen_lr.append(pretrain.warmup_cosine_lr(s, STEPS, PEAK)) or seen_lr[-1],
                               STEPS, lr=PEAK, label="test", progress=False)
    assert seen_lr == pytest.approx([schedule(s) for s in range(STEPS)], rel=1e-12)
    want = naive_pretraining(reference, data)
    assert losses == pytest.approx(want, rel=1e-6)
    assert losses[-1] < losses[0]  # the test trains: an update that did nothing would fail the comparison too
    for (name, got), (_, ref) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6, msg=name)


def test_pretraining_steps_are_bitwise_those_of_a_plain_torch_loop():
    """The built-in models' weights depend on it: the loop's pre-training parts (one process, transformers' mean
    loss, clipping at 1, AdamW β 0.9/0.95 with weight decay 0.01) give the same bits as a plain torch loop, as the
    loop that trained the shipped base model did."""
    data = batches(STEPS)
    model = tiny()
    reference = copy.deepcopy(model)
    mask = torch.ones_like(data[0])
    losses = pretrain.pretrain(model, lambda s: {"input_ids": data[s], "attention_mask": mask}, schedule, STEPS,
                               lr=PEAK, label="test", progress=False)
    opt = torch.optim.AdamW(reference.parameters(), lr=PEAK, betas=BETAS, weight_decay=DECAY)
    want = []
    for s, ids in enumerate(data):
        for group in opt.param_groups:
            group["lr"] = schedule(s)
        loss = reference(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        want.append(loss.item())
    assert losses == want
    for (name, got), (_, ref) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.equal(got, ref), name


def test_fine_tuning_and_pretraining_share_the_one_loop(monkeypatch, make_config, text_dataset):
    """The trainer and both pre-training paths (the tiny model, the built-in base model) call the same loop."""
    assert trainer.train_loop is loop.train_loop and pretrain.train_loop is loop.train_loop
    assert builtin_base.pretrain is pretrain.pretrain
    calls = []

    def spy(parts, first, last):
        calls.append((type(parts.strategy).__name__, type(parts.objective).__name__, first, last))
        return loop.train_loop(parts, first, last)

    monkeypatch.setattr(trainer, "train_loop", spy)
    monkeypatch.setattr(pretrain, "train_loop", spy)
    trainer.train(make_config("one", steps=2), dataset=text_dataset(64, 8), progress=False)
    pretrain.pretrain_tiny(steps=2, batch_size=2, train_bytes=20_000, threads=1, use_cache=False, progress=False)
    assert calls == [("AccelerateStrategy", "TokenMeanLoss", 0, 2), ("LocalStrategy", "BatchMeanLoss", 0, 2)]
