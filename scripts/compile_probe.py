"""Does ``torch.compile`` speed up a model's long prefill on this machine? Eager against compiled, same inputs.

    python scripts/compile_probe.py [--model smollm2] [--length 4096] [--dtype float32] [--repeats 2]

Loads the model the way ``ropekit eval`` does (``ropekit.models.loading.load_model``, SDPA attention), times
``--repeats`` eager prefills of one random-token input (logits of the last position only, as the evaluations
keep), then ``torch.compile(model, dynamic=False)`` (inductor, default mode): the first call's time (compilation
included) and ``--repeats`` compiled prefills, with the largest |Δ logit| against eager. Prints one line each and
a summary line naming the machine; writes nothing. docs/speed.md quotes its output.
"""

from __future__ import annotations

import argparse
import time

import torch

from ropekit.models.loading import load_model
from ropekit.runtime.devices import cpu_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    model = load_model(args.model, dtype=args.dtype, with_tokenizer=False).model
    ids = torch.randint(100, model.config.vocab_size, (1, args.length), generator=torch.Generator().manual_seed(0))

    def prefill(m) -> tuple[torch.Tensor, float]:
        start = time.perf_counter()
        with torch.no_grad():
            logits = m(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1).logits
        return logits.float(), time.perf_counter() - start

    eager = [prefill(model) for _ in range(args.repeats)]
    reference = eager[0][0]
    for _, seconds in eager:
        print(f"eager     {seconds:7.1f} s", flush=True)
    compiled_model = torch.compile(model, dynamic=False)
    _, first = prefill(compiled_model)
    print(f"compile + first call {first:7.1f} s", flush=True)
    compiled = [prefill(compiled_model) for _ in range(args.repeats)]
    for logits, seconds in compiled:
        print(f"compiled  {seconds:7.1f} s   max |Δ logit| {(logits - reference).abs().max().item():.2e}", flush=True)
    best_eager, best_compiled = min(s for _, s in eager), min(s for _, s in compiled)
    print(f"{args.model} {args.length} tokens {args.dtype}, {torch.get_num_threads()} threads, {cpu_model()}, "
          f"torch {torch.__version__}: compiled/eager {best_compiled / best_eager:.2f} (best of {args.repeats})")


if __name__ == "__main__":
    main()
