"""The training loop on the tiny Llama: the loss it reports and lowers, token-weighted gradient accumulation,
the EMA against a hand-computed average, the loss guard, metrics.jsonl and the optimizer's groups."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from ropekit.errors import RopekitError
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model
from ropekit.train import TrainingAborted, train


class Items(torch.utils.data.Dataset):
    """Fixed training items (input_ids rows; ``masked[i]`` tokens at the start of row i get label −100)."""

    def __init__(self, rows: torch.Tensor, masked: list[int] | None = None):
        self.rows = rows
        self.masked = masked or [0] * len(rows)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids = self.rows[i]
        labels = ids.clone()
        labels[: self.masked[i]] = -100
        n = ids.numel()
        return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(n), "attention_mask": torch.ones(n, dtype=torch.long)}


def text_rows(text_dataset, n: int, seq_len: int = 64) -> torch.Tensor:
    return text_dataset(seq_len).tokens[:n].clone()


def naive_loss(model, items: list[dict]) -> float:
    """Mean over all label tokens of −log p(label_t | tokens < t), position by position."""
    total, count = 0.0, 0
    with torch.no_grad():
        for it in items:
            logp = torch.log_softmax(model(input_ids=it["input_ids"][None]).logits[0].double(), dim=-1)
            for t in range(1, it["input_ids"].numel()):
                if it["labels"][t] != -100:
                    total -= float(logp[t - 1, it["labels"][t]])
                    count += 1
    return total / count


def rows_of(out_dir) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def test_short_run_lowers_the_loss_and_reports_it_exactly(make_config, text_dataset):
    """Training on one fixed batch: the first reported loss is the naive cross-entropy of the initial model,
    the loss falls, and the saved final model has a lower loss on that batch than the initial one."""
    data = Items(text_rows(text_dataset, 2), masked=[0, 40])  # unequal label counts: token weighting matters
    cfg = make_config("fixed", steps=12, train={"lr": 1e-2, "micro_batch_size": 2})
    initial = build_tiny_model("llama")
    items = [data[0], data[1]]
    first = naive_loss(initial, items)
    result = train(cfg, dataset=data, progress=False)
    losses = [loss for _, loss in result.losses]
    assert losses[0] == pytest.approx(first, rel=1e-5)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5
    import ropekit

    final = ropekit.load(result.final_dir)
    assert naive_loss(final, items) < first - 0.5
    rows = rows_of(cfg.require_output())
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert all(r["tokens"] == 128 and r["loss_tokens"] == 63 + 24 and r["skipped"] is None for r in rows)
    assert [r["loss"] for r in rows] == pytest.approx(losses, rel=1e-12)
    assert all(set(r) >= {"step", "loss", "lr", "grad_norm", "tokens", "seconds", "stage"} for r in rows)
    assert rows[-1]["total_tokens"] == 12 * 128


def test_accumulation_equals_one_big_batch(make_config, text_dataset):
    """2 micro-batches of 1 and 1 micro-batch of 2 see the same global batches and take the same steps
    (the loss is averaged over label tokens of the whole global batch, not per micro-batch)."""
    data = Items(text_rows(text_dataset, 6), masked=[0, 50, 10, 0, 60, 5])
    # Adam divides each update by √v + eps: with the default eps 1e-8 a rounding-level difference in a gradient
    # element near zero can move that element by a visible fraction of lr; eps 1e-5 keeps updates smooth in g
    opt = {"eps": 1e-5}
    a = train(make_config("a", steps=3, train={"micro_batch_size": 2, "grad_accum": 1, **opt}), dataset=data, progress=False)
    b = train(make_config("b", steps=3, train={"micro_batch_size": 1, "grad_accum": 2, **opt}), dataset=data, progress=False)
    assert [x for _, x in a.losses] == pytest.approx([x for _, x in b.losses], rel=1e-6)
    wa, wb = load_file(a.final_dir / "model.safetensors"), load_file(b.final_dir / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)
    changed = load_file(a.final_dir / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(changed, build_tiny_model("llama").model.layers[0].self_attn.q_proj.weight.detach())


def test_ema_is_the_hand_computed_average(make_config, text_dataset, snapshot):
    """ema_0 = θ_0; after steps t = 2, 4, 6 (every = 2): ema ← d·ema + (1 − d)·θ_t — recomputed from snapshots."""
    decay = 0.8
    data = Items(text_rows(text_dataset, 8))
    model = build_tiny_model("llama")
    theta0 = snapshot(model)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    cfg = make_config("ema", steps=6, train={"lr": 1e-2, "ema": {"decay": decay, "every": 2}})
    result = train(cfg, dataset=data, model=model, tokenizer=byte_tokenizer(), progress=False,
                   callbacks=[lambda info: seen.__setitem__(info.step, snapshot(info.model))])
    expected = {k: v.double() for k, v in theta0.items()}
    for t in (2, 4, 6):
        expected = {k: decay * expected[k] + (1 - decay) * seen[t][k].double() for k in expected}
    ema = load_file(result.ema_dir / "model.safetensors")
    final = load_file(result.final_dir / "model.safetensors")
    for k, want in expected.items():
        torch.testing.assert_close(ema[k].double(), want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(final[k], seen[6][k])  # the plain export is the trained weights
    # and the average is not just the last or the first weights
    key = "model.layers.0.mlp.up_proj.weight"
    assert not torch.allclose(ema[key], final[key]) and not torch.allclose(ema[key], theta0[key])
    import ropekit

    assert ropekit.installed(ropekit.load(result.ema_dir)) is None  # no method in this run


def _logit_hook(model, when: dict[int, float]):
    """Multiply the logits of the n-th forward (1-based) by ``when[n]``."""
    calls = {"n": 0}

    def hook(module, args, output):
        calls["n"] += 1
        if calls["n"] in when:
            output.logits = output.logits * when[calls["n"]]
        return output

    return model.register_forward_hook(hook)


def test_guard_skips_nan_and_spike_steps_without_touching_weights(make_config, text_dataset, snapshot):
    data = Items(text_rows(text_dataset, 12))
    model = build_tiny_model("llama")
    _logit_hook(model, {2: float("nan"), 5: 1000.0})
    seen = {0: snapshot(model)}
    cfg = make_config("guard", steps=6, train={"lr": 3e-3, "guard": {"spike_factor": 3.0, "spike_window": 2, "max_skipped": 5}})
    result = train(cfg, dataset=data, model=model, tokenizer=byte_tokenizer(), progress=False,
                   callbacks=[lambda info: seen.__setitem__(info.step, snapshot(info.model))])
    rows = rows_of(cfg.require_output())
    assert [r["skipped"] for r in rows] == [None, "nonfinite", None, None, "spike", None]
    assert rows[1]["loss"] == "nan"  # JSON has no NaN: written as a string
    assert rows[4]["loss"] > 3 * (rows[2]["loss"] + rows[3]["loss"]) / 2
    assert result.skipped == 2
    for step in (2, 5):  # a skipped step changes nothing
        for k in seen[step]:
            assert torch.equal(seen[step][k], seen[step - 1][k])
    for step in (1, 3, 6):
        assert any(not torch.equal(seen[step][k], seen[step - 1][k]) for k in seen[step])


def test_guard_aborts_after_max_skipped(make_config, text_dataset):
    data = Items(text_rows(text_dataset, 8))
    model = build_tiny_model("llama")
    _logit_hook(model, {2: float("inf")})
    cfg = make_config("abort", steps=4, train={"guard": {"max_skipped": 0}, "ema": {"decay": 0.9}})
    with pytest.raises(TrainingAborted) as info:
        train(cfg, dataset=data, model=model, tokenizer=byte_tokenizer(), progress=False)
    assert isinstance(info.value, RopekitError)
    line = info.value.one_line()
    assert "step 2" in line and "max_skipped=0" in line and "\n" not in line
    assert [r["step"] for r in rows_of(cfg.require_output())] == [1, 2]


def test_weight_decay_spares_norms_and_biases(make_config, text_dataset):
    data = Items(text_rows(text_dataset, 4))
    groups = {}

    def grab(info):
        names = {id(p): n for n, p in info.model.named_parameters()}
        for g in info.trainer.optimizer.param_groups:
            groups[g["weight_decay"]] = sorted(names[id(p)] for p in g["params"])

    model = build_tiny_model("qwen2")  # q/k/v projections with biases
    train(make_config("wd", steps=1, train={"weight_decay": 0.1}), dataset=data, model=model,
          tokenizer=byte_tokenizer(), callbacks=[grab], progress=False)
    decayed, spared = groups[0.1], groups[0.0]
    assert all(model.get_parameter(n).ndim == 2 and not n.endswith(".bias") for n in decayed)
    assert any(n.endswith("q_proj.bias") for n in spared) and any("norm" in n for n in spared)
    assert all(model.get_parameter(n).ndim < 2 for n in spared)
    assert len(decayed) + len(spared) == len(list(model.parameters()))


def test_bf16_autocast_and_gradient_checkpointing_run(make_config, text_dataset):
    data = Items(text_rows(text_dataset, 4))
    cfg = make_config("bf16", steps=2, model={"name": "tiny", "gradient_checkpointing": True}, train={"precision": "bf16"})
    result = train(cfg, dataset=data, progress=False)
    assert all(math.isfinite(loss) for _, loss in result.losses)
    fp32 = train(make_config("fp32", steps=2), dataset=data, progress=False)
    # bf16 compute: close to, but not bit-equal with, the fp32 loss
    assert result.losses[0][1] == pytest.approx(fp32.losses[0][1], rel=2e-2)


@pytest.mark.parametrize("unit, warned", [(None, True), ("AMX-BF16", False)])
def test_bf16_autocast_on_a_cpu_without_native_bf16_is_called_out(monkeypatch, unit, warned):
    """bf16 autocast on an AVX2-only CPU is emulated and far slower than fp32: one warning line says so."""
    import warnings

    from ropekit.runtime import devices
    from ropekit.train import strategy
    from ropekit.train.config import parse_config

    monkeypatch.setattr(devices, "native_cpu_bf16", lambda: unit)
    monkeypatch.setattr(strategy, "has_accelerator_device", lambda: False)
    cfg = parse_config({"model": "tiny", "data": {"seq_len": 32}, "train": {"max_steps": 1, "precision": "bf16"},
                        "output": {"dir": "unused"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = strategy.make_accelerator(cfg.train.precision)
    strategy.reset_accelerate(accelerator)  # accelerate's state is process-wide
    lines = [str(w.message) for w in caught if "no native bfloat16" in str(w.message)]
    assert len(lines) == (1 if warned else 0)
