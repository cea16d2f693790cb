"""What PoSE saves: one training step at the original window with PoSE positions vs. full-length training.

PoSE (paper 003, §3–4) fine-tunes on sequences of the original window ``L_c`` whose position ids span the
target ``L_t``; full-length training runs sequences of ``L_t`` tokens. The paper's efficiency argument is
that PoSE's step costs what an ``L_c`` step costs, whatever the target. :func:`pose_vs_full` measures it for
targets of 2×, 4×, 8× … the model's window: the same model and method (YaRN with ``s = L_t/L_c``), the same
number of sequences per step, forward + backward + AdamW.

Measured per mode and target:

* ``step_s`` — median wall time of a training step (after one untimed warm-up step, which also measures
  the activations);
* ``activation_mib`` — bytes autograd keeps for the backward pass (every tensor saved for backward, counted
  once per storage, parameters excluded; measured with ``torch.autograd.graph.saved_tensors_hooks``). This
  is device-independent and is what grows with sequence length;
* ``peak_mib`` — peak allocated device memory of the step, on CUDA only (``torch.cuda.max_memory_allocated``).

``tokens_per_step`` is what the step trains on: full-length steps see ``L_t/L_c`` times more tokens, so
per-token cost is reported too. Run it with ``ropekit train bench`` (it is not a test).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import RopekitError


def _activation_bytes(model, fn) -> int:
    """Bytes of distinct tensors saved for backward while ``fn()`` runs (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params and ptr != 0:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def _step(model, optimizer, ids, positions, mask, measure: bool):
    def forward():
        logits = model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False).logits
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))

    if measure:
        loss, saved = _activation_bytes(model, forward)
    else:
        loss, saved = forward(), 0
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return saved


def pose_vs_full(model_name: str = "tiny", multiples=(2, 4, 8), steps: int = 3, batch_size: int = 1,
                 seed: int = 0, device: str | None = None, threads: int | None = None) -> list[dict[str, Any]]:
    """Rows ``{multiple, target, mode, seq_len, tokens_per_step, step_s, s_per_1k_tokens, activation_mib,
    peak_mib, ratio_step, ratio_activation, threads}`` for PoSE and full-length training at each target
    (module doc). On the CPU, ``threads`` defaults to :func:`ropekit.demo.default_threads` (1 on a busy
    machine, where a second thread only waits)."""
    from ..demo import default_threads, deterministic

    with deterministic(threads or default_threads()):
        rows = _pose_vs_full(model_name, multiples, steps, batch_size, seed, device)
    for row in rows:
        row["threads"] = torch.get_num_threads() if threads is None else threads
    return rows


def _pose_vs_full(model_name, multiples, steps, batch_size, seed, device) -> list[dict[str, Any]]:
    import copy

    from ..data.pose import attention_mask_for, item_generator, pose_sample
    from ..models.loading import load_model
    from ..patching import extend, rope_info

    if steps < 1:
        raise RopekitError(f"bench steps {steps} is not positive", "pass --max-steps N with N ≥ 1")
    multiples = [int(m) for m in multiples]
    if not multiples or any(m < 2 for m in multiples):
        raise RopekitError(f"bench multiples {multiples} must be whole numbers ≥ 2", "pass e.g. --multiples 2,4,8")
    loaded = load_model(model_name)
    base = loaded.model
    window = rope_info(base).window
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    vocab = base.config.get_text_config().vocab_size
    rows: list[dict[str, Any]] = []
    for m in multiples:
        target = m * window
        per_mode = {}
        for mode, length in (("pose", window), ("full", target)):
            model = extend(copy.deepcopy(base), "yarn", factor=float(m)).to(dev)
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
            gen = torch.Generator().manual_seed(seed)
            ids = torch.randint(3, vocab, (batch_size, length), generator=gen).to(dev)
            if mode == "pose":
                positions = torch.stack([pose_sample(window, target, generator=item_generator(seed, 0, i)).position_ids
                                         for i in range(batch_size)]).to(dev)
            else:
                positions = torch.arange(length).expand(batch_size, length).to(dev)
            mask = torch.stack([attention_mask_for(length)] * batch_size).to(dev)
            # untimed warm-up step (allocator, kernels) that also counts the activations kept for backward
            saved = _step(model, optimizer, ids, positions, mask, measure=True)
            times = []
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            for _ in range(steps):
                started = time.perf_counter()
                _step(model, optimizer, ids, positions, mask, measure=False)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                times.append(time.perf_counter() - started)
            step_s = statistics.median(times)
            tokens = batch_size * length
            per_mode[mode] = {
                "multiple": m, "target": target, "mode": mode, "seq_len": length, "tokens_per_step": tokens,
                "step_s": step_s, "s_per_1k_tokens": 1000 * step_s / tokens, "activation_mib": saved / 2**20,
                "peak_mib": torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None,
            }
            del model, optimizer
        for mode in ("pose", "full"):
            row = per_mode[mode]
            row["ratio_step"] = row["step_s"] / per_mode["pose"]["step_s"]
            row["ratio_activation"] = row["activation_mib"] / per_mode["pose"]["activation_mib"]
            rows.append(row)
    return rows
