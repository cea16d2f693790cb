"""Fixtures of the study tests: a synthetic study database for the report tests (``build_study``)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ropekit.study.store import StudyStore

DEPTHS = (0.0, 0.5, 1.0)
PASSKEY_KEYS = ("task", "method", "params", "length", "depth", "trial")
PPL_KEYS = ("task", "method", "params", "length", "doc")
#: A model's answer is untrusted text too: the first trial of every passkey cell "predicts" this.
HOSTILE_PREDICTION = "<script>alert('x')</script>"


def build_synthetic_study(directory: Path, tasks: Sequence[str] = ("passkey", "ppl", "speed"), seed: int = 0, *,
                          methods: Sequence[str] = ("plain", "yarn"), lengths: Sequence[int] = (64, 128, 256),
                          name: str = "synthetic <study>", model: str = "tiny-llama",
                          failures: Mapping[str, str] | None = None) -> dict[str, list[dict]]:
    """Write ``directory/study.sqlite``: a study of a base model with a 128-token window extended to 256,
    deterministic pseudo-random records of ``tasks`` for each of ``methods`` at ``lengths``, a training
    piece for ``yarn``, and one failed piece per ``failures`` item (piece id → error text).

    Passkey (3 depths × 2 trials per length): accuracy ~0.9 up to the window, beyond it rising with the
    method's position in ``methods``. Perplexity: 2 documents per length with an 8-point NLL curve.
    Speed: 3 repeats per method and length. Returns the records written, by task, for hand computations.
    """
    rng = random.Random(seed)
    records: dict[str, list[dict]] = {t: [] for t in tasks}
    with StudyStore(directory / "study.sqlite") as st:
        st.initialize(name, {"tasks": list(tasks)}, seeds=[seed], model=model, window=128,
                      target_length=256, methods=list(methods))
        st.begin_piece("train:yarn")
        st.finish_piece("train:yarn", metrics=[{"step": s, "loss": 4.0 - s / 10, "lr": 1e-3} for s in range(0, 30, 5)])
        for i, m in enumerate(methods):
            if "passkey" in tasks:
                recs = [{"task": "passkey", "method": m, "params": {}, "length": L, "depth": d, "trial": t,
                         "score": float(rng.random() < (0.9 if L <= 128 else 0.3 + 0.3 * i)),
                         "prediction": HOSTILE_PREDICTION if t == 0 else "42"}
                        for L in lengths for d in DEPTHS for t in range(2)]
                st.begin_piece(f"eval:passkey:{m}", method=m)
                st.finish_piece(f"eval:passkey:{m}", recs, key_fields=PASSKEY_KEYS)
                records["passkey"] += recs
            if "ppl" in tasks:
                recs = []
                for L in lengths:
                    for doc in range(2):
                        tokens = L - 1 - doc
                        sums = [rng.uniform(2, 4) * 4 for _ in range(8)]
                        recs.append({"task": "ppl", "method": m, "params": {}, "length": L, "doc": doc, "score": None,
                                     "corpus": "c", "score_mode": "last_stride", "stride": 32, "weighting": "token",
                                     "add_bos": False, "nll_sum": rng.uniform(2.0, 5.0) * tokens, "tokens_scored": tokens,
                                     "curve_nll_sum": sums, "curve_tokens": [4] * 8, "curve_positions": [j * L // 8 for j in range(8)]})
                st.begin_piece(f"eval:ppl:{m}", method=m)
                st.finish_piece(f"eval:ppl:{m}", recs, key_fields=PPL_KEYS)
                records["ppl"] += recs
        if "speed" in tasks:
            recs = [{"task": "speed", "method": m, "params": {}, "length": L, "repeat": r, "prefill_s": rng.uniform(0.01, 0.1),
                     "decode_s_per_token": rng.uniform(0.001, 0.01), "peak_mem_bytes": rng.randrange(1 << 20, 1 << 24)}
                    for L in lengths for r in range(3) for m in methods]
            st.begin_piece("eval:speed")
            st.finish_piece("eval:speed", recs)
            records["speed"] = recs
        for piece, error in (failures or {}).items():
            st.begin_piece(piece)
            st.fail_piece(piece, error)
    return records


@pytest.fixture(scope="session")
def build_study():
    """:func:`build_synthetic_study`, for tests and fixtures of any scope."""
    return build_synthetic_study
