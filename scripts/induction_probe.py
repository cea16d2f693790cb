"""Can the built-in base model learn to copy within its pre-training budget? A probe, not part of ropekit.

Without a copy curriculum the quick study's base model (:mod:`ropekit.train.builtin_base`) did not retrieve
passkeys even inside its 256-token window: copying the key needs an induction head (a previous-token head
in one layer whose output a later head matches against the current token; Olsson et al. 2022), and that
circuit did not form in a 5-minute budget of natural text. This script trains the same architecture on the same tokenizer and text with a
chosen data curriculum and prints, every ``--every`` steps, one JSON line:

* ``loss``: mean training loss of the last 20 steps (whatever the batch held);
* ``text_loss``: loss on 16 windows of held-out standard-library text (never trained on);
* ``copy_loss``: loss on the second half of 16 held-out rows that repeat a random span of
  ``--alphabet`` tokens (ln(alphabet) = no copying, 0 = perfect copying);
* ``passkey``: fraction of 40 in-window passkey prompts (2–24 filler sentences, the evaluation's exact
  template) whose whole answer is the teacher-forced argmax, and ``passkey_digits``: the same per digit
  after the first (chance ≈ 0.1);
* one entry per RULER task of ``--ruler-tasks`` and ``--ruler-eval``: the fraction of 30 of the evaluation's own
  prompts at the window (:mod:`ropekit.eval.ruler`, 10 tokens left for the answer) whose whole answer is the
  teacher-forced argmax.

The batches are :class:`ropekit.train.builtin_base.Curriculum`'s, with its phases and mix set from the
command line (defaults: the shipped base model's settings). ``--trigram-until 0 --copy-until 0`` is the
earlier recipe without the copy curriculum.

Examples (2-core CPU, about 0.32 s per step on two threads)::

    python scripts/induction_probe.py                                      # the shipped recipe
    python scripts/induction_probe.py --steps 700 --lr 2e-3 --trigram-until 0 --copy-until 0 --copy-rows 0
    python scripts/induction_probe.py --steps 900 --trigram-until 99 --copy-until 450   # the 2026-11-22 recipe
    python scripts/induction_probe.py --every 300 --ruler-tasks niah_single_1:1,niah_single_2:1,niah_multikey_1:1,vt:1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time

import torch

from ropekit.data.local_text import stdlib_documents
from ropekit.data.passkey_text import KEY_RANGE, build_prompt
from ropekit.data.ruler.tasks import TASKS
from ropekit.eval.ruler import Plan, Renderer
from ropekit.models.tiny import build_tiny_model
from ropekit.runtime import deterministic
from ropekit.train.builtin_base import (
    SETTINGS,
    _settings,
    learning_rate,
    ruler_answer,
    training_data,
)
from ropekit.train.pretrain import pretrain_step


def parse_args() -> argparse.Namespace:
    plan = SETTINGS["curriculum"]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=SETTINGS["steps"])
    p.add_argument("--lr", type=float, default=SETTINGS["lr"])
    p.add_argument("--trigram-until", type=int, default=plan["trigram_until"], help="step where the trigram phase ends")
    p.add_argument("--copy-until", type=int, default=plan["copy_until"], help="step where the copy phase ends")
    p.add_argument("--warmup", type=int, default=SETTINGS["warmup"], help="warm-up steps")
    p.add_argument("--retrieval-rows", type=int, default=SETTINGS["retrieval_rows"],
                   help="rows of each text-phase batch packed with passkey and RULER-format documents")
    p.add_argument("--copy-rows", type=int, default=plan["copy_rows"], help="copy rows in each phase-3 batch")
    p.add_argument("--passkey-share", type=float, default=SETTINGS["passkey_share"],
                   help="share of retrieval documents that are passkey prompts (the rest: RULER prompts)")
    p.add_argument("--ruler-tasks", default=",".join(f"{t}:{w}" for t, w in SETTINGS["ruler_tasks"].items()),
                   help="RULER tasks pre-trained on, with their weights: niah_single_1:1,vt:2 ('' for none)")
    p.add_argument("--ruler-eval", default="", help="further RULER tasks to measure, not trained on: niah_multikey_1,vt")
    p.add_argument("--alphabet", type=int, default=plan["alphabet"])
    p.add_argument("--span", default=",".join(map(str, plan["span"])), help="min,max span length of copy rows")
    p.add_argument("--train-bytes", type=int, default=SETTINGS["train_bytes"], help="bytes of the training split used")
    p.add_argument("--seed", type=int, default=0, help="the base model's seed (tokenizer data, init, batches)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--every", type=int, default=50)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    settings, texts = _settings(args.seed, args.steps, train_bytes=args.train_bytes)
    ruler_tasks = {t.split(":")[0]: float(t.split(":")[1]) for t in args.ruler_tasks.split(",") if t}
    settings.update(lr=args.lr, warmup=args.warmup, retrieval_rows=args.retrieval_rows, curriculum={
        "trigram_until": args.trigram_until, "copy_until": args.copy_until, "copy_rows": args.copy_rows,
        "alphabet": args.alphabet, "span": [int(v) for v in args.span.split(",")]},
        passkey_share=args.passkey_share, ruler_tasks=ruler_tasks)
    window = settings["window"]
    tok, curriculum = training_data(settings, texts, args.seed)  # the base model's own tokenizer and data
    eos, vocab = tok.eos_token_id, len(tok)
    alphabet = curriculum.alphabet

    held_out_text = [i for d in tok([d.decode("ascii") for d in stdlib_documents(200_000, "heldout")]).input_ids
                     for i in d + [eos]]
    text_eval = torch.tensor(held_out_text[:16 * window]).view(16, window)
    held_out = torch.Generator().manual_seed(123)
    spans = [alphabet[torch.randperm(len(alphabet), generator=held_out)] for _ in range(16)]
    copy_eval = torch.stack([torch.cat([s, s]) for s in spans])
    prompt_rng = random.Random(99)
    passkey_eval = []
    for _ in range(40):
        key, n = prompt_rng.randint(*KEY_RANGE), prompt_rng.randint(2, 24)
        prompt = build_prompt(n, prompt_rng.randint(0, n), key)
        ids = tok(prompt).input_ids
        passkey_eval.append((ids, tok(prompt + f" {key}.").input_ids[len(ids):-1]))
    ruler_eval = {}  # the evaluation's prompts at the window, each with its answer as a training document ends
    renderer = Renderer(tok, chat=False)
    for task in list(ruler_tasks) + [t for t in args.ruler_eval.split(",") if t and t not in ruler_tasks]:
        plan = Plan(dataclasses.replace(TASKS[task], tokens_to_generate=10), window, renderer, 0)
        samples = [plan.sample(i) for i in range(30)]
        ruler_eval[task] = [(s.ids, tok(s.text + ruler_answer(TASKS[task].family, s.references)).input_ids[len(s.ids):])
                            for s in samples]

    @torch.no_grad()
    def measure(model) -> dict[str, float]:
        model.eval()
        half = copy_eval.shape[1] // 2
        logits = model(input_ids=copy_eval).logits[:, half:-1]
        copy_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), copy_eval[:, half + 1:].reshape(-1))
        text_loss = model(input_ids=text_eval, labels=text_eval).loss
        whole = digits = n_digits = 0
        for ids, answer in passkey_eval:
            pred = model(input_ids=torch.tensor([ids + answer])).logits[0, len(ids) - 1:-1].argmax(-1).tolist()
            whole += pred == answer
            digits += sum(p == a for p, a in zip(pred[1:], answer[1:]))
            n_digits += len(answer) - 1
        ruler = {}
        for task, items in ruler_eval.items():
            hits = 0
            for ids, answer in items:
                pred = model(input_ids=torch.tensor([ids + answer])).logits[0, len(ids) - 1:-1].argmax(-1).tolist()
                hits += pred == answer
            ruler[task] = round(hits / len(items), 3)
        model.train()
        return {"text_loss": round(text_loss.item(), 3), "copy_loss": round(copy_loss.item(), 3), "passkey": whole / len(passkey_eval),
                "passkey_digits": round(digits / n_digits, 3), **ruler}

    with deterministic(args.threads):
        model = build_tiny_model("llama", seed=args.seed, vocab_size=vocab, window=window, **settings["model"])
        model.train()
        gen = torch.Generator().manual_seed(args.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
        started, losses = time.perf_counter(), []
        for step in range(args.steps):
            ids = curriculum.batch(step, gen)
            losses.append(pretrain_step(model, opt, ids, learning_rate(step, settings),
                                        attention_mask=torch.ones_like(ids)))
            if (step + 1) % args.every == 0 or step + 1 == args.steps:
                recent = sum(losses[-20:]) / len(losses[-20:])
                print(json.dumps({"step": step + 1, "phase": curriculum.phase(step), "loss": round(recent, 3),
                                  **measure(model), "seconds": round(time.perf_counter() - started)}), flush=True)


if __name__ == "__main__":
    main()
