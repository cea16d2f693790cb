"""Training CLEX with the trainer: a scale drawn per step (seeded, so --resume reproduces the run), the ODE
weights learn and are exported, the loss at 4× the window falls; and (slow) on the pre-trained tiny Llama,
training the ODE alone lowers the loss at 4× the window below the untrained (NTK-like) CLEX."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import ropekit
from ropekit.data.local_text import stdlib_documents
from ropekit.methods import get_method
from ropekit.methods.clex_ode import CLEXFrequencies
from ropekit.models.tiny import TINY_WINDOW, build_tiny_model
from ropekit.train import train
from ropekit.train.data import packed_dataset

C = TINY_WINDOW
CLEX_PARAMS = {"max_factor": 4, "time_dt": 0.05}


def _ode(model) -> CLEXFrequencies:
    (module,) = [m for m in model.modules() if isinstance(m, CLEXFrequencies)]
    return module


@pytest.fixture(scope="module")
def heldout_rows() -> torch.Tensor:
    return packed_dataset(stdlib_documents(40_000, "heldout"), 4 * C).tokens[:8].clone()


def loss_at(model, rows: torch.Tensor, length: int) -> float:
    """Mean next-token cross-entropy of ``model`` (eval mode) on the first ``length`` tokens of ``rows``."""
    model.eval()
    ids = rows[:, :length]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)))


def _record_scales(into: list):
    def callback(info):
        into.append(_ode(info.model).training_scale)

    return callback


def test_clex_training_draws_a_scale_per_step_and_learns_the_ode(make_config, text_dataset, heldout_rows):
    cfg = make_config("clex", steps=30, method={"name": "clex", "params": CLEX_PARAMS},
                      train={"micro_batch_size": 4})
    initial = ropekit.extend(build_tiny_model("llama"), "clex", **CLEX_PARAMS)
    before = loss_at(initial, heldout_rows, 4 * C)
    scales: list[int] = []
    result = train(cfg, dataset=text_dataset(C), model=build_tiny_model("llama"), progress=False,
                   callbacks=[_record_scales(scales)])
    assert len(scales) == 30 and set(scales) <= {1, 2, 3, 4} and len(set(scales)) >= 3
    final = ropekit.load(result.final_dir)
    ode = _ode(final)
    assert float(ode.down_proj.detach().abs().max()) > 1e-3  # zero at initialisation
    theta = final.model.rotary_emb.inv_freq
    learned, untrained = ode.inv_freq_for_length(4 * C, theta), _ode(initial).inv_freq_for_length(4 * C, theta)
    assert float((learned.log() - untrained.log()).abs().max()) > 1e-3
    assert loss_at(final, heldout_rows, 4 * C) < before - 1.0


def test_the_ode_learns_under_lora_too(make_config, text_dataset):
    """CLEX learns its ODE with the model; LoRA froze every base weight but the adapters and extras, the ODE
    included, so a LoRA run trained CLEX's scale sampling only and exported the initial ODE (down_proj = 0)."""
    cfg = make_config("clex-lora", steps=4, method={"name": "clex", "params": CLEX_PARAMS},
                      train={"micro_batch_size": 2, "lr": 1e-2, "lora": {"trainable": ["norm"]}})
    result = train(cfg, dataset=text_dataset(C), model=build_tiny_model("llama"), progress=False)
    ode = _ode(ropekit.load(result.final_dir))
    assert float(ode.down_proj.detach().abs().max()) > 1e-4  # zero at initialisation


class _Stop(Exception):
    pass


def test_clex_resume_reproduces_the_scales_and_losses(make_config, text_dataset):
    """The scale comes from a generator seeded by (seed, step), so a resumed run draws what the whole one did."""
    def cfg(name):
        return make_config(name, steps=6, method={"name": "clex", "params": CLEX_PARAMS},
                           output={"save_every": 3, "keep_last": None})

    def stop_after(step):
        def callback(info):
            if info.step == step:
                raise _Stop

        return callback

    data = text_dataset(C, n=48)
    whole_scales, part_scales = [], []
    whole = train(cfg("whole"), dataset=data, model=build_tiny_model("llama"), progress=False,
                  callbacks=[_record_scales(whole_scales)])
    with pytest.raises(_Stop):
        train(cfg("part"), dataset=data, model=build_tiny_model("llama"), progress=False, callbacks=[stop_after(4)])
    part = train(cfg("part"), dataset=data, model=build_tiny_model("llama"), progress=False, resume=True,
                 callbacks=[_record_scales(part_scales)])
    assert part.resumed_from == 3
    assert part_scales == whole_scales[3:] and len(set(whole_scales)) > 1
    assert [loss for _, loss in part.losses] == pytest.approx([loss for _, loss in whole.losses[3:]], rel=1e-6)


@pytest.mark.slow
def test_training_the_ode_alone_lowers_the_loss_beyond_the_window(heldout_rows):
    """The pre-trained tiny Llama, every weight frozen except CLEX's ODE, 60 steps at 2× the window with the
    scale drawn per step: at 4× the window the loss falls below the untrained ODE's (NTK with α = 2t − 1)."""
    from ropekit.train.pretrain import pretrain_tiny

    base = pretrain_tiny(progress=False)
    rows = packed_dataset(stdlib_documents(400_000, "train"), 2 * C).tokens
    model = ropekit.extend(copy.deepcopy(base), "clex", act="silu", **CLEX_PARAMS)
    untrained = loss_at(model, heldout_rows, 4 * C)
    for p in model.parameters():
        p.requires_grad_(False)
    ode = _ode(model)
    for p in ode.parameters():
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(ode.parameters(), lr=1e-4, weight_decay=0.0)
    hook = get_method("clex").training_step_hook
    model.train()
    for step in range(60):
        hook(model, step + 1, torch.Generator().manual_seed(step))
        batch = rows[(8 * step) % (len(rows) - 8):][:8]
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    trained = loss_at(model, heldout_rows, 4 * C)
    print(f"CLEX ODE-only training: loss at 4x the window {untrained:.3f} -> {trained:.3f}")
    assert trained < untrained - 0.1, (untrained, trained)
    assert trained < loss_at(base, heldout_rows, 4 * C) - 0.3
