"""Training with Landmark attention: the trainer inserts landmark tokens into its batches, the loss it reports
is the model's own loss on the plain text, it falls, and the exported model comes back with its token."""

from __future__ import annotations

import copy

import pytest
import torch

import ropekit
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model
from ropekit.train import train


def plain_loss(model, rows: torch.Tensor) -> float:
    """Mean next-token cross-entropy of the plain rows, through the model's own landmark insertion."""
    with torch.no_grad():
        logits = model(input_ids=rows, attention_mask=torch.ones_like(rows)).logits[:, :-1].double()
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1)))


def test_training_with_landmarks_lowers_the_loss(make_config, text_dataset, rows_dataset, tmp_path):
    rows = text_dataset(64).tokens[:4].clone()
    torch.manual_seed(0)
    initial = build_tiny_model("llama")
    reference = ropekit.extend(copy.deepcopy(initial), "landmark", mem_freq=7).train()  # grouped softmax, as trained
    first = plain_loss(reference, rows)

    cfg = make_config("landmark", steps=30, method={"name": "landmark", "params": {"mem_freq": 7}},
                      train={"lr": 1e-2, "micro_batch_size": 2, "grad_accum": 2})
    result = train(cfg, dataset=rows_dataset(rows), model=copy.deepcopy(initial), tokenizer=byte_tokenizer(), progress=False)
    losses = [loss for _, loss in result.losses]
    # step 1: the trainer's landmarked batch gives the model's own loss on plain ids (all four rows)
    assert losses[0] == pytest.approx(first, rel=1e-5)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5

    final = ropekit.load(result.final_dir).train()
    assert final.config.ropekit["params"]["landmark_token_id"] == 256 and final.config.vocab_size == 257
    assert plain_loss(final, rows) < first - 0.5
    trained_row = final.get_input_embeddings().weight[256]
    assert not torch.allclose(trained_row, reference.get_input_embeddings().weight[256])  # the landmark learned
    assert byte_tokenizer().convert_tokens_to_ids("<landmark>") != 256  # fresh tokenizer: no landmark …
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(result.final_dir)  # … the exported one names it
    assert saved.convert_tokens_to_ids("<landmark>") == 256
