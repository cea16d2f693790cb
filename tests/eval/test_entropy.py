"""`ropekit eval entropy`: the measured entropy equals a full-softmax reference for the plain model and for
every kind of method (frequencies, YaRN's attention factor, Entropy-ABF's logit scale, HARPE's per-head
bases, Self-Extend's and LM-Infinite's own attention), chunking changes nothing, the log grid, records,
resume, the summary, the figure and the CLI."""

from __future__ import annotations

import copy
import itertools
import json
import math

import pytest
import torch

from attention_probe import attend_probabilities, entropy_of, sharpened  # tests/eval is on sys.path

from ropekit.attention.interface import attention_modules
from ropekit.errors import RopekitError
from ropekit.eval import entropy as task
from ropekit.eval.common import make_context
from ropekit.install import extend
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

N = 128  # tokens: twice the tiny window, so every method is past its pretrained range


def eager_entropy(model, ids) -> torch.Tensor:
    """Reference: run the model with eager attention and ``output_attentions`` (real probabilities, one
    softmax) and take −Σ p ln p of every full row: ``(layers, heads, n)``."""
    ref = copy.deepcopy(model)
    impl = ref.config._attn_implementation
    ref.set_attn_implementation("ropekit_eager" if impl.startswith("ropekit_") else "eager")
    with torch.no_grad():
        out = ref(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True, use_cache=False)
    rows = []
    for probs in out.attentions:  # (1, heads, n, n)
        p = probs[0].double()
        assert torch.allclose(p.sum(-1), torch.ones_like(p.sum(-1)), atol=1e-5)
        rows.append(-(p * torch.log(torch.where(p > 0, p, torch.ones_like(p)))).sum(-1))
    return torch.stack(rows)


# (family, method, params): frequency methods, YaRN's attention factor, Entropy-ABF's logit scale on layer 1
# (the paper's default skips layers 0 and 1 = every layer of the tiny model), HARPE's bases per KV group,
# LongLoRA in eval mode (full attention); Llama has GQA (4 heads, 2 KV heads), GPT-NeoX partial rotary.
EAGER_CASES = [
    ("llama", None, {}),
    ("llama", "pi", {"factor": 2.0}),
    ("llama", "yarn", {"factor": 4.0}),
    ("llama", "dynamic_ntk", {"factor": 2.0}),
    ("llama", "entropy_abf", {"skip_layers": "0", "scale_context": 16}),
    ("llama", "harpe", {"bases": "1e3,1e6"}),
    ("llama", "longlora", {"factor": 2.0}),
    ("gpt_neox", None, {}),
    ("gpt_neox", "yarn", {"factor": 4.0}),
    ("gpt_neox", "entropy_abf", {"skip_layers": "0", "scale_context": 16}),
    ("gpt_neox", "harpe", {"strategy": "uniform", "b_min": 1e3, "b_max": 1e5}),
]


@pytest.mark.parametrize("family,method,params", EAGER_CASES)
def test_entropy_equals_full_softmax_reference(family, method, params, make_ids):
    model = sharpened(family)
    if method:
        extend(model, method, **params)
    ids = make_ids(N, seed=1)
    got = task.attention_entropy(model, ids, positions=list(range(N)), chunk=19)
    ref = eager_entropy(model, ids)
    assert got["entropy"].shape == ref.shape == (model.config.num_hidden_layers, model.config.num_attention_heads, N)
    assert torch.allclose(got["entropy"], ref, atol=2e-4), (got["entropy"] - ref).abs().max()
    # attention is far from uniform, so the comparison above is a sensitive one
    assert float((torch.log(torch.arange(1, N + 1).double()) - ref).max()) > 0.5
    positions = torch.arange(N).double()
    assert torch.equal(got["keys"], torch.arange(1, N + 1).expand_as(got["keys"]))
    want = torch.where(positions > 0, ref / torch.log(positions + 1).clamp_min(1e-12), torch.zeros_like(ref))
    assert torch.allclose(got["normalised"], want, atol=2e-4)
    assert float(got["normalised"][..., 0].abs().max()) == 0.0  # position 0: one key, defined as 0


def test_method_changes_are_inside_the_measured_logits(make_ids):
    """The reference test would pass trivially if a method changed nothing on these inputs: check that
    YaRN's attention factor, Entropy-ABF's scale and HARPE's bases each move the entropy."""
    ids = make_ids(N, seed=2)

    def measure(method, **params):
        model = sharpened("llama")
        extend(model, method, **params)
        return task.attention_entropy(model, ids)["entropy"]

    yarn = measure("yarn", factor=4.0)
    yarn_no_temperature = measure("yarn", factor=4.0, attention_factor=1.0)
    assert float((yarn - yarn_no_temperature).abs().max()) > 1e-2
    # YaRN's factor 0.1·ln 4 + 1 > 1 sharpens attention: lower entropy on average
    assert float(yarn.mean()) < float(yarn_no_temperature.mean())
    scaled = measure("entropy_abf", skip_layers="0", scale_context=16)
    unscaled = measure("abf")  # same base 500,000, no logit scale
    assert torch.allclose(scaled[0], unscaled[0], atol=1e-6)  # layer 0 is skipped
    assert float((scaled[1] - unscaled[1]).abs().max()) > 1e-2
    assert float((measure("harpe", bases="1e3,1e6") - measure("harpe", bases="1e6,1e6")).abs().max()) > 1e-2


@pytest.mark.parametrize("method,params,keys_last", [
    ("self_extend", {"group_size": 4, "window_size": 16}, N),
    ("lm_infinite", {"local_window": 32, "global_tokens": 4}, 32 + 4),
    ("dual_chunk", {"chunk_size": 48, "local_size": 6}, N),  # chunks of 42: every query sees every earlier key
])
def test_replaced_attention_entropy_equals_the_method_own_distribution(method, params, keys_last, make_ids):
    model = sharpened("llama")
    extend(model, method, **params)
    ids = make_ids(N, seed=3)
    got = task.attention_entropy(model, ids, positions=list(range(N)), chunk=23)
    probs = attend_probabilities(model, ids)
    assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[:-1], dtype=probs.dtype), atol=1e-5)
    ref = entropy_of(probs)
    assert torch.allclose(got["entropy"], ref, atol=2e-4), (got["entropy"] - ref).abs().max()
    # keys per layer, head and query: the pairs of the method's own distribution
    assert torch.equal(got["keys"], (probs > 0).sum(-1))
    assert got["keys"][:, :, -1].unique().tolist() == [keys_last]
    # normalised by the keys the query really sees (the Λ mask hides most of them)
    assert math.isclose(float(got["normalised"][0, 0, -1]), float(ref[0, 0, -1]) / math.log(keys_last), rel_tol=1e-4)
    # and not the plain model's entropy: the method's own pattern is what was measured
    plain = task.attention_entropy(sharpened("llama"), ids, positions=list(range(N)))["entropy"]
    assert float((got["entropy"][:, :, 64:] - plain[:, :, 64:]).abs().max()) > 1e-2


def test_s2_attn_in_training_mode_is_measured_with_its_groups(make_ids):
    """LongLoRA in training mode: the entropy of S²-Attn's own distribution (group-local, half the heads
    shifted), which differs from the full attention measured in eval mode."""
    model = sharpened("llama")
    extend(model, "longlora", factor=2.0)
    model.train()
    ids = make_ids(N, seed=6)
    got = task.attention_entropy(model, ids, positions=list(range(N)), chunk=17)
    probs = attend_probabilities(model, ids)
    ref = entropy_of(probs)
    assert torch.allclose(got["entropy"], ref, atol=2e-4), (got["entropy"] - ref).abs().max()
    g = N // 4  # group size ⌈n/4⌉; head 0 is unshifted: query i sees the keys ⌊i/g⌋·g … i
    assert got["keys"][0, 0].tolist() == [i % g + 1 for i in range(N)]
    assert int((probs[0, 0, -1] > 0).sum()) == g
    assert torch.equal(got["keys"], (probs > 0).sum(-1))  # each head its own count (the shifted half differs)
    full = task.attention_entropy(model.eval(), ids, positions=list(range(N)))["entropy"]
    assert float((got["entropy"][:, :, g:] - full[:, :, g:]).abs().max()) > 1e-2


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_chunk_size_and_kernel_do_not_change_the_result(implementation, make_ids):
    model = sharpened("llama")
    extend(model, "yarn", factor=2.0)
    model.set_attn_implementation("ropekit_" + implementation)
    ids = make_ids(100, seed=4)
    grid = task.log_positions(100, 20)
    whole = task.attention_entropy(model, ids, positions=grid)  # default: one block of rows
    for chunk in (1, 3, 7):  # chunk < positions: the memory-lean path
        part = task.attention_entropy(model, ids, positions=grid, chunk=chunk)
        assert torch.allclose(part["entropy"], whole["entropy"], atol=1e-6)
    full = task.attention_entropy(model, ids, positions=list(range(100)))
    assert torch.allclose(full["entropy"][:, :, grid], whole["entropy"], atol=1e-6)
    # the probe is removed afterwards and the model runs its own attention again
    assert model.config._attn_implementation == "ropekit_" + implementation
    assert not any(hasattr(m, "_ropekit_entropy_probe") for m in attention_modules(model))


def test_forward_is_unchanged_while_measuring(make_ids):
    model = sharpened("llama")
    extend(model, "entropy_abf", skip_layers="0", scale_context=16)
    ids = make_ids(80, seed=5)
    with torch.no_grad():
        want = model(input_ids=ids).logits
    seen = {}
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.setdefault("hidden", inp[0].clone()))
    try:
        task.attention_entropy(model, ids, positions=[79])
    finally:
        hook.remove()
    assert torch.allclose(model.lm_head(seen["hidden"])[0, -1], want[0, -1], atol=1e-6)


def test_log_positions():
    assert task.log_positions(10, 64) == list(range(10))
    for n, count in ((128, 64), (1000, 64), (131072, 64), (65, 64), (300, 16)):
        grid = task.log_positions(n, count)
        assert len(grid) == count and grid[0] == 0 and grid[-1] == n - 1
        assert all(b > a for a, b in itertools.pairwise(grid))
    grid = task.log_positions(131072, 64)
    # the tail (where the grid is sparser than one token) is geometric: ratio n^(1/63)
    ratios = [(b + 1) / (a + 1) for a, b in itertools.pairwise(grid[40:])]
    assert all(abs(r - 131072 ** (1 / 63)) < 0.01 for r in ratios)
    for bad in ((0, 64), (10, 1)):
        with pytest.raises(RopekitError):
            task.log_positions(*bad)


def test_row_entropy_matches_naive_formula():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, 9, generator=gen) * 4
    allowed = torch.rand(2, 1, 5, 9, generator=gen) > 0.3
    allowed[..., 0] = True
    h, k = task.row_entropy(logits, allowed)
    for idx in torch.cartesian_prod(torch.arange(2), torch.arange(3), torch.arange(5)).tolist():
        b, head, row = idx
        s = logits[b, head, row][allowed[b, 0, row]].double()
        p = torch.softmax(s, -1)
        assert math.isclose(float(h[b, head, row]), float(-(p * p.log()).sum()), abs_tol=1e-5)
        assert int(k[b, head, row]) == int(allowed[b, 0, row].sum())


def test_unsupported_attention_and_missing_tokenizer_raise_one_line(make_ids):
    model = build_tiny_model("llama")
    extend(model, "self_extend", group_size=4, window_size=16)
    for module in attention_modules(model):
        module.ropekit_attend = lambda *a, **k: None  # some other method's attention
    with pytest.raises(RopekitError, match="not available for"):
        task.attention_entropy(model, make_ids(32))
    assert model.config._attn_implementation == "ropekit_sdpa"  # restored after the error
    ctx = make_context("entropy", build_tiny_model("llama"), None, method=None, params=None, lengths=[32],
                       key_fields=task.KEY_FIELDS)
    with pytest.raises(RopekitError, match="needs a tokenizer"):
        task.run(ctx, lengths=[32], samples=1)


def test_run_records_resume_summary_and_plot(tmp_path):
    out = tmp_path / "entropy.jsonl"
    figure = tmp_path / "entropy.png"
    model, tok = build_tiny_model("llama"), byte_tokenizer()

    def context(resume):
        return make_context("entropy", model, tok, method=None, params=None, lengths=[64, 128],
                            key_fields=task.KEY_FIELDS, out=str(out), resume=resume)

    ctx = context(False)
    task.run(ctx, lengths=[64, 128], samples=2, plot=str(figure))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["length"], r["sample"]) for r in records] == [(64, 0), (64, 1), (128, 0), (128, 1)]
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for r in records:
        assert r["positions"] == task.log_positions(r["length"])
        assert len(r["entropy"]) == 2 and all(len(layer) == 4 for layer in r["entropy"])
        assert all(len(head) == len(r["positions"]) for layer in r["entropy"] for head in layer)
        for layer, nlayer in zip(r["entropy"], r["normalised"]):
            for head, nhead in zip(layer, nlayer):
                for i, (h, hn) in enumerate(zip(head, nhead)):
                    ceiling = math.log(r["positions"][i] + 1)
                    assert 0.0 <= h <= ceiling + 1e-4 and 0.0 <= hn <= 1.0 + 1e-4
        assert math.isclose(r["entropy_last"], sum(h[-1] for l in r["entropy"] for h in l) / 8, rel_tol=1e-4)
        assert r["tokens"] == r["length"] and r["source"] == "python-docs-prose" and r["method"] == "plain"
        # causal attention: every layer and head sees i + 1 keys at position i
        assert r["keys"] == [[[p + 1 for p in r["positions"]]] * 4] * 2
        assert r["layer_uniform_last"] == pytest.approx([math.log(r["length"])] * 2)
        assert r["uniform_last"] == pytest.approx(math.log(r["length"]))
    # the record is the measurement of that sample's text, recomputed here from the tokens
    ids, _ = task.document_ids(tok, 128, 1, 0)
    again = task.attention_entropy(model, torch.tensor([ids]))
    stored = torch.tensor(records[3]["entropy"], dtype=torch.float64)
    assert torch.allclose(stored, again["entropy"], rtol=1e-4, atol=1e-6)
    # one sample's inputs are prefixes of one text, and attention is causal: the 64-token record is the
    # 128-token record at the shared positions
    short, long_ = records[1], records[3]
    shared = [p for p in short["positions"] if p in long_["positions"]]
    assert len(shared) > 10
    for p in shared:
        a = [[h[short["positions"].index(p)] for h in l] for l in short["entropy"]]
        b = [[h[long_["positions"].index(p)] for h in l] for l in long_["entropy"]]
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=2e-4)
    assert records[0]["paragraph"] != records[1]["paragraph"]

    rows = task.summarize(records)
    assert [r["length"] for r in rows] == [64, 128] and all(r["n"] == 2 for r in rows)
    assert math.isclose(rows[1]["entropy_last"], (records[2]["entropy_last"] + records[3]["entropy_last"]) / 2)
    assert math.isclose(rows[1]["uniform_last"], math.log(128))
    for layer in (0, 1):
        want = sum(sum(h[-1] for h in r["entropy"][layer]) / 4 for r in records[2:]) / 2
        assert math.isclose(rows[1][f"layer_{layer}"], want, rel_tol=1e-4)

    # resume: nothing is measured again; a lost record is measured again, identically
    before = out.read_text()
    task.run(context(True), lengths=[64, 128], samples=2)
    assert out.read_text() == before
    out.write_text("".join(line + "\n" for line in before.splitlines()[:-1]))
    task.run(context(True), lengths=[64, 128], samples=2)
    redone = json.loads(out.read_text().splitlines()[-1])
    assert redone["entropy"] == records[3]["entropy"] and (redone["length"], redone["sample"]) == (128, 1)


def test_summary_of_a_deep_model_shows_five_layers():
    def record(sample, last):
        return {"method": "plain", "params": {}, "length": 512, "sample": sample, "uniform_last": math.log(512),
                "entropy_last": sum(last) / 30, "normalised_last": 0.5, "layer_entropy_last": last}

    recs = [record(0, [float(i) for i in range(30)]), record(1, [float(2 * i) for i in range(30)])]
    [row] = task.summarize(recs)
    assert [k for k in row if k.startswith("layer_")] == ["layer_0", "layer_1", "layer_10", "layer_20", "layer_29"]
    assert row["layer_20"] == 30.0 and row["layer_29"] == 43.5 and row["n"] == 2
    assert row["entropy_last"] == pytest.approx((14.5 + 29.0) / 2)
    assert row["uniform_last"] == pytest.approx(math.log(512))
    assert task.shown_layers(2) == [0, 1] and task.shown_layers(32, most=6) == [0, 1, 8, 16, 24, 31]
    # a record written before the field existed carries no ceiling: none is made up
    del recs[1]["uniform_last"]
    assert task.summarize(recs)[0]["uniform_last"] is None


def test_cli_entropy_json(run_cli, tmp_path):
    code, out, err = run_cli("eval", "entropy", "tiny", "--lengths", "64,128", "--samples", "2",
                             "--json", "--plot", str(tmp_path / "e.png"))
    assert code == 0, err
    rows = json.loads(out)
    assert [r["length"] for r in rows] == [64, 128] and all(r["n"] == 2 for r in rows)
    assert all(0 < r["normalised_last"] <= 1 and 0 < r["entropy_last"] <= r["uniform_last"] + 1e-6 for r in rows)
    assert {"layer_0", "layer_1"} <= set(rows[0])
    assert (tmp_path / "e.png").stat().st_size > 0
