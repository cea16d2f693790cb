"""What PoSE saves: a training step at the original window with PoSE positions vs. full-length training.

PoSE (PoSE (Zhu et al. 2024), §3–4) fine-tunes on sequences of the original window ``L_c`` whose position ids span the
target ``L_t``; full-length training runs sequences of ``L_t`` tokens. The paper's efficiency argument is
that PoSE's step costs what a step of ordinary training at the window costs, whatever the target.
:func:`pose_vs_full` measures it in one run:

* ``window`` — the reference: ordinary training at the window (``L_c`` tokens, positions ``0 … L_c − 1``,
  the model as it is);
* for each target ``L_t = m·L_c`` (m = 2, 4, 8 …): ``pose`` (``L_c`` tokens with PoSE position ids up to
  ``L_t``) and ``full`` (``L_t`` tokens), both with YaRN at ``s = m`` installed.

Every mode uses the same model weights, the same AdamW optimizer, the same number of sequences per step
and an explicit all-ones attention mask (as the trainer passes), forward + backward + optimizer step.
The modes are measured *interleaved*: each round times one step of every mode, in a fresh seeded random
order, so a load change on a shared machine hits every mode alike and no mode always follows the same one; the method is switched
(untimed) before each step with :func:`ropekit.train.curriculum.switch`, so one copy of the model serves
every mode. Measured per mode:

* ``step_s`` — median wall time of a step over the rounds (after one untimed warm-up step per mode, which
  also measures the activations);
* ``activation_mib`` — bytes autograd keeps for the backward pass (every tensor saved for backward, counted
  once per storage, parameters excluded; measured with ``torch.autograd.graph.saved_tensors_hooks``). This
  is device-independent and is what grows with sequence length;
* ``peak_mib`` — peak allocated device memory of the step, on CUDA only (``torch.cuda.max_memory_allocated``);
* ``ratio_step`` / ``ratio_activation`` — relative to the ``window`` row.

``tokens_per_step`` is what the step trains on: full-length steps see ``L_t/L_c`` times more tokens, so
per-token cost is reported too. Run it with ``ropekit train bench`` (it is not a test).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

from ..data.pose import attention_mask_for, item_generator, pose_sample
from ..errors import RopekitError
from ..install import rope_info
from ..methods.yarn import YaRN
from ..models.loading import load_model
from ..runtime import default_threads, deterministic
from .config import MethodConfig
from .curriculum import switch


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
    peak_mib, ratio_step, ratio_activation, rounds, threads}``: first the ``window`` reference, then ``pose``
    and ``full`` per target (module doc); ``steps`` is the number of interleaved timing rounds. On the CPU,
    ``threads`` defaults to :func:`ropekit.runtime.default_threads` (1 on a busy machine, where a second thread
    only waits)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise RopekitError(f"bench steps {steps!r} is not a positive integer", "pass --max-steps N with N ≥ 1")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise RopekitError(f"bench batch size {batch_size!r} is not a positive integer", "pass batch_size=1 or more")
    multiples = [int(m) for m in multiples]
    if not multiples or any(m < 2 for m in multiples) or len(set(multiples)) != len(multiples):
        raise RopekitError(f"bench multiples {multiples} must be distinct whole numbers ≥ 2", "pass e.g. --multiples 2,4,8")
    with deterministic(threads or default_threads()):
        rows = _pose_vs_full(model_name, multiples, steps, batch_size, seed, device)
        used = torch.get_num_threads()
    for row in rows:
        row["threads"] = used
    return rows


def _pose_vs_full(model_name, multiples, steps, batch_size, seed, device) -> list[dict[str, Any]]:

    model = load_model(model_name).model
    window = rope_info(model).window
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    vocab = model.config.get_text_config().vocab_size
    model.to(dev).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(seed)

    def batch(length: int, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ids = torch.randint(3, vocab, (batch_size, length), generator=gen)
        mask = torch.stack([attention_mask_for(length)] * batch_size)
        return ids.to(dev), positions.to(dev), mask.to(dev)

    plain = MethodConfig(name=None, params={})
    arange = torch.arange(window).expand(batch_size, window)
    modes = [{"multiple": 1, "target": window, "mode": "window", "method": plain, "inputs": batch(window, arange)}]
    for m in multiples:
        target = m * window
        method = MethodConfig(name=YaRN.name, params={"factor": float(m)})
        pose_positions = torch.stack([pose_sample(window, target, generator=item_generator(seed, 0, i)).position_ids
                                      for i in range(batch_size)])
        modes.append({"multiple": m, "target": target, "mode": "pose", "method": method,
                      "inputs": batch(window, pose_positions)})
        modes.append({"multiple": m, "target": target, "mode": "full", "method": method,
                      "inputs": batch(target, torch.arange(target).expand(batch_size, target))})

    current = None

    def prepare(mode):
        nonlocal current
        switch(model, current, mode["method"])
        current = mode["method"]

    for mode in modes:  # untimed warm-up (allocator, kernels) that also counts the activations
        prepare(mode)
        mode["saved"] = _step(model, optimizer, *mode["inputs"], measure=True)
        mode["times"], mode["peak"] = [], 0
    order = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        for k in torch.randperm(len(modes), generator=order).tolist():
            mode = modes[k]
            prepare(mode)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            started = time.perf_counter()
            _step(model, optimizer, *mode["inputs"], measure=False)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                mode["peak"] = max(mode["peak"], torch.cuda.max_memory_allocated(dev))
            mode["times"].append(time.perf_counter() - started)

    rows = []
    for mode in modes:
        step_s = statistics.median(mode["times"])
        tokens = int(mode["inputs"][0].numel())
        rows.append({
            "multiple": mode["multiple"], "target": mode["target"], "mode": mode["mode"],
            "seq_len": int(mode["inputs"][0].shape[1]), "tokens_per_step": tokens, "step_s": step_s,
            "s_per_1k_tokens": 1000 * step_s / tokens, "activation_mib": mode["saved"] / 2**20,
            "peak_mib": mode["peak"] / 2**20 if dev.type == "cuda" else None, "rounds": steps,
        })
    reference = rows[0]
    for row in rows:
        row["ratio_step"] = row["step_s"] / reference["step_s"]
        row["ratio_activation"] = row["activation_mib"] / reference["activation_mib"]
    return rows
