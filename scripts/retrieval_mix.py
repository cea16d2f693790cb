"""Write retrieval documents in the built-in base model's pre-training format as a JSONL training source.

Usage: python scripts/retrieval_mix.py WINDOW OUT.jsonl

Passkey documents (the evaluation's prompt with the answer after it, up to WINDOW/8 filler sentences) and
RULER single-needle documents (niah_single_1/2 in RULER's base template, the training split as haystack),
1,200 and 600 + 600 of them, seeded by WINDOW, shuffled: the retrieval rows of
:mod:`ropekit.train.builtin_base`'s curriculum at another length, for probing fine-tuning recipes
(docs/results/fine-tune-budget/).
"""

import json
import random
import sys

from ropekit.models.loading import load_model
from ropekit.train.builtin_base import SETTINGS, _settings, base_model_path, passkey_document, ruler_documents


def main() -> None:
    window, out = int(sys.argv[1]), sys.argv[2]
    tokenizer = load_model(str(base_model_path(0))).tokenizer
    rng = random.Random(f"finetune-retrieval|{window}")
    _, texts = _settings(0, None)
    essay_words = " ".join(texts).split()
    documents = [passkey_document(rng, max_sentences=window // 8) for _ in range(1200)]
    for task in SETTINGS["ruler_tasks"]:
        documents += [tokenizer.decode(ids) for ids in ruler_documents(task, tokenizer, window, 600, rng, essay_words)]
    rng.shuffle(documents)
    with open(out, "w") as f:
        for text in documents:
            f.write(json.dumps({"text": text}) + "\n")
    print(f"{len(documents)} documents → {out}")


if __name__ == "__main__":
    main()
