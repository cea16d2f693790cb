"""Context parallelism's own parts, against naive references: what each process receives of a sequence
(positions, targets, mask), which methods and models it refuses, and how processes group.

The end-to-end check — two processes splitting every sequence train exactly like one process that does not —
is the slow ``test_context_parallel_on_two_cpu_processes_equals_the_unsplit_run`` in test_train_ddp.py.
"""

from __future__ import annotations

import pytest
import torch

from ropekit.errors import RopekitError
from ropekit.models.tiny import build_tiny_model
from ropekit.train import context_parallel as cp
from ropekit.train.config import MethodConfig, load_config


def pose_batch(batch: int = 2, length: int = 12) -> dict[str, torch.Tensor]:
    """Two PoSE-like sequences: positions jump once (a skip), and the first tokens carry no loss."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (batch, length), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100
    positions = torch.stack([torch.cat([torch.arange(length // 2), torch.arange(length // 2) + 40 + 7 * b])
                             for b in range(batch)])
    return {"input_ids": ids, "labels": labels, "position_ids": positions,
            "attention_mask": torch.ones(batch, length, dtype=torch.long)}


@pytest.mark.parametrize("size", [2, 3, 4])
def test_the_shards_put_together_are_the_sequence_with_its_next_token_targets(size):
    batch = pose_batch()
    shards = [cp.shard(batch, i, size) for i in range(size)]
    torch.testing.assert_close(torch.cat([s["input_ids"] for s in shards], 1), batch["input_ids"], rtol=0, atol=0)
    # the positions stay global: shard i starts where shard i-1 ended, PoSE's skip included
    torch.testing.assert_close(torch.cat([s["position_ids"] for s in shards], 1), batch["position_ids"], rtol=0, atol=0)
    targets = torch.cat([s["targets"] for s in shards], 1)
    b, n = batch["input_ids"].shape
    for row in range(b):  # naive: the target of token t is the label of token t+1, none for the last token
        for t in range(n):
            expected = int(batch["labels"][row, t + 1]) if t + 1 < n else -100
            assert int(targets[row, t]) == expected
    # each shard's last target is the next shard's first label — what a shift inside each shard would lose
    assert int(shards[0]["targets"][0, -1]) == int(batch["labels"][0, n // size])
    assert all(bool(s["attention_mask"].all()) and s["input_ids"].shape == (b, n // size) for s in shards)


def test_masks_ulysses_cannot_apply_and_uneven_lengths_are_refused_in_one_line():
    padded = pose_batch()
    padded["attention_mask"][1, -2:] = 0
    documents = pose_batch()
    documents["attention_mask"] = torch.tril(torch.ones(12, 12, dtype=torch.bool)).expand(2, 1, 12, 12)
    for batch, words in ((padded, "padding"), (documents, "document mask")):
        with pytest.raises(RopekitError, match=words) as err:
            cp.shard(batch, 0, 2)
        assert "\n" not in str(err.value)
    with pytest.raises(RopekitError, match="does not divide the sequence length 12"):
        cp.shard(pose_batch(), 0, 5)


@pytest.mark.parametrize("name, params, refused", [
    ("pi", {"factor": 2}, None),
    ("yarn", {"factor": 4}, None),
    ("ntk_by_parts", {"factor": 4}, None),
    ("abf", {"rope_theta": 5e5}, None),
    ("dynamic_ntk", {"factor": 2}, None),  # length-dependent: the rotary modules see the whole sequence
    ("longrope", {"factor": 4, "long_factor": [1.5] * 8, "short_factor": [1.0] * 8}, None),
    ("self_extend", {"factor": 4}, "changes attention itself"),
    ("longlora", {"factor": 2}, "changes attention itself"),
])
def test_methods_that_replace_attention_are_refused(name, params, refused):
    model = build_tiny_model("llama")
    method = MethodConfig(name=name, params=params)
    if refused is None:
        cp.check_method(model, method, 2)
        return
    with pytest.raises(RopekitError, match=refused) as err:
        cp.check_method(model, method, 2)
    assert name in str(err.value) and "\n" not in str(err.value)


def test_models_are_checked_for_heads_and_kernel():
    model = build_tiny_model("llama")
    heads = model.config.num_attention_heads
    cp.check_model(model, 2)
    with pytest.raises(RopekitError, match=f"does not divide the model's {heads} attention heads"):
        cp.check_model(model, heads + 1)
    eager = build_tiny_model("llama", attn_implementation="eager")
    with pytest.raises(RopekitError, match="sdpa"):
        cp.check_model(eager, 2)


def test_processes_group_into_sequences_and_data_ranks():
    # 4 processes, 2-way split: processes 0,1 share samples (data rank 0), 2,3 share the next (data rank 1)
    assert [cp.data_layout(4, r, 2) for r in range(4)] == [(2, 0, 0), (2, 0, 1), (2, 1, 0), (2, 1, 1)]
    assert cp.data_layout(3, 2, 1) == (3, 2, 0)
    with pytest.raises(RopekitError, match="does not divide the 3 processes"):
        cp.data_layout(3, 0, 2)


def test_the_config_takes_context_parallel(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: tiny\ndata: {seq_len: 64}\ntrain: {max_steps: 1, context_parallel: 2}\noutput: {dir: x}\n")
    assert load_config(path).train.context_parallel == 2
    path.write_text("model: tiny\ndata: {seq_len: 64}\ntrain: {max_steps: 1, context_parallel: 0}\noutput: {dir: x}\n")
    with pytest.raises(RopekitError, match="context_parallel"):
        load_config(path)
