"""The exported directory's model card (``README.md``, written with huggingface_hub's ``ModelCard``) and its
``ROPEKIT.md``: what the model is, the evidence it was chosen on when ``ropekit recommend`` chose it
(:func:`evidence_markdown`), and the same model's settings in each stack people serve or train with.

Every setting printed is derived from the ``config.json`` the export wrote, and only where that stack computes the
same model from it; otherwise the card says so and names the alternative:

* transformers 5.x reads ``rope_parameters``; 4.x reads ``rope_scaling``/``rope_theta`` (:mod:`.legacy`).
* vLLM: the directory bare, and the original model with ``--hf-overrides`` (vLLM's ``hf_overrides`` replaces
  config values before the model is built) and ``--max-model-len`` (:mod:`.vllm`).
* llama.cpp on the original GGUF: its flags ``--rope-scaling``, ``--rope-scale``, ``--rope-freq-base``,
  ``--yarn-orig-ctx`` and ``-c`` (llama.cpp's ``common/arg.cpp``). Its YaRN is transformers' with the default
  ramp (β_fast 32, β_slow 1, truncated), attention factor 0.1·ln s + 1 and the extrapolation mix on, so those
  flags are printed only for exactly that; per-pair frequencies (NTK-by-parts as longrope, llama3, compositions)
  need the GGUF ``ropekit export DIR --format gguf`` writes.
* LLaMA-Factory's own ``rope_scaling`` option writes ``{"type": NAME, "factor": ceil(model_max_length /
  max_position_embeddings)}`` and nothing else (``model_utils/rope.py``): the same model only for ``linear`` with
  a whole factor; otherwise train from this directory with the option unset. axolotl loads ``base_model`` with
  transformers: this directory carries the scaling.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .legacy import legacy_releases
from .vllm import vllm_serving


def _number(x) -> str:
    """A flag's value as the shortest text that reads back as the same float (``:g`` keeps 6 digits: a factor of
    1.46484375 would be served as 1.46484, 0.02 rad off at 12k tokens on the fastest pair)."""
    return repr(float(x)).removesuffix(".0")


def _base_changed(rope: dict[str, Any], base_rope: dict[str, Any]) -> bool:
    """Whether the export's RoPE base differs from the original model's (a method given ``rope_theta`` too)."""
    theta, base = rope.get("rope_theta"), base_rope.get("rope_theta")
    return theta is not None and base is not None and float(theta) != float(base)


def _llamacpp_flags(rope: dict[str, Any], window: int, base_rope: dict[str, Any]) -> tuple[str | None, str]:
    """``(llama.cpp flags for the original GGUF, "")`` or ``(None, why none)``."""
    if any(isinstance(v, dict) for v in (*rope.values(), *base_rope.values())):
        return None, "llama.cpp's flags set one RoPE for every layer, and this model has RoPE per layer type"
    if base_rope.get("rope_type", "default") != "default":
        return None, "the original model's RoPE is already scaled; flags would replace it"
    kind = rope.get("rope_type", "default")
    # the GGUF keeps the original base unless told otherwise
    base = f"--rope-freq-base {_number(rope['rope_theta'])} " if _base_changed(rope, base_rope) else ""
    if kind == "linear":
        return f"--rope-scaling linear --rope-scale {_number(rope['factor'])} {base}-c {window}", ""
    if kind == "default":
        if rope.get("partial_rotary_factor") not in (None, 1.0):
            return None, "llama.cpp takes the rotary width from the GGUF"
        return f"--rope-freq-base {_number(rope['rope_theta'])} -c {window}", ""
    if kind == "yarn":
        factor = float(rope["factor"])
        default_attention = 0.1 * math.log(factor) + 1.0
        if (float(rope.get("beta_fast") or 32) == 32 and float(rope.get("beta_slow") or 1) == 1
                and rope.get("truncate", True) and not rope.get("mscale") and not rope.get("mscale_all_dim")
                and abs(float(rope.get("attention_factor") or default_attention) - default_attention) < 1e-9):
            return (f"--rope-scaling yarn --rope-scale {_number(factor)} --yarn-orig-ctx "
                    f"{rope['original_max_position_embeddings']} {base}-c {window}"), ""
        return None, "llama.cpp's YaRN flags set only the default ramp and attention factor"
    return None, f"llama.cpp has no flag computing rope type '{kind}' (it needs per-pair frequencies in the file)"


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).strip()


def card_body(out: Path, saved: dict[str, Any], *, method: str, params: dict[str, Any], original: int,
              note: str, legacy_why: str, base_model: str | None, source_gguf: str | None,
              evaluation: dict[str, Any] | None, evidence: dict[str, Any] | None = None) -> str:
    """The card's text (Markdown) for the export in ``out`` (the directory being built) whose config.json is
    ``saved``; ``evidence`` (:func:`evidence_markdown`) adds the comparison the method was chosen by."""
    rope = saved.get("rope_parameters") or {}
    window = int(saved.get("max_position_embeddings") or 0)
    record = saved.get("ropekit") or {}
    base_rope = (record.get("base") or {}).get("rope_parameters") or {}
    frozen = (record.get("export") or {}).get("freeze_length")
    effective = max(window, int(frozen or 0))
    if rope.get("rope_type") == "dynamic":  # transformers' dynamic reads max_position_embeddings as the original
        effective = int(math.ceil(window * float(rope.get("factor", 1.0))))
    # the title names the model, not the directory: a card must not change when its directory is renamed or moved
    lines = [f"# {base_model or source_gguf or 'A model'} with {method} context extension", "",
             f"Extended with [ropekit](https://pypi.org/project/ropekit/) using **{method}** "
             f"({', '.join(f'{k}={v}' for k, v in params.items() if v is not None) or 'defaults'}).", "",
             "| | |", "|---|---|",
             f"| base model | {base_model or 'not recorded'} |",
             f"| original window | {original:,} tokens |",
             f"| effective window | {effective:,} tokens |",
             f"| rope type in config.json | `{rope.get('rope_type', 'per layer type')}` |"]
    if evaluation:
        lines += ["", "## Evaluation", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in evaluation.items()]
    if evidence:
        lines += ["", evidence_markdown(evidence)]
    lines += ["", "## How ropekit wrote it", "", note, "", "## The same model in each stack", ""]
    lines += ["**transformers 5.x** — `AutoModelForCausalLM.from_pretrained(DIR)` reads `rope_parameters`:", "",
              "```json", json.dumps({"rope_parameters": rope, "max_position_embeddings": window}, indent=1), "```", ""]
    if legacy_why:
        lines += [f"**transformers 4.x** — not the same model: {legacy_why}.", ""]
    else:
        legacy = {k: saved[k] for k in ("rope_scaling", "rope_theta", "rope_local_base_freq", "partial_rotary_factor",
                                         "rotary_pct", "rotary_emb_base", "original_max_position_embeddings") if k in saved}
        releases, earlier = legacy_releases(rope)
        lines += [f"**transformers {releases}** (and the stacks pinned to it) — config.json also carries 4.x's names, "
                  "the same numbers; `from_pretrained(DIR)` needs no flags" + (f" ({earlier})" if earlier else "") + ":", "",
                  "```json", json.dumps(legacy, indent=1), "```", ""]
    plan = vllm_serving(out)
    if plan.exact:
        lines += ["**vLLM** — this directory as it is:", "", "```bash", plan.command.replace(str(out), "DIR"), "```", ""]
        if plan.note:
            lines += [f"({plan.note}.)", ""]
        if not plan.env:
            # the plan's rope dict where vLLM must read another one (DeepSeek's mscale, yarn's attn_factor)
            served = plan.hf_overrides.get("rope_parameters", rope)
            overrides = json.dumps({"rope_parameters": served, "max_position_embeddings": window}, separators=(",", ":"))
            lines += ["the original model with the same RoPE (the weights are the original's):", "", "```bash",
                      f"vllm serve {base_model or 'ORIGINAL_MODEL_ID'} --max-model-len {plan.max_model_len} "
                      f"--hf-overrides '{overrides}'", "```", ""]
    else:
        lines += [f"**vLLM** — not the same model: {plan.why}.", ""]
    flags, why = _llamacpp_flags(rope, window, base_rope)
    if flags:
        model = source_gguf or "ORIGINAL.gguf"
        lines += ["**llama.cpp** — the original GGUF with these flags:", "", "```bash",
                  f"llama-server -m {model} {flags}", "```", ""]
    else:
        from .gguf_export import ARCHITECTURES, PER_PAIR_ARCHITECTURES

        arch = ARCHITECTURES.get(str(saved.get("model_type", "")))
        if arch is not None and arch not in PER_PAIR_ARCHITECTURES:  # its graph reads no rope_freqs tensor either
            lines += [f"**llama.cpp** — not the same model: {why}, and llama.cpp's {arch} graph reads no per-pair "
                      "frequencies from a GGUF; serve this directory with vLLM or transformers.", ""]
        else:
            lines += [f"**llama.cpp** — {why}: write the GGUF with `ropekit export DIR --format gguf`.", ""]
    lines += ["**LLaMA-Factory** — train from this directory with its `rope_scaling` option left unset (the "
              "config carries the scaling; the option would rescale it again):", "", "```yaml",
              _yaml({"model_name_or_path": "DIR", "cutoff_len": window}), "```", ""]
    if (rope.get("rope_type") == "linear" and float(rope["factor"]).is_integer() and not _base_changed(rope, base_rope)
            and base_rope.get("rope_type", "default") == "default"):
        lines += ["or from the original model with its own option (a whole linear factor, which it computes as "
                  "model_max_length / max_position_embeddings):", "", "```yaml",
                  _yaml({"model_name_or_path": base_model or "ORIGINAL_MODEL_ID", "rope_scaling": "linear",
                         "model_max_length": window, "cutoff_len": window}), "```", ""]
    lines += ["**axolotl** — `base_model` is loaded with transformers, which reads the scaling from this directory:",
              "", "```yaml", _yaml({"base_model": "DIR", "sequence_len": window}), "```", ""]
    return "\n".join(lines)


#: The evidence section's bounds in the card, so that it can be replaced once more is known (an engine's verdict).
EVIDENCE_START, EVIDENCE_END = "<!-- ropekit:evidence -->", "<!-- /ropekit:evidence -->"


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def evidence_markdown(evidence: dict[str, Any]) -> str:
    """The card's evidence section: ``title``, ``intro`` (paragraphs), a table (``columns``, ``rows``) and ``notes``
    (paragraphs), between :data:`EVIDENCE_START` and :data:`EVIDENCE_END`."""
    lines = [EVIDENCE_START, f"## {evidence.get('title', 'Evidence')}", ""]
    for paragraph in evidence.get("intro", []):
        lines += [paragraph, ""]
    columns = evidence.get("columns") or []
    if columns:
        lines += ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in evidence.get("rows", [])]
        lines.append("")
    for paragraph in evidence.get("notes", []):
        lines += [paragraph, ""]
    lines.append(EVIDENCE_END)
    return "\n".join(lines)


def replace_evidence(out: Path, evidence: dict[str, Any]) -> None:
    """Rewrite the evidence section of the card in ``out`` (``README.md`` through huggingface_hub's ``ModelCard``,
    and ``ROPEKIT.md``); the rest of the card stays as :func:`card_body` wrote it."""
    from huggingface_hub import ModelCard

    section = evidence_markdown(evidence)

    def swap(text: str) -> str:
        start, end = text.find(EVIDENCE_START), text.find(EVIDENCE_END)
        if start < 0 or end < 0:
            raise ValueError(f"the card in '{out}' has no evidence section")
        return text[:start] + section + text[end + len(EVIDENCE_END):]

    card = ModelCard.load(out / "README.md")
    card.text = swap(card.text)
    card.save(out / "README.md")
    ropekit_md = out / "ROPEKIT.md"
    ropekit_md.write_text(swap(ropekit_md.read_text()))


def write_card(out: Path, body: str, *, method: str, base_model: str | None) -> None:
    """``README.md`` (huggingface_hub's ``ModelCard``: metadata header, then ``body``) and ``ROPEKIT.md`` (the body)."""
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(library_name="transformers", base_model=base_model,
                         tags=["ropekit", "long-context", f"rope-{method.replace('_', '-')}"])
    ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}\n").save(out / "README.md")
    (out / "ROPEKIT.md").write_text(body + "\n")
