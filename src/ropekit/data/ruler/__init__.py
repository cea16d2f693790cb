"""RULER's task text (Hsieh et al. 2024, arXiv:2404.06654): the templates, answer prefixes and sample
generators of its 13 synthetic tasks (:mod:`.tasks`) and the local SQuAD/HotpotQA readers of qa_1/qa_2
(:mod:`.qa_data`).

They are data, not evaluation: :mod:`ropekit.eval.ruler` fits and scores the samples, and the built-in base
model's pre-training (:mod:`ropekit.train.builtin_base`) draws its RULER-format retrieval documents from the
same generators, so the model learns the very templates the evaluation asks in — with its own keys, values
and haystack (the training split), never the evaluation's.
"""
