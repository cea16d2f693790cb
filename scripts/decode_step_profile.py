"""Per-token decode time of attention methods against the plain model, from one shared prefill.

The KV cache of Self-Extend, LM-Infinite and Dual Chunk is the plain model's (they change how keys are attended,
not what is cached), so the prompt is prefilled once with the plain model and every method decodes from its own
copy of that cache — the prefill, minutes on a CPU, is not paid per method. Decode steps are interleaved (each
round times every method in turn, each method's first step — which builds its own decoding state, e.g.
Self-Extend's group-rotated keys — is timed apart), and medians are reported with the ratio to plain.

    python scripts/decode_step_profile.py smollm2 --length 4096 --steps 16 --methods self_extend [--profile]

``--profile`` prints torch.profiler's top operators of one decoding step per method.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--methods", default="self_extend")
    parser.add_argument("--factor", type=float, default=None, help="factor for every method (default: each method's own default; a scale method such as yarn needs one)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)

    import ropekit
    from ropekit.core.hf_compat import cache_argument, output_cache
    from ropekit.models.loading import load_model

    model = load_model(args.model).model.eval()
    variants = {"plain": model}
    for name in args.methods.split(","):
        kwargs = {"factor": args.factor} if args.factor else {}
        variants[name] = ropekit.extend(copy.deepcopy(model), name, **kwargs).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, args.length), generator=gen)
    start = time.perf_counter()
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    print(f"prefill (plain) of {args.length} tokens: {time.perf_counter() - start:.1f} s; "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, {torch.get_num_threads()} threads")
    prompt_cache = output_cache(out)
    first = out.logits[:, -1:].argmax(-1)
    state = {name: [copy.deepcopy(prompt_cache), first] for name in variants}
    times = {name: [] for name in variants}
    first_step = {}

    def step(name):
        cache, nxt = state[name]
        v = variants[name]
        t0 = time.perf_counter()
        with torch.no_grad():
            o = v(input_ids=nxt, use_cache=True, **{cache_argument(v): cache})
        elapsed = time.perf_counter() - t0
        state[name] = [output_cache(o), o.logits[:, -1:].argmax(-1)]
        return elapsed

    for name in variants:
        first_step[name] = step(name)
    for _ in range(args.steps):
        for name in variants:  # interleaved: every method in turn
            times[name].append(step(name))
    plain = statistics.median(times["plain"])
    print(f"{'method':<14}{'median s/token':>16}{'× plain':>10}{'first step s':>14}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<14}{med:>16.4f}{med / plain:>10.2f}{first_step[name]:>14.3f}")
    print(f"load after: {os.getloadavg()[0]:.1f}")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name in variants:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step(name)
            print(f"--- {name}")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
