"""Speed and memory: prefill time, decode time per token and peak memory per length (LCEG Table 8).

Several methods are measured in one run, *interleaved* (for each length and repeat, every method in
turn), so that a machine's drifting load hits all of them alike; each result is also reported as a
ratio to the plain model measured in the same run.

Throughput: every prefill is also reported in achieved TFLOP/s — the *model's* FLOPs (:func:`prefill_flops`: the
dense layers' matmuls, the causal attention's two products, the LM head on the kept logits; what the plain model
must compute, so an attention-side method that does more work shows a lower rate) over the wall time — beside the
machine's measured matmul peak in the model's dtype (:func:`matmul_peak`, a probe run in the same process).

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` over the call; on CPU, the peak resident set
size above the level before the call, sampled every 2 ms from ``/proc/self/statm`` by a background
thread (CPU tensors have no allocator statistics). Both count activations, not the weights already
resident.
"""

from __future__ import annotations

import copy
import json
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..core.hf_compat import cache_argument, output_cache
from ..errors import RopekitError
from ..methods import get_method
from ..install import extend, rope_info
from ..runtime.atomic import check_figure_target, save_figure
from ..runtime.devices import computed_on
from .records import RecordWriter

PLAIN = "plain"
#: What identifies one measurement besides task/method/params/length (see ropekit.eval.common).
KEY_FIELDS = ("repeat",)


class _RssSampler:
    """Peak resident memory of this process while the context is open (Linux), in bytes above the start."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.peak = 0
        self._stop = threading.Event()

    def _rss(self) -> int:
        try:
            with open("/proc/self/statm") as fh:
                return int(fh.read().split()[1]) * self.page
        except OSError:
            return 0

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(self.interval)

    def __enter__(self):
        self.start = self._rss()
        self.peak = self.start
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())
        return False

    @property
    def used(self) -> int:
        return max(0, self.peak - self.start)


def _release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them), so the next RSS peak is the call's own."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _measure(fn: Callable[[], Any], device: torch.device) -> tuple[float, int, Any]:
    """Wall time (s) and peak extra memory (bytes) of ``fn()``; returns its result too."""
    _release_freed_memory()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        return elapsed, torch.cuda.max_memory_allocated(device) - before, result
    with _RssSampler() as sampler:
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
    return elapsed, sampler.used, result


def _attended_pairs(length: int, window: int | None) -> int:
    """Query–key pairs of a causal prefill of ``length`` tokens, each query seeing at most ``window`` keys."""
    if window is None or window >= length:
        return length * (length + 1) // 2
    return window * (window + 1) // 2 + (length - window) * window


def _active_expert_fraction(config) -> float | None:
    """The share of a mixture-of-experts layer's expert weights one token runs through: top-k of E experts."""
    k = getattr(config, "num_experts_per_tok", None) or getattr(config, "moe_topk", None)
    experts = next((getattr(config, name) for name in ("num_local_experts", "n_routed_experts", "num_experts")
                    if isinstance(getattr(config, name, None), int)), None)
    return k / experts if isinstance(k, int) and experts else None


def prefill_flops(model, length: int, logits_kept: int = 1) -> int:
    """FLOPs of one causal prefill of ``length`` tokens, as in the usual model-FLOPs-utilisation accounting
    (Chowdhery et al. 2022, PaLM, appendix B): matmuls only — norms, RoPE and activations are left out (a few
    percent at these sizes).

    * dense matmuls: 2·(weights of every linear layer below the LM head)·length; a mixture of experts' expert
      weights (transformers keeps them as 3-D tensors, not linear layers) count at the top-k of E share a token
      runs through;
    * attention: 2·(d_qk + d_v)·heads per attended query–key pair — QKᵀ and PV under the causal mask (the lower
      triangle with its diagonal), a sliding-window layer's queries seeing at most its window; d_qk and d_v are
      the head size, or multi-head latent attention's ``qk_nope_head_dim + qk_rope_head_dim`` and ``v_head_dim``;
    * the LM head: 2·hidden·vocab·``logits_kept``.
    """
    config = getattr(model.config, "text_config", None) or model.config
    head = model.get_output_embeddings()
    dense = sum(m.weight.numel() for m in model.modules()
                if isinstance(m, torch.nn.Linear) and m is not head)
    experts = sum(p.numel() for p in model.parameters() if p.dim() == 3)
    if experts:
        share = _active_expert_fraction(config)
        if share is None:
            raise RopekitError("speed: this model's expert weights have no top-k and expert count in its config, so "
                               "its FLOPs (and TFLOP/s) cannot be counted", "measure a dense model, or report seconds")
        dense += experts * share
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    qk_dim = (config.qk_nope_head_dim + config.qk_rope_head_dim
              if getattr(config, "qk_rope_head_dim", None) and getattr(config, "qk_nope_head_dim", None) is not None
              else head_dim)
    v_dim = getattr(config, "v_head_dim", None) or head_dim
    types = getattr(config, "layer_types", None) or ["full_attention"] * layers
    window = getattr(config, "sliding_window", None)
    attention = sum(2 * (qk_dim + v_dim) * heads
                    * _attended_pairs(length, window if kind == "sliding_attention" else None) for kind in types)
    lm_head = 2 * head.weight.numel() * logits_kept if head is not None else 0
    return int(2 * dense * length + attention + lm_head)


def matmul_peak(dtype: torch.dtype, device: torch.device | str = "cpu", size: int | None = None,
                seconds: float = 1.0) -> float:
    """This machine's matmul rate in ``dtype`` (TFLOP/s): the best of repeated ``size × size`` products, timed for
    about ``seconds`` after a warm-up. ``size`` defaults to 2048 on CPU (large enough to reach the GEMM kernels'
    steady state with the threads torch uses) and 8192 on a GPU."""
    device = torch.device(device)
    n = size or (8192 if device.type == "cuda" else 2048)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.matmul(a, b)  # warm-up: kernel selection, thread pool
    sync()
    best, spent = math.inf, 0.0
    while spent < seconds or best == math.inf:
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return 2 * n**3 / best / 1e12


@dataclass
class SpeedCase:
    """One model variant to time: the plain model or a method with its parameters."""

    name: str
    method: str | None
    params: dict[str, Any]


def parse_method_specs(methods: list[str], params: dict[str, str]) -> list[SpeedCase]:
    """``["plain", "yarn", "self_extend"]`` + ``{"yarn.factor": "2"}`` → cases (plain always first)."""
    names = [m.strip() for m in methods if m.strip()]
    cases = [SpeedCase(PLAIN, None, {})]
    for name in names:
        if name == PLAIN:
            continue
        method = get_method(name)
        own = {k.split(".", 1)[1]: v for k, v in params.items() if k.split(".", 1)[0] == method.name}
        cases.append(SpeedCase(method.name, method.name, own))
    known = {c.name for c in cases}
    for key in params:
        prefix = key.split(".", 1)[0]
        if "." not in key or prefix not in known:
            raise RopekitError(
                f"--param '{key}' does not name a measured method", "write it as METHOD.key=value, e.g. yarn.factor=4"
            )
    return cases


def _prepare(model, case: SpeedCase, max_length: int):
    if case.method is None:
        return model
    variant = copy.deepcopy(model)
    info = rope_info(variant)
    method = get_method(case.method)
    kwargs = dict(case.params)
    if method.sized_by_target(kwargs):
        if max_length > info.window:
            kwargs["target_length"] = max_length
        elif method.scale_only:
            raise RopekitError(
                f"{method.name} needs a factor, and the lengths measured (up to {max_length}) are within the "
                f"model's {info.window}-token window, so none can be inferred",
                f"pass --param {method.name}.factor=F (e.g. 2; the cost does not depend on it)")
    return extend(variant, method, **kwargs)


def run_speed(
    model,
    *,
    methods: list[str],
    lengths: list[int],
    params: dict[str, str] | None = None,
    decode_tokens: int = 8,
    repeats: int = 1,
    seed: int = 0,
    out: str | None = None,
    resume: bool = False,
    progress: Callable[[str], None] | None = None,
    model_name: str | None = None,
) -> list[dict[str, Any]]:
    """Measure every case at every length; returns (and writes) one record per (method, length, repeat).

    Every record carries the run's ``setting`` (the model as named, where, on what hardware and in which dtype and
    attention it ran, the decode budget and the seed); a resume whose setting differs from its file's is refused, since the timings already
    there would be reported as this run's."""
    cases = parse_method_specs(methods, params or {})
    writer = RecordWriter(out, resume=resume, key_fields=("task", "method", "params", "length", "repeat"))
    # threads are recorded per measurement but not compared: the default follows the machine's load
    setting = {"model": model_name, **computed_on(model), "decode_tokens": decode_tokens, "seed": seed}
    _check_resumed_setting(writer, setting, out)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    peak = matmul_peak(dtype, device)
    vocab = model.config.vocab_size
    variants = {case.name: _prepare(model, case, max(lengths)) for case in cases}
    warm = torch.randint(0, vocab, (1, min(128, min(lengths))), generator=torch.Generator().manual_seed(seed)).to(device)
    for variant in variants.values():
        variant.eval()
        with torch.no_grad():  # first calls pay one-off costs (thread pools, allocator growth)
            variant(input_ids=warm, attention_mask=torch.ones_like(warm), use_cache=True)
    for length in lengths:
        gen = torch.Generator().manual_seed(seed + length)
        ids = torch.randint(0, vocab, (1, length), generator=gen).to(device)
        mask = torch.ones_like(ids)
        for repeat in range(repeats):
            for case in cases:  # interleaved: every method in turn at each (length, repeat)
                key = {"task": "speed", "method": case.name, "params": case.params, "length": length, "repeat": repeat}
                if writer.has(key):
                    continue
                if progress:
                    progress(f"{case.name} @ {length} tokens (repeat {repeat + 1}/{repeats})")
                variant = variants[case.name]
                with torch.no_grad():
                    prefill_s, prefill_mem, output = _measure(
                        # only the last position's logits, as generate's prefill: the LM head over every
                        # position would dominate both time and memory and hide the attention's cost
                        lambda: variant(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1), device
                    )
                    cache, next_id = output_cache(output), output.logits[:, -1:].argmax(-1)
                    del output
                    step_mask = mask

                    def decode():
                        nonlocal cache, next_id, step_mask
                        for _ in range(decode_tokens):
                            step_mask = torch.cat([step_mask, torch.ones_like(next_id)], dim=1)
                            o = variant(input_ids=next_id, attention_mask=step_mask, use_cache=True, **{cache_argument(variant): cache})
                            cache, next_id = output_cache(o), o.logits[:, -1:].argmax(-1)

                    decode_s, decode_mem, _ = _measure(decode, device) if decode_tokens else (0.0, 0, None)
                    del cache
                flops = prefill_flops(variant, length)
                writer.write({
                    **key,
                    "prefill_s": prefill_s,
                    "prefill_flops": flops,
                    "prefill_tflops": flops / prefill_s / 1e12,
                    "peak_tflops": peak,
                    "dtype": str(dtype).removeprefix("torch."),
                    "decode_s_per_token": decode_s / decode_tokens if decode_tokens else None,
                    "peak_mem_bytes": max(prefill_mem, decode_mem),
                    "prefill_mem_bytes": prefill_mem,
                    "device": str(device),
                    "threads": torch.get_num_threads(),
                    "setting": setting,
                })
    # a resumed file may hold other runs' parameters or lengths: this run's summary is of its own cases
    wanted = {(case.name, _params_key(case.params)) for case in cases}
    return summarize([r for r in writer.records() if r.get("task", "speed") == "speed"
                      and (r["method"], _params_key(r.get("params"))) in wanted and r["length"] in lengths
                      and r.get("repeat", 0) < repeats])


def _check_resumed_setting(writer: RecordWriter, setting: dict[str, Any], out) -> None:
    for record in writer.records():
        before = record.get("setting") if record.get("task", "speed") == "speed" else None
        if not before:
            continue  # written before settings were recorded: cannot be checked
        changed = sorted(k for k in set(before) | set(setting) if before.get(k) != setting.get(k))
        if changed:
            was = ", ".join(f"{k}={before.get(k)!r}" for k in changed)
            now = ", ".join(f"{k}={setting.get(k)!r}" for k in changed)
            raise RopekitError(f"{out} holds timings made with {was}; this run has {now}, and resuming would "
                               "report those timings as this run's", "pass another --out, or the same setting")


def _params_key(params: dict[str, Any] | None) -> str:
    return json.dumps(params or {}, sort_keys=True, default=str)


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over repeats per (method, parameters, length), with ratios to the plain model of the same length;
    records of other tasks are left out."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("task", "speed") == "speed":
            groups.setdefault((r["method"], _params_key(r.get("params")), r["length"]), []).append(r)
    rows = []
    for (method, _, length), recs in groups.items():
        rows.append({
            "method": method,
            "params": recs[0].get("params") or {},
            "length": length,
            "prefill_s": statistics.median(r["prefill_s"] for r in recs),
            "decode_s_per_token": statistics.median((r["decode_s_per_token"] or 0.0) for r in recs),
            "peak_mem_bytes": statistics.median(r["peak_mem_bytes"] for r in recs),
            "repeats": len(recs),
        })
        if all(r.get("prefill_tflops") for r in recs):  # records written before the rate was measured lack it
            rows[-1]["prefill_tflops"] = statistics.median(r["prefill_tflops"] for r in recs)
            rows[-1]["peak_tflops"] = statistics.median(r["peak_tflops"] for r in recs)
            rows[-1]["peak_fraction"] = rows[-1]["prefill_tflops"] / rows[-1]["peak_tflops"]
            rows[-1]["dtype"] = recs[0].get("dtype")
    plain = {row["length"]: row for row in rows if row["method"] == PLAIN}
    for row in rows:
        base = plain.get(row["length"])
        if base:
            row["prefill_ratio"] = row["prefill_s"] / base["prefill_s"] if base["prefill_s"] else None
            row["decode_ratio"] = (row["decode_s_per_token"] / base["decode_s_per_token"]) if base["decode_s_per_token"] else None
            row["memory_ratio"] = (row["peak_mem_bytes"] / base["peak_mem_bytes"]) if base["peak_mem_bytes"] else None
    order = {m: i for i, m in enumerate(dict.fromkeys(r["method"] for r in records))}
    rows.sort(key=lambda r: (r["length"], order.get(r["method"], 0)))
    return rows


# ---- cost against length --------------------------------------------------------------------------------------
#: What the cost-vs-length fit and plot read from a summary row: (field, label).
COST_FIELDS = (("prefill_s", "prefill time (s)"), ("peak_mem_bytes", "peak memory (bytes)"))


def loglog_slope(lengths: list[float], values: list[float]) -> float:
    """Least-squares slope of ``log value`` against ``log length``: the exponent ``k`` of ``value ∝ length^k``
    (1: linear, 2: quadratic). Needs at least two distinct lengths and positive values."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(lengths, values) if x > 0 and y > 0]
    if len({x for x, _ in pairs}) < 2:
        raise ValueError("a log-log slope needs positive values at two distinct lengths at least")
    mx = sum(x for x, _ in pairs) / len(pairs)
    my = sum(y for _, y in pairs) / len(pairs)
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    return sxy / sxx


def cost_slopes(rows: list[dict[str, Any]], window: int | None = None) -> dict[str, dict[str, Any]]:
    """Per method, the log-log slopes of prefill time and peak memory against length (:func:`loglog_slope`).

    Fitted over the lengths past ``window`` (the model's pretrained window) where there are two or more of them —
    a bounded method (LM-Infinite's Λ band) is linear only past its window — else over every length. Returns
    ``{method: {"prefill_s": k, "peak_mem_bytes": k, "lengths": [...]}}`` (``None`` where a fit is impossible).
    """
    by_method: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    out: dict[str, dict[str, Any]] = {}
    for method, recs in by_method.items():
        recs = sorted(recs, key=lambda r: r["length"])
        past = [r for r in recs if window is not None and r["length"] > window]
        used = past if len(past) >= 2 else recs
        fit: dict[str, Any] = {"lengths": [r["length"] for r in used]}
        for field, _ in COST_FIELDS:
            try:
                fit[field] = loglog_slope([r["length"] for r in used], [r[field] for r in used])
            except ValueError:
                fit[field] = None
        out[method] = fit
    return out


def plot_cost(rows: list[dict[str, Any]], path, *, window: int | None = None, title: str = "") -> dict[str, dict[str, Any]]:
    """Log-log plot of prefill time and peak memory per method against length into the PNG ``path``, each method's
    fitted slope (:func:`cost_slopes`) in its legend label, the window as a dashed line; returns the slopes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = check_figure_target(path)
    if not rows:
        raise RopekitError("there is nothing to plot: no speed record", "measure some lengths first")
    slopes = cost_slopes(rows, window)
    fig = Figure(figsize=(11, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for i, (field, label) in enumerate(COST_FIELDS):
        ax = fig.add_subplot(1, 2, i + 1)
        for method in methods:
            recs = sorted((r for r in rows if r["method"] == method and r[field] and r[field] > 0),
                          key=lambda r: r["length"])
            if not recs:
                continue
            k = slopes[method][field]
            name = f"{method} (slope {k:.2f})" if k is not None else method
            ax.plot([r["length"] for r in recs], [r[field] for r in recs], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        if window:
            ax.axvline(window, color="grey", linestyle="--", linewidth=1.0, label=f"window ({window} tokens)")
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, format="png", dpi=110)
    return slopes
