"""LongRoPE search on the built-in base model, judged on held-out documents against frozen YaRN and NTK-by-parts.

    python scripts/longrope_search_heldout.py [--out DIR] [--evaluations 96] [--target-length 1024] [--json]

Runs (or resumes) ``ropekit search builtin-base`` into DIR, then scores every held-out document of the built-in
evaluation corpus long enough for the target (the first target-length tokens of each, one window, no BOS) under
the searched export loaded by plain transformers and under ``yarn`` / ``ntk_by_parts`` at the same factor, and
prints perplexities with a paired bootstrap 95% interval of each closed form's perplexity over the searched one
(resampling documents). The README's LongRoPE-search numbers come from this script.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import torch

SEARCH_DEFAULTS = {"target_length": 1024, "evaluations": 96, "documents": 4, "seed": 0}


def document_nll(model, documents) -> list[tuple[float, int]]:
    from ropekit.eval.perplexity import score_windows

    out = []
    for doc in documents:
        with torch.no_grad():
            scores = score_windows(model, torch.tensor([doc]), len(doc) - 1).double()
        out.append((float(scores.sum()), scores.numel()))
    return out


def paired_interval(a, b, draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """ppl(a)/ppl(b) over the documents and its bootstrap 95% interval (documents resampled in pairs)."""
    gen = torch.Generator().manual_seed(seed)
    nll_a = torch.tensor([s for s, _ in a], dtype=torch.float64)
    nll_b = torch.tensor([s for s, _ in b], dtype=torch.float64)
    tokens = torch.tensor([n for _, n in a], dtype=torch.float64)
    ratio = lambda idx: math.exp(float((nll_a[idx].sum() - nll_b[idx].sum()) / tokens[idx].sum()))  # noqa: E731
    n = len(a)
    samples = sorted(ratio(torch.randint(0, n, (n,), generator=gen)) for _ in range(draws))
    return ratio(torch.arange(n)), samples[int(0.025 * draws)], samples[int(0.975 * draws) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/longrope-search-builtin-base")
    parser.add_argument("--evaluations", type=int, default=SEARCH_DEFAULTS["evaluations"])
    parser.add_argument("--target-length", type=int, default=SEARCH_DEFAULTS["target_length"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    search = [sys.executable, "-m", "ropekit.cli", "search", "builtin-base", "--target-length", str(args.target_length),
              "--out", args.out, "--evaluations", str(args.evaluations), "--documents",
              str(SEARCH_DEFAULTS["documents"]), "--seed", str(SEARCH_DEFAULTS["seed"]), "--json"]
    done = subprocess.run(search, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return done.returncode
    result = json.loads(done.stdout)

    import ropekit
    from ropekit.data.corpora import iter_documents
    from ropekit.models.loading import load_model
    from ropekit.runtime import quiet_transformers
    from ropekit.train.builtin_base import pretrain_base
    from transformers import AutoModelForCausalLM

    with quiet_transformers():
        base = load_model(str(pretrain_base()))
        searched = AutoModelForCausalLM.from_pretrained(Path(args.out) / "model").eval()
    length, factor = args.target_length, result["factor"]
    documents = [d.ids[:length] for d in iter_documents(None, base.tokenizer) if len(d.ids) >= length]
    scores = {"longrope (searched)": document_nll(searched, documents)}
    for method in ("yarn", "ntk_by_parts"):
        ropekit.extend(base.model, method, factor=factor)
        scores[method] = document_nll(base.model, documents)
        ropekit.uninstall(base.model)
    rows = []
    for name, values in scores.items():
        ppl = math.exp(sum(s for s, _ in values) / sum(n for _, n in values))
        ratio, lo, hi = paired_interval(values, scores["longrope (searched)"])
        rows.append({"variant": name, "ppl": ppl, "ratio_to_searched": ratio, "ratio_95": [lo, hi]})
    report = {"documents": len(documents), "target_length": length, "factor": factor,
              "search": {k: result[k] for k in ("evaluations", "generations", "evaluation_seconds")},
              "long_factor": result["best"]["long_factor"], "heldout": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"held-out perplexity at {length} tokens on {len(documents)} documents (search: {result['evaluations']} "
          f"evaluations, {result['evaluation_seconds']:.0f} s of evaluation):")
    for row in rows:
        lo, hi = row["ratio_95"]
        print(f"  {row['variant']:<20} {row['ppl']:8.2f}   × searched {row['ratio_to_searched']:.4f} [{lo:.4f}, {hi:.4f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
