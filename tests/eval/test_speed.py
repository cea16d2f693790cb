"""`ropekit eval speed`: records, resume, interleaving, ratios, and argument errors."""

from __future__ import annotations

import json

import pytest
import torch

from ropekit.errors import RopekitError
from ropekit.eval.records import RecordWriter, parse_lengths
from ropekit.eval.speed import PLAIN, parse_method_specs, run_speed, summarize
from ropekit.models.tiny import build_tiny_model


def test_parse_lengths():
    assert parse_lengths("4k, 8k,12000,1.5k") == [4096, 8192, 12000, 1536]
    for bad in ("", "4q", "-1", "0.5"):
        with pytest.raises(RopekitError):
            parse_lengths(bad)


def test_method_specs_route_params_and_reject_strays():
    cases = parse_method_specs(["yarn", "plain", "pi"], {"yarn.beta_fast": "16"})
    assert [c.name for c in cases] == [PLAIN, "yarn", "pi"]
    assert cases[1].params == {"beta_fast": "16"} and cases[2].params == {}
    with pytest.raises(RopekitError, match="does not name a measured method"):
        parse_method_specs(["yarn"], {"ntk.factor": "2"})
    with pytest.raises(RopekitError, match="unknown method"):
        parse_method_specs(["yarnn"], {})


def test_run_writes_one_record_per_measurement_interleaved_and_resumes(tmp_path):
    out = tmp_path / "speed.jsonl"
    model = build_tiny_model("llama")
    rows = run_speed(model, methods=["pi", "entropy_abf"], lengths=[32, 128], decode_tokens=2, repeats=2, out=str(out))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3 * 2 * 2
    # interleaved: within each (length, repeat) every method appears once, plain first
    assert [r["method"] for r in records[:3]] == [PLAIN, "pi", "entropy_abf"]
    assert [(r["length"], r["repeat"]) for r in records[::3]] == [(32, 0), (32, 1), (128, 0), (128, 1)]
    assert all(r["prefill_s"] > 0 and r["decode_s_per_token"] > 0 and r["peak_mem_bytes"] >= 0 for r in records)
    plain_rows = [r for r in rows if r["method"] == PLAIN]
    assert all(r["prefill_ratio"] == 1.0 for r in plain_rows)
    # the 128-token run of pi is extended to target 128 (factor 2 over the 64-token window)
    # resume: nothing is measured again, and the summary is the same
    again = run_speed(model, methods=["pi", "entropy_abf"], lengths=[32, 128], decode_tokens=2, repeats=2, out=str(out), resume=True)
    assert len(out.read_text().splitlines()) == 12
    assert again == rows
    with pytest.raises(RopekitError, match="already holds records"):
        run_speed(model, methods=["pi"], lengths=[32], out=str(out))


def test_a_resume_with_another_model_or_setting_is_refused(tmp_path):
    """The resume key was task, method, parameters, length and repeat: a run on another model (or dtype, or decode
    budget) resumed from the file reported the first model's timings as its own."""
    out = tmp_path / "speed.jsonl"
    run_speed(build_tiny_model("llama"), methods=["pi"], params={"pi.factor": "2"}, lengths=[32], decode_tokens=0,
              out=str(out), model_name="tiny")
    before = out.read_text()
    other = build_tiny_model("llama", hidden_size=128)
    with pytest.raises(RopekitError, match="model='tiny'.*model='other'"):
        run_speed(other, methods=["pi"], params={"pi.factor": "2"}, lengths=[32], decode_tokens=0, out=str(out),
                  resume=True, model_name="other")
    with pytest.raises(RopekitError, match="decode_tokens=0.*decode_tokens=4"):
        run_speed(build_tiny_model("llama"), methods=["pi"], params={"pi.factor": "2"}, lengths=[32], decode_tokens=4,
                  out=str(out), resume=True, model_name="tiny")
    with pytest.raises(RopekitError, match="dtype='float32'.*dtype='bfloat16'"):
        run_speed(build_tiny_model("llama").to(torch.bfloat16), methods=["pi"], params={"pi.factor": "2"}, lengths=[32],
                  decode_tokens=0, out=str(out), resume=True, model_name="tiny")
    assert out.read_text() == before  # nothing written
    rows = run_speed(build_tiny_model("llama"), methods=["pi"], params={"pi.factor": "2"}, lengths=[32],
                     decode_tokens=0, out=str(out), resume=True, model_name="tiny")
    assert out.read_text() == before and len(rows) == 2  # the same setting continues


def test_resume_drops_a_line_cut_short_by_a_crash(tmp_path):
    out = tmp_path / "r.jsonl"
    good = {"task": "speed", "method": "plain", "params": {}, "length": 8, "repeat": 0, "prefill_s": 1.0}
    out.write_text(json.dumps(good) + "\n" + '{"task": "speed", "meth')
    writer = RecordWriter(out, resume=True, key_fields=("task", "method", "params", "length", "repeat"))
    assert writer.has(good) and len(list(writer.records())) == 1
    assert out.read_text() == json.dumps(good) + "\n"


def test_summary_medians_and_ratios():
    recs = [
        {"method": PLAIN, "length": 8, "prefill_s": s, "decode_s_per_token": 1.0, "peak_mem_bytes": 100} for s in (1.0, 3.0, 2.0)
    ] + [{"method": "yarn", "length": 8, "prefill_s": 4.0, "decode_s_per_token": 2.0, "peak_mem_bytes": 50}]
    rows = {r["method"]: r for r in summarize(recs)}
    assert rows[PLAIN]["prefill_s"] == 2.0 and rows[PLAIN]["repeats"] == 3
    assert rows["yarn"]["prefill_ratio"] == 2.0 and rows["yarn"]["decode_ratio"] == 2.0 and rows["yarn"]["memory_ratio"] == 0.5


def test_summary_keeps_parameter_sets_apart_and_reads_only_speed_records():
    def rec(method, params, prefill):
        return {"task": "speed", "method": method, "params": params, "length": 8, "repeat": 0, "prefill_s": prefill,
                "decode_s_per_token": 1.0, "peak_mem_bytes": 100}

    recs = [rec(PLAIN, {}, 1.0), rec("yarn", {"factor": 2.0}, 1.0), rec("yarn", {"factor": 8.0}, 3.0),
            {"task": "passkey", "method": "yarn", "length": 8, "correct": True}]
    rows = {r["params"].get("factor"): r for r in summarize(recs) if r["method"] == "yarn"}
    assert set(rows) == {2.0, 8.0} and rows[2.0]["repeats"] == rows[8.0]["repeats"] == 1
    assert (rows[2.0]["prefill_ratio"], rows[8.0]["prefill_ratio"]) == (1.0, 3.0)


def test_a_resumed_file_with_other_parameters_summarises_only_this_runs_cases(tmp_path):
    out = tmp_path / "speed.jsonl"
    model = build_tiny_model("llama")
    run_speed(model, methods=["yarn"], params={"yarn.factor": "2"}, lengths=[32], decode_tokens=0, out=str(out))
    rows = run_speed(model, methods=["yarn"], params={"yarn.factor": "8"}, lengths=[32], decode_tokens=0,
                     out=str(out), resume=True)
    assert len(out.read_text().splitlines()) == 3  # plain once, yarn twice: both parameter sets are kept
    assert [(r["method"], r["params"]) for r in rows] == [(PLAIN, {}), ("yarn", {"factor": "8"})]
    assert all(r["repeats"] == 1 for r in rows)


def test_loglog_slopes_match_numpy_polyfit_and_the_plot_is_written(tmp_path):
    """The slope of the least-squares fit in log-log equals numpy.polyfit's on noisy synthetic power laws; the fit
    uses only lengths past the window when there are two or more; the PNG is written."""
    import numpy as np

    from ropekit.eval.speed import cost_slopes, loglog_slope, plot_cost

    rng = np.random.default_rng(0)
    lengths = [1024, 2048, 4096, 8192, 16384, 32768]
    rows = []
    for method, k_time, k_mem in ((PLAIN, 2.0, 1.0), ("lm_infinite", 1.0, 1.0), ("dual_chunk", 1.9, 1.1)):
        for n in lengths:
            rows.append({"method": method, "length": n,
                         "prefill_s": 1e-7 * n ** k_time * float(np.exp(rng.normal(0, 0.1))),
                         "peak_mem_bytes": 300.0 * n ** k_mem * float(np.exp(rng.normal(0, 0.1)))})
    for method in (PLAIN, "lm_infinite", "dual_chunk"):
        mine = [r for r in rows if r["method"] == method]
        for field in ("prefill_s", "peak_mem_bytes"):
            x, y = [r["length"] for r in mine], [r[field] for r in mine]
            want = np.polyfit(np.log(x), np.log(y), 1)[0]
            assert loglog_slope(x, y) == pytest.approx(want, rel=1e-12, abs=1e-12)
    # past a 4096-token window: only 8k, 16k, 32k are fitted
    plain = [r for r in rows if r["method"] == PLAIN and r["length"] > 4096]
    want = np.polyfit(np.log([r["length"] for r in plain]), np.log([r["prefill_s"] for r in plain]), 1)[0]
    slopes = cost_slopes(rows, window=4096)
    assert slopes[PLAIN]["lengths"] == [8192, 16384, 32768]
    assert slopes[PLAIN]["prefill_s"] == pytest.approx(want, rel=1e-12)
    assert cost_slopes(rows, window=20000)[PLAIN]["lengths"] == lengths  # fewer than two past it: every length
    with pytest.raises(ValueError):
        loglog_slope([8, 8], [1.0, 2.0])

    png = tmp_path / "speed.png"
    got = plot_cost(rows, png, window=4096, title="synthetic")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert got == slopes
    with pytest.raises(RopekitError, match="not a .png"):
        plot_cost(rows, tmp_path / "speed.pdf")


def test_cli_speed_plot_writes_the_png_and_prints_slopes(tmp_path):
    from typer.testing import CliRunner

    from ropekit.cli import app

    png = tmp_path / "figs" / "speed.png"
    result = CliRunner().invoke(app, ["eval", "speed", "tiny", "--methods", "lm_infinite", "--lengths", "96,192",
                                      "--decode-tokens", "0", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.exists() and "log-log slopes" in result.output and "lm_infinite" in result.output


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_prefill_flops_match_torch_flop_counter(family):
    """The FLOP model against torch's own counter over a real forward (eager attention, full L×L products).

    The counter sees the full QKᵀ and PV products (2·2·layers·heads·head_dim·L² FLOPs); the model counts the causal
    lower triangle with its diagonal, L(L+1)/2 per head — exactly 2·layers·heads·head_dim·L(L−1) fewer. The rotary
    module's one angle product (position × inverse frequency: head_dim·L FLOPs) is counted by torch, not by us."""
    from torch.utils.flop_counter import FlopCounterMode

    from ropekit.eval.speed import prefill_flops

    length = 96
    model = build_tiny_model(family, attn_implementation="eager")
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    ids = torch.randint(0, cfg.vocab_size, (1, length))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, logits_to_keep=1)
    causal_saving = 2 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * length * (length - 1)
    expected = counter.get_total_flops() - causal_saving
    assert abs(prefill_flops(model, length) - expected) <= head_dim * length


@pytest.mark.parametrize("family", ["gpt_oss", "deepseek_v3"])
def test_prefill_flops_of_experts_and_latent_attention_match_torch_flop_counter(family):
    """Mixture-of-experts weights are 3-D tensors in transformers 5 (not linear layers) and were not counted (gpt-oss:
    the reported FLOPs were a sixth of the work); multi-head latent attention's QKᵀ and PV were counted with
    head_dim instead of qk_nope + qk_rope and v_head_dim."""
    from torch.utils.flop_counter import FlopCounterMode

    from ropekit.eval.speed import prefill_flops

    model = build_tiny_model(family, attn_implementation="eager")
    cfg = model.config
    length = min(48, getattr(cfg, "sliding_window", None) or 48)  # eager's full products are the counted ones
    qk = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) if family == "deepseek_v3" else cfg.head_dim
    v = cfg.v_head_dim if family == "deepseek_v3" else cfg.head_dim
    ids = torch.randint(0, cfg.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, logits_to_keep=1)
    causal_saving = cfg.num_hidden_layers * cfg.num_attention_heads * (qk + v) * length * (length - 1)
    expected = counter.get_total_flops() - causal_saving
    # the routed experts run in grouped kernels torch's counter does not see: count them from the config, the top-k
    # experts' gate, up and down projections per token in every layer past the dense ones
    moe_layers = cfg.num_hidden_layers - (getattr(cfg, "first_k_dense_replace", None) or 0)
    inner = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    expected += 2 * length * cfg.num_experts_per_tok * 3 * cfg.hidden_size * inner * moe_layers
    assert abs(prefill_flops(model, length) - expected) <= 0.01 * expected


def test_prefill_flops_of_sliding_window_layers_count_the_window():
    """A sliding-window layer's query sees at most its window of keys (a naive count of the attended pairs): what
    remains of the FLOPs once that attention is taken away is linear in the length (the dense matmuls)."""
    from ropekit.eval.speed import prefill_flops

    model = build_tiny_model("gpt_oss")
    cfg = model.config
    window = cfg.sliding_window

    def attention(length):
        pairs = {"full_attention": sum(i + 1 for i in range(length)),
                 "sliding_attention": sum(min(i + 1, window) for i in range(length))}
        return sum(4 * cfg.num_attention_heads * cfg.head_dim * pairs[kind] for kind in cfg.layer_types)

    rest = {n: prefill_flops(model, n) - attention(n) for n in (window + 3, 2 * window + 3, 4 * window + 3)}
    a, b, c = sorted(rest)
    assert "sliding_attention" in cfg.layer_types
    assert (rest[c] - rest[b]) * (b - a) == (rest[b] - rest[a]) * (c - b) and rest[b] > rest[a]


def test_speed_records_report_throughput_against_a_measured_peak(tmp_path):
    from ropekit.eval.speed import matmul_peak, prefill_flops

    model = build_tiny_model("llama")
    with pytest.raises(RopekitError, match="yarn needs a factor"):  # inside the window no factor can be inferred
        run_speed(model, methods=["yarn"], lengths=[64], decode_tokens=0)
    rows = run_speed(model, methods=["yarn"], lengths=[64], params={"yarn.factor": "2"}, decode_tokens=0,
                     out=str(tmp_path / "s.jsonl"))
    for row in rows:
        assert row["dtype"] == "float32" and row["peak_tflops"] > 0
        # the rate is the model's FLOPs over the measured time, and the fraction is that rate over the peak
        assert row["prefill_tflops"] == pytest.approx(prefill_flops(model, 64) / row["prefill_s"] / 1e12)
        assert row["peak_fraction"] == pytest.approx(row["prefill_tflops"] / row["peak_tflops"])
    # the probe: 2n³ FLOPs over the best time; a 256² product on any CPU runs between 1 GFLOP/s and 100 TFLOP/s
    assert 1e-3 < matmul_peak(torch.float32, "cpu", size=256, seconds=0.05) < 100
