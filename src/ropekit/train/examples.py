"""Ready training configs, printed by ``ropekit train --example NAME`` (``--example list`` names them).

The ``tiny-*`` examples run on a laptop CPU in minutes: the built-in tiny Llama (64-token window, byte
vocabulary) and the built-in corpus (the training split of the Python-stdlib text, see
:mod:`ropekit.data.local_text`). ``model: tiny`` is randomly initialised — right for trying the machinery
and for tests; ``model: tiny-pretrained`` is the demo's model pre-trained at its window (trained and cached
on first use, about a minute), which is what a context-extension run should start from. Their settings are
the papers' recipes scaled to a 64-token model (noted per example). GPU recipes for 7B models are in
``configs/train/``.
"""

from __future__ import annotations

from ..errors import RopekitError

_TINY_FULL = """\
# tiny-full: extend the tiny Llama from its 64-token window to 256 tokens (4x) with YaRN and train at the
# full target length on the built-in corpus (the YaRN/LCEG recipe: install the method, then fine-tune on
# sequences of the target length; lr and steps scaled to a 64-token model).
model:
  name: tiny                 # tiny-pretrained: the demo's pre-trained tiny Llama (cached; ~1 min the first time)
  dtype: float32
  gradient_checkpointing: auto   # on when a step would not fit in the free memory
method:
  name: yarn
  params:
    factor: 4
    beta_fast: 4             # the paper's 32 is meant for 4k windows; a 64-token window has ~10 rotations
    beta_slow: 1
data:
  seq_len: 256               # the target length: full-length training
  sources:
    - path: builtin          # Python-stdlib text, training split
      max_documents: 100     # ~1.4M tokens: plenty for a few hundred tiny steps, quick to tokenise
train:
  max_steps: 200
  lr: 1.0e-3
  betas: [0.9, 0.95]
  weight_decay: 0.01
  warmup_steps: 10
  schedule: cosine
  min_lr_ratio: 0.1
  micro_batch_size: 4
  grad_accum: 1
  max_grad_norm: 1.0
  precision: fp32
  seed: 0
output:
  dir: runs/tiny-full
  save_every: 50
  keep_last: 2
  log_every: 20
"""

_TINY_POSE = """\
# tiny-pose: PoSE (PoSE, Zhu et al. 2024) - train at the original 64-token window while the position ids span the
# 256-token target: two chunks per sequence, the second shifted by a skip drawn anew at every step, so
# every relative distance up to the target is seen without ever running a 256-token forward. YaRN s=4
# supplies the frequencies (PoSE composes with PI/NTK/YaRN; linear interpolation is the paper's default, §4.1).
model:
  name: tiny
method:
  name: yarn
  params: {factor: 4, beta_fast: 4, beta_slow: 1}
data:
  seq_len: 64                # the training window L_c = the model's window
  sources:
    - path: builtin
      max_documents: 100
  pose:
    target_length: 256       # L_t: position ids reach up to 255
    chunks: 2                # the paper's setting
    offset: uniform          # chunk contents: a random, ordered pick from the document (Appendix A)
train:
  max_steps: 200
  lr: 1.0e-3
  weight_decay: 0.01
  warmup_steps: 10
  schedule: cosine
  min_lr_ratio: 0.1
  micro_batch_size: 8
  seed: 0
output:
  dir: runs/tiny-pose
  save_every: 50
  log_every: 20
"""

_TINY_LONGLORA = """\
# tiny-longlora: LongLoRA (Chen et al. 2024) - PI s=4 frequencies, S2-Attn (shifted groups of 1/4 of the
# sequence) while training, LoRA r=8 alpha=16 on q/k/v/o plus fully trainable embeddings and norms
# ("LoRA+"). The exported model has the adapters merged and uses full attention (plain PI: rope_type linear).
model:
  name: tiny
method:
  name: longlora
  params: {factor: 4, group_size_ratio: 0.25}
data:
  seq_len: 256
  sources:
    - path: builtin
      max_documents: 100
train:
  max_steps: 200
  lr: 2.0e-3                 # the recipe's 2e-5 is for a 7B model; adapters on a tiny model need more
  warmup_steps: 10           # the recipe: constant with 20 warm-up steps (of 1000)
  schedule: constant
  micro_batch_size: 4
  seed: 0
  lora:
    r: 8
    alpha: 16
    dropout: 0.0
    target_modules: [q_proj, k_proj, v_proj, o_proj]
    trainable: [embed, norm]
output:
  dir: runs/tiny-longlora
  save_every: 50
  log_every: 20
"""

_TINY_CLEX = """\
# tiny-clex: CLEX (Chen et al. 2024; LCEG (Lu et al. 2024) uses max scale 32 and SiLU on Llama-2) - the frequencies
# are a learned ODE in the scale t; every step draws t from 1..max_factor and spreads the sequence's positions
# over t times its length, so a short sequence trains the frequencies of a long one. At inference t = n/64.
# Trained at 2x the window: the reference divides the positions by floor(n/window), so they span 64*t.
model:
  name: tiny                 # tiny-pretrained: the demo's pre-trained tiny Llama (cached; ~1 min the first time)
method:
  name: clex
  params:
    max_factor: 4            # serves up to 4 x 64 = 256 tokens (longer inputs reuse t = 4)
    act: silu
    time_dt: 0.01            # the reference's RK4 step
data:
  seq_len: 128
  sources:
    - path: builtin
      max_documents: 100
train:
  max_steps: 200
  lr: 1.0e-3
  weight_decay: 0.01
  warmup_steps: 10
  schedule: cosine
  min_lr_ratio: 0.1
  micro_batch_size: 4
  seed: 0
output:
  dir: runs/tiny-clex
  save_every: 50
  log_every: 20
"""

_TINY_SFT = """\
# tiny-sft: supervised fine-tuning on long conversations at 4x the window (Entropy-ABF, Entropy-ABF (Zhang et al. 2024) §4.1:
# loss on assistant turns only; conversations longer than seq_len are split at turn boundaries).
# conversations.jsonl holds one conversation per line: {"messages": [{"role": "user", "content": ...},
# {"role": "assistant", "content": ...}, ...]} (or ShareGPT's {"conversations": [{"from", "value"}]}).
model:
  name: tiny
method:
  name: abf
  params: {rope_theta: 200000, factor: 4}
data:
  seq_len: 256
  sources:
    - path: conversations.jsonl
      kind: sft
  packing:
    pack_sft: true           # several whole conversations per row, each attending only to itself
    document_mask: true
    reset_positions: true
train:
  max_steps: 100
  lr: 5.0e-4
  warmup_steps: 5
  schedule: linear
  micro_batch_size: 4
  seed: 0
output:
  dir: runs/tiny-sft
  log_every: 10
"""

_ABF_CURRICULUM = """\
# abf-curriculum: multi-stage ABF, the curriculum of HARPE (Lian et al. 2025) (HARPE §4.2 "ABF Multi-Stage": base 1M at
# 32k -> 2M at 64k -> 5M at 128k on Llama-2-7B, i.e. 8x -> 16x -> 32x its 4k window), scaled to the tiny
# model: 2x -> 4x -> 8x its 64-token window with bases 1e5 -> 2e5 -> 5e5 (the paper's 1 : 2 : 5 ratios).
# Each stage re-installs ABF with its base and restarts the warm-up; Adam moments carry over.
# The 7B original: configs/train/llama2-7b-abf-3stage.yaml.
model:
  name: tiny
method:
  name: abf
  params: {rope_theta: 100000, factor: 2}
data:
  seq_len: 128
  sources:
    - path: builtin
      max_documents: 100
train:
  lr: 1.0e-3
  warmup_steps: 5
  schedule: constant
  micro_batch_size: 4
  seed: 0
output:
  dir: runs/abf-curriculum
  save_every: 50
  log_every: 20
stages:
  - name: 2x
    steps: 100
    seq_len: 128
    method: {params: {rope_theta: 100000, factor: 2}}
  - name: 4x
    steps: 100
    seq_len: 256
    method: {params: {rope_theta: 200000, factor: 4}}
    micro_batch_size: 2      # tokens per step stay constant (4 x 128 = 2 x 256 = 1 x 512)
  - name: 8x
    steps: 50
    seq_len: 512
    method: {params: {rope_theta: 500000, factor: 8}}
    micro_batch_size: 1
"""

#: name → (one-line description, YAML text)
EXAMPLES: dict[str, tuple[str, str]] = {
    "tiny-full": ("tiny Llama 64 → 256 tokens: YaRN s=4, full-length training on the built-in corpus", _TINY_FULL),
    "tiny-pose": ("tiny Llama 64 → 256 tokens: YaRN s=4 trained with PoSE at the 64-token window", _TINY_POSE),
    "tiny-longlora": ("tiny Llama 64 → 256 tokens: LongLoRA (PI + S²-Attn, LoRA + embeddings/norms)", _TINY_LONGLORA),
    "tiny-clex": ("tiny Llama 64 → 256 tokens: CLEX (learned ODE frequencies, scale drawn per step)", _TINY_CLEX),
    "tiny-sft": ("tiny Llama, ABF, SFT on your long conversations (loss on assistant turns only)", _TINY_SFT),
    "abf-curriculum": ("tiny Llama, 3-stage ABF curriculum 2× → 4× → 8× (HARPE's (Lian et al. 2025) multi-stage ABF, scaled)", _ABF_CURRICULUM),
}


def example_names() -> list[str]:
    return list(EXAMPLES)


def example_yaml(name: str) -> str:
    """The YAML text of example ``name``; an unknown name is a one-line error listing the names."""
    key = name.strip().lower()
    if key not in EXAMPLES:
        import difflib

        close = difflib.get_close_matches(key, EXAMPLES, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise RopekitError(f"unknown example '{name}'", f"{hint}choose one of {', '.join(EXAMPLES)} (or --example list)")
    return EXAMPLES[key][1]
