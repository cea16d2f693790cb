"""Landmark attention as a method: landmark insertion/removal, the token added to the model, plain ids vs
explicit landmarks, cached vs uncached generation, save/load, and a passkey evaluation on the tiny model."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from ropekit.core.hf_compat import cache_argument, output_cache

import ropekit
from ropekit.methods.landmark_stream import add_landmark_token
from ropekit.errors import RopekitError
from ropekit.methods.landmark import (
    default_local_blocks,
    insert_landmarks,
    insert_landmarks_in_batch,
    landmark_layout,
    remove_landmarks,
)
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

LM = 999  # a landmark id for the pure sequence tests


def landmarked(family="llama", seed=0, **params):
    torch.manual_seed(seed)
    model = build_tiny_model(family)
    return ropekit.extend(model, "landmark", **params)


def random_ids(n, batch=1, seed=1):
    return torch.randint(0, 256, (batch, n), generator=torch.Generator().manual_seed(seed))


# ---- sequences --------------------------------------------------------------------------------------------
def test_insert_after_every_block_and_remove():
    ids = list(range(10, 20))
    with_landmarks = insert_landmarks(ids, 3, LM)
    assert with_landmarks == [10, 11, 12, LM, 13, 14, 15, LM, 16, 17, 18, LM, 19]
    assert remove_landmarks(with_landmarks, LM) == ids
    assert insert_landmarks(list(range(6)), 3, LM) == [0, 1, 2, LM, 3, 4, 5, LM]  # one after the last full block
    rows = torch.arange(24).view(2, 12)
    both = insert_landmarks(rows, 4, LM)
    assert both.shape == (2, 15) and torch.equal(both[1], torch.tensor(insert_landmarks(list(range(12, 24)), 4, LM)))
    assert torch.equal(remove_landmarks(both, LM), rows)


def test_a_continuation_keeps_the_blocks_of_the_whole_stream():
    ids = list(range(100, 130))
    for cut in (1, 6, 7, 13):
        parts = insert_landmarks(ids[:cut], 7, LM) + insert_landmarks(ids[cut:], 7, LM, offset=cut)
        assert parts == insert_landmarks(ids, 7, LM)


def test_layout_points_each_token_at_the_output_that_predicts_its_successor():
    source, is_landmark, output_index = landmark_layout(8, 3)
    assert source.tolist() == [0, 1, 2, 2, 3, 4, 5, 5, 6, 7]
    assert is_landmark.nonzero().flatten().tolist() == [3, 7]
    assert output_index.tolist() == [0, 1, 3, 4, 5, 7, 8, 9]  # tokens 2 and 5 close a block: read at the landmark
    _, flags, out = landmark_layout(4, 3, offset=2)  # stream positions 2..5: tokens 0 and 3 close blocks
    assert flags.tolist() == [False, True, False, False, False, True] and out.tolist() == [1, 2, 3, 5]


def test_training_batch_labels_positions_and_masks():
    n, f = 12, 4
    ids = torch.arange(1, 2 * n + 1).view(2, n)
    positions = torch.stack([torch.arange(n), torch.tensor([0, 1, 2, 3, 4, 20, 21, 22, 23, 24, 25, 26])])  # row 1: PoSE jump
    batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": positions,
             "attention_mask": torch.ones(2, n, dtype=torch.long)}
    out = insert_landmarks_in_batch(batch, f, LM)
    lm = out["input_ids"] == LM
    assert lm.sum(-1).tolist() == [3, 3] and torch.equal(remove_landmarks(out["input_ids"], LM), ids)
    assert (out["labels"][lm] == -100).all() and torch.equal(out["labels"][~lm].view(2, n), ids)
    assert out["position_ids"][0].tolist() == list(range(15))  # consecutive stays consecutive
    assert out["position_ids"][1].tolist() == [0, 1, 2, 3, 4, 5, 21, 22, 23, 24, 25, 26, 27, 28, 29]  # the jump keeps its size
    assert out["attention_mask"].shape == (2, 15)


def test_training_batch_restarts_positions_and_keeps_document_masks():
    """Packed documents with position reset: each document's positions start at 0 again; the square
    document mask is the one of the landmarked sequence (a landmark belongs to the token before it)."""
    docs = torch.tensor([0] * 7 + [1] * 6)
    positions = torch.cat([torch.arange(7), torch.arange(6)])[None]
    square = (docs[:, None] == docs[None, :]) & torch.ones(13, 13, dtype=torch.bool).tril()
    batch = {"input_ids": torch.arange(13)[None], "labels": torch.arange(13)[None], "position_ids": positions,
             "attention_mask": square[None, None]}
    out = insert_landmarks_in_batch(batch, 3, LM)
    source, _, _ = landmark_layout(13, 3)
    aug_docs = docs[source]
    expected = (aug_docs[:, None] == aug_docs[None, :]) & torch.ones(17, 17, dtype=torch.bool).tril()
    assert torch.equal(out["attention_mask"][0, 0], expected)
    # doc 0: tokens 0..6 with landmarks after 2 and 5; doc 1 restarts at 0 (its landmarks after 8 and 11)
    assert out["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6, 7]


# ---- installing --------------------------------------------------------------------------------------------
def test_extend_adds_one_token_initialised_to_the_mean():
    model = landmarked(mem_freq=7)
    record = model.config.ropekit
    assert record["method"] == "landmark" and record["params"]["landmark_token_id"] == 256
    assert model.config.vocab_size == 257 and model.config.rope_parameters["landmark_token_id"] == 256
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert emb.shape[0] == head.shape[0] == 257
    torch.testing.assert_close(emb[256], emb[:256].mean(0))
    torch.testing.assert_close(head[256], head[:256].mean(0))
    assert record["params"]["local_blocks"] == default_local_blocks(64, 7, 5) == 2  # 64 // 8 − 1 − 5


def test_a_given_token_id_changes_no_weight_and_bad_ids_are_refused():
    torch.manual_seed(0)
    model = build_tiny_model("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ropekit.extend(model, "landmark", mem_freq=7, landmark_token_id=255)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(RopekitError, match="outside the vocabulary"):
        ropekit.extend(build_tiny_model("llama"), "landmark", landmark_token_id=256)
    with pytest.raises(RopekitError, match="mem_freq"):
        ropekit.extend(build_tiny_model("llama"), "landmark", mem_freq=0)


def test_the_byte_tokenizer_gets_the_landmark_at_the_new_id():
    tok = byte_tokenizer()
    assert add_landmark_token(tok, 256) and tok.convert_tokens_to_ids("<landmark>") == 256
    assert add_landmark_token(tok, 256)  # already there
    with pytest.raises(RopekitError, match="cannot name"):
        add_landmark_token(byte_tokenizer(), 300)
    assert not add_landmark_token(byte_tokenizer(), 300, strict=False)


def test_the_new_row_is_trained_and_never_predicted():
    model = landmarked(mem_freq=5)
    model.train()
    ids = random_ids(30)
    out = model(input_ids=ids, labels=ids)
    assert torch.isinf(out.logits[..., 256]).all()
    out.loss.backward()
    assert model.get_input_embeddings().weight.grad[256].abs().sum() > 0


def test_inputs_shorter_than_a_block_give_the_plain_model():
    torch.manual_seed(0)
    base = build_tiny_model("llama").eval()
    model = landmarked(mem_freq=16).eval()
    ids = random_ids(15, batch=2)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits[..., :256], base(input_ids=ids).logits)


# ---- plain ids vs explicit landmarks -------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
@pytest.mark.parametrize("training", [True, False])
def test_plain_ids_equal_the_same_ids_with_landmarks(family, training):
    """The model's own insertion on plain ids is the explicit sequence; each plain token's logits are read
    where they predict its successor (at the landmark after a block's last token)."""
    model = landmarked(family, mem_freq=5, top_k=2, local_blocks=1).train(training)
    ids = random_ids(37, batch=2)
    explicit = insert_landmarks(ids, 5, 256)
    _, _, output_index = landmark_layout(37, 5)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        full = model(input_ids=explicit, attention_mask=torch.ones_like(explicit)).logits
    torch.testing.assert_close(plain, full[:, output_index], atol=1e-5, rtol=1e-5)


def test_retrieval_at_inference_differs_from_training_when_blocks_are_dropped():
    model = landmarked(mem_freq=5, top_k=1, local_blocks=0)
    ids = random_ids(60)
    every_block = landmarked(mem_freq=5, top_k=0)  # same weights (seed), every block at inference too
    with torch.no_grad():
        train_logits = model.train()(input_ids=ids).logits[..., :256]
        eval_logits = model.eval()(input_ids=ids).logits[..., :256]
        all_blocks = every_block.eval()(input_ids=ids).logits[..., :256]
    assert (train_logits - eval_logits).abs().max() > 1e-3
    torch.testing.assert_close(train_logits[:, :5], eval_logits[:, :5])  # the first block has nothing to drop
    torch.testing.assert_close(all_blocks, train_logits)


# ---- the KV cache --------------------------------------------------------------------------------------------
def test_cached_generation_matches_the_uncached_path():
    """Greedy generation with the KV cache (retrieval of 2 of up to 16 blocks) gives the tokens and logits of
    full forwards without a cache, token by token."""
    model = landmarked(mem_freq=5, top_k=2, local_blocks=1).eval()
    prompt = random_ids(70, seed=3)
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                             return_dict_in_generate=True, output_logits=True, pad_token_id=0)
        ids, uncached = prompt, []
        for _ in range(20):
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[:, -1]
            uncached.append(logits)
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out.sequences, ids)
    finite = torch.isfinite(uncached[0])
    for cached_step, plain_step in zip(out.logits, uncached):
        torch.testing.assert_close(cached_step[finite], plain_step[finite], atol=1e-4, rtol=1e-4)


@pytest.mark.filterwarnings("ignore:landmark. a row is left-padded")  # said in the generate calls (checked there)
def test_left_padded_batch_generation_equals_each_row_alone():
    """A batch with left padding: each row generates what it generates alone (with its padding), and the
    padded row's cached generation equals full forwards. (Blocks count from the row's first position, padding
    included, so a padded row is not the unpadded one.)"""
    model = landmarked(mem_freq=5, top_k=2, local_blocks=1).eval()
    ids = random_ids(40, batch=2, seed=7)
    mask = torch.ones_like(ids)
    mask[1, :9], ids[1, :9] = 0, 0
    settings = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        with pytest.warns(UserWarning, match="not a multiple of mem_freq=5"):  # 9 pads: said
            both = model.generate(ids, attention_mask=mask, **settings)
            alone = [model.generate(ids[r:r + 1], attention_mask=mask[r:r + 1], **settings)[0] for r in range(2)]
        x, m = ids[1:], mask[1:]
        for _ in range(alone[1].numel() - 40):
            positions = (m.cumsum(-1) - 1).masked_fill(m == 0, 0)
            step = model(input_ids=x, attention_mask=m, position_ids=positions, use_cache=False).logits[:, -1]
            x, m = torch.cat([x, step.argmax(-1, keepdim=True)], 1), torch.cat([m, torch.ones_like(m[:, :1])], 1)
    for r in range(2):  # a row that stops early (EOS) is padded in the batch
        assert torch.equal(both[r, :alone[r].numel()], alone[r])
    assert torch.equal(x[0], alone[1])


def test_left_padding_by_whole_blocks_is_the_row_alone_and_other_padding_is_said():
    """Left padding that is a multiple of mem_freq leaves every landmark after the same tokens as the row alone, so
    the padded row's logits are the unpadded row's; any other padding shifts the blocks, and one warning says so
    with the alternatives (the logits then differ: the shift is real)."""
    import warnings

    model = landmarked(mem_freq=5, top_k=2, local_blocks=1).eval()
    row = random_ids(30, seed=11)
    with torch.no_grad():
        alone = model(input_ids=row).logits[0]
        for pads in (10, 9):
            ids = torch.cat([torch.zeros(1, pads, dtype=torch.long), row], 1)
            mask = torch.cat([torch.zeros(1, pads, dtype=torch.long), torch.ones_like(row)], 1)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                padded = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[0, pads:]
            said = [w for w in caught if "mem_freq=5" in str(w.message)]
            finite = torch.isfinite(alone)
            if pads == 10:
                assert not said
                torch.testing.assert_close(padded[finite], alone[finite], atol=1e-5, rtol=0)
            else:
                assert len(said) == 1 and "pad on the right" in str(said[0].message)
                assert (padded[finite] - alone[finite]).abs().max() > 1e-3


def test_chunked_prefill_equals_one_forward():
    model = landmarked(mem_freq=5, top_k=2, local_blocks=1).eval()
    ids = random_ids(53, seed=4)
    with torch.no_grad():
        whole = model(input_ids=ids).logits
        first = model(input_ids=ids[:, :17], use_cache=True)
        second = model(input_ids=ids[:, 17:], **{cache_argument(model): output_cache(first)}, use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), whole, atol=1e-5, rtol=1e-5)


def test_a_cache_filled_without_landmarks_is_refused():
    model = landmarked(mem_freq=5).eval()
    plain = build_tiny_model("llama").eval()
    cache = output_cache(plain(input_ids=random_ids(12), use_cache=True))
    with pytest.raises(RopekitError, match="bookkeeping"):
        model(input_ids=random_ids(3), **{cache_argument(model): cache})


# ---- export and evaluation -----------------------------------------------------------------------------------
def test_save_and_load_round_trip(tmp_path):
    model = landmarked(mem_freq=6, top_k=2, local_blocks=1).eval()
    tok = byte_tokenizer()
    report = ropekit.save_pretrained(model, tmp_path / "lm", tokenizer=tok)
    assert report["method"] == "landmark" and report["transformers"] is False
    assert tok.convert_tokens_to_ids("<landmark>") == 256
    saved = json.loads((tmp_path / "lm" / "config.json").read_text())
    assert saved["vocab_size"] == 257 and saved["ropekit"]["params"]["landmark_token_id"] == 256
    loaded = ropekit.load(tmp_path / "lm")
    assert loaded.config.ropekit["params"] == model.config.ropekit["params"] and loaded.config.vocab_size == 257
    ids = random_ids(50, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=0, rtol=0)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "lm").convert_tokens_to_ids("<landmark>") == 256


def test_passkey_eval_runs_on_the_tiny_model(tmp_path, monkeypatch, capsys):
    from ropekit import cli

    out = tmp_path / "passkey.jsonl"
    argv = ["ropekit", "eval", "passkey", "tiny", "--method", "landmark", "--param", "mem_freq=15", "--param", "top_k=1",
            "--lengths", "256", "--trials", "1", "--out", str(out), "--json"]
    monkeypatch.setattr(sys, "argv", argv)
    capsys.readouterr()
    try:
        cli.main()
    except SystemExit as e:
        assert not e.code
    rows = json.loads(capsys.readouterr().out)
    assert [(r["length"], r["n"]) for r in rows] == [(256, 1)]
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["method"] == "landmark" and record["params"]["mem_freq"] == 15 and 0.0 <= record["score"] <= 1.0
