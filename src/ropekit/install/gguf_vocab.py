"""A transformers fast tokenizer as llama.cpp's GGUF vocabulary, through the ``gguf`` package's own classes.

llama.cpp tokenizes with one of a few built-in algorithms, chosen by two keys: ``tokenizer.ggml.model`` (``gpt2``:
byte-level BPE driven by the merge list; ``llama``: SentencePiece-style BPE driven by per-token scores, with byte
fallback) and ``tokenizer.ggml.pre`` (which split regex runs before a ``gpt2`` BPE). llama.cpp's converter,
``convert_hf_to_gguf.py``, picks ``pre`` by tokenizing a fixed probe text and looking the hash of the ids up in a
table of known checkpoints; a small or retrained vocabulary has no entry there. ropekit reads the tokenizer's own
pipeline in ``tokenizer.json`` instead, and accepts only pipelines that llama.cpp runs the same way:

* byte-level BPE (``model.type = BPE`` without byte fallback, ``ByteLevel`` decoder), ``tokenizer.ggml.model gpt2``:

  - ``ByteLevel`` with its own (GPT-2) regex: ``gpt-2``;
  - ``Digits(individual_digits)`` then GPT-2's ``ByteLevel``: ``smollm``;
  - ``Split`` with Llama 3's regex (digits in runs of up to 3) then ``ByteLevel`` without regex: ``llama-bpe``
    (Llama 3, 3.1, 3.2, 3.3);
  - ``Split`` with Qwen2's regex (single digits), optionally after an ``NFC`` normalizer: ``qwen2`` (Qwen2, Qwen2.5,
    Qwen3);
  - ``Split`` with Tekken's regex (Mistral NeMo and later): ``tekken``;

  where llama.cpp's ``src/llama-vocab.cpp`` sets ``ignore_merges`` for ``llama-bpe`` and ``tekken`` (a pre-token
  found whole in the vocabulary is taken as is), the tokenizer's own ``ignore_merges`` must agree;
* SentencePiece-style BPE (``model.type = BPE`` with ``byte_fallback``; pieces spell spaces as ``▁``),
  ``tokenizer.ggml.model llama``, ``pre default``: with a leading ``▁`` added (``Metaspace`` prepending to the first
  section, or the older ``Prepend("▁")`` + ``Replace(" ", "▁")`` normalizer: Llama 2, Mistral 7B v0.1–v0.3,
  Mixtral), ``tokenizer.ggml.add_space_prefix true``; without one (``Replace(" ", "▁")`` alone, as Gemma 1–3),
  ``false``.

Everything else (WordPiece, Unigram, other regexes, other normalizers) is refused in one line naming llama.cpp's
converter. The tokens and their types come from ``gguf.vocab.BpeVocab`` and ``gguf.vocab.LlamaHfVocab`` run on the
tokenizer saved to a temporary directory; merges, special token ids and the chat template from
``gguf.vocab.SpecialVocab``. Two things are set from the tokenizer itself rather than taken from those classes:
whether BOS/EOS are added (the tokenizer is asked, as its ``tokenizer.json``/``tokenizer_config.json`` can disagree),
and, for the SentencePiece style, the scores. ``LlamaHfVocab`` gives every token -1000, and llama.cpp's SentencePiece
tokenizer merges the adjacent pair whose joined piece has the highest score, so equal scores merge left to right. A
SentencePiece BPE model scores each piece by the order it was learned in, and transformers' converter turns those
scores into the merge list (``SentencePieceExtractor``); the inverse is used here: a piece first made by merge ``k``
scores ``−k``, so llama.cpp's choice follows the merge list's ranks.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UnsupportedModelError

#: Where a tokenizer ropekit refuses can still go.
CONVERTER = "convert it with llama.cpp's convert_hf_to_gguf.py (it identifies known checkpoints' tokenizers)"

# The split regexes as they stand in the checkpoints' tokenizer.json (Split pre-tokenizer, behavior Isolated).
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

#: ``tokenizer.ggml.pre`` per split regex, with the ``ignore_merges`` llama.cpp uses for it and the normalizers
#: allowed before it (Qwen2's NFC: llama.cpp does not normalize, so the two agree on NFC text, which is what
#: nearly all text is).
_SPLIT_PRE = {
    _LLAMA3_REGEX: ("llama-bpe", True, (None,)),
    _QWEN2_REGEX: ("qwen2", False, (None, "NFC")),
    _TEKKEN_REGEX: ("tekken", True, (None,)),
}

#: What ropekit writes, for the README and the refusal.
SUPPORTED = ("byte-level BPE with the pre-tokenizer of GPT-2, SmolLM, Llama 3, Qwen2/Qwen3 or Tekken (Mistral NeMo), "
             "and SentencePiece-style BPE with byte fallback (Llama 2, Mistral 7B/Mixtral, Gemma)")


@dataclass
class GGUFVocab:
    """Tokenizer metadata for a GGUF: ``keys`` as ``(key, value, GGUFValueType, sub type)`` written with
    ``GGUFWriter.add_key_value``, then ``special`` (a ``gguf.SpecialVocab``) written with its own ``add_to_gguf``.
    ``source`` says how it was obtained."""

    source: str
    keys: list[tuple[str, Any, Any, Any]]
    special: Any = None
    model: str = "none"
    pre: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def write(self, writer) -> None:
        for key, value, vtype, sub in self.keys:
            writer.add_key_value(key, value, vtype, sub_type=sub)
        if self.special is not None:
            with _quiet_gguf():
                self.special.add_to_gguf(writer, quiet=True)


class _quiet_gguf:
    """gguf.vocab reports through `logging`; without a handler its warnings would reach stderr."""

    def __enter__(self):
        self.logger = logging.getLogger("gguf")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)


def _refuse(what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"GGUF export writes {SUPPORTED}; this tokenizer is {what}", CONVERTER)


def _kinds(part: dict | None) -> list[dict]:
    if not part:
        return []
    if part.get("type") != "Sequence":
        return [part]
    return list(part.get("pretokenizers") or part.get("normalizers") or [])


def _regex(split: dict) -> str | None:
    pattern = split.get("pattern") or {}
    return pattern.get("Regex")


def byte_level_pre(spec: dict) -> str:
    """llama.cpp's ``tokenizer.ggml.pre`` for a byte-level BPE ``tokenizer.json`` (as a dict), or a one-line refusal."""
    normalizer = spec.get("normalizer")
    normalizer_kinds = [n.get("type") for n in _kinds(normalizer)]
    parts = _kinds(spec.get("pre_tokenizer"))
    kinds = [p.get("type") for p in parts]
    ignore_merges = bool((spec.get("model") or {}).get("ignore_merges", False))
    pre, allowed_normalizers, wants_ignore = None, (None,), False
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        pre = "gpt-2"
    elif (kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits")
          and parts[1].get("use_regex", True)):
        pre = "smollm"
    elif (kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True)
          and str(parts[0].get("behavior", "")).lower() == "isolated" and not parts[0].get("invert", False)):
        found = _SPLIT_PRE.get(_regex(parts[0]) or "")
        if found is None:
            raise _refuse(f"a byte-level BPE whose split regex {(_regex(parts[0]) or '')[:60]!r}… is not one of them")
        pre, wants_ignore, allowed_normalizers = found
    if pre is None:
        raise _refuse(f"a byte-level BPE with the pre-tokenizer {'+'.join(map(str, kinds)) or 'none'}")
    normalizer_kind = "+".join(map(str, normalizer_kinds)) or None
    if normalizer_kind not in allowed_normalizers:
        raise _refuse(f"a byte-level BPE ({pre}) with the normalizer {normalizer_kind}, which llama.cpp does not apply")
    if ignore_merges != wants_ignore:
        raise _refuse(f"a byte-level BPE ({pre}) with ignore_merges {str(ignore_merges).lower()}, where llama.cpp's "
                      f"{pre} uses {str(wants_ignore).lower()}")
    return pre


def sentencepiece_space_prefix(spec: dict) -> bool:
    """Whether a SentencePiece-style ``tokenizer.json`` puts ``▁`` before the text (llama.cpp's
    ``add_space_prefix``), or a one-line refusal for a pipeline llama.cpp's ``llama`` tokenizer does not reproduce."""
    norms = _kinds(spec.get("normalizer"))
    pres = _kinds(spec.get("pre_tokenizer"))

    def is_replace_space(n: dict) -> bool:
        return (n.get("type") == "Replace" and (n.get("pattern") or {}).get("String") == " "
                and n.get("content") == "▁")

    no_split = not pres or (len(pres) == 1 and pres[0].get("type") == "Split"
                            and (pres[0].get("pattern") or {}).get("String") == " ")  # no spaces left to split on
    if len(norms) == 2 and norms[0].get("type") == "Prepend" and norms[0].get("prepend") == "▁" \
            and is_replace_space(norms[1]) and not pres:
        return True  # the older Llama 2 / Mistral form
    if len(norms) == 1 and is_replace_space(norms[0]) and no_split:
        return False  # Gemma
    if not norms and len(pres) == 1 and pres[0].get("type") == "Metaspace" and pres[0].get("replacement") == "▁":
        scheme = pres[0].get("prepend_scheme", "always" if pres[0].get("add_prefix_space", True) else "never")
        if pres[0].get("split", True):
            inner = [t for t in (spec.get("model") or {}).get("vocab", {}) if "▁" in t[1:]]
            if inner:  # llama.cpp does not split at ▁, so pieces that span one would be used where HF cannot
                raise _refuse(f"a SentencePiece-style BPE that splits at ▁ although pieces such as {inner[0]!r} "
                              "span one")
        if scheme in ("first", "always"):
            return True
        if scheme == "never":
            return False
    described = "+".join(n.get("type", "?") for n in norms) or "no normalizer"
    described += ", " + ("+".join(p.get("type", "?") for p in pres) or "no pre-tokenizer")
    raise _refuse(f"a SentencePiece-style BPE with {described}")


def _merge_pairs(merges: list) -> list[tuple[str, str]]:
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in merges]


def _sentencepiece_scores(tokens: list[bytes], types: list[int], merges: list) -> list[float]:
    """Scores that make llama.cpp's score-driven merging follow the merge list: the piece first made by merge ``k``
    scores ``−k``; control, byte and unknown pieces 0 (as SentencePiece scores them); any other piece below every
    merged one, in id order."""
    import gguf

    rank: dict[str, int] = {}
    for k, (left, right) in enumerate(_merge_pairs(merges)):
        rank.setdefault(left + right, k)
    plain = (int(gguf.TokenType.NORMAL), int(gguf.TokenType.USER_DEFINED))
    scores = []
    for i, (token, kind) in enumerate(zip(tokens, types)):
        text = token.decode("utf-8", errors="replace")
        if text in rank:
            scores.append(-float(rank[text]))
        elif kind in plain:
            scores.append(-float(len(rank) + i))
        else:
            scores.append(0.0)
    return scores


def _probe_adds(tokenizer) -> tuple[bool, bool]:
    """Whether encoding text adds BOS / EOS, asked of the tokenizer itself."""
    probe, bare = tokenizer.encode("a"), tokenizer.encode("a", add_special_tokens=False)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    grew = len(probe) > len(bare)
    return (bool(bos is not None and grew and probe[0] == bos),
            bool(eos is not None and grew and probe[-1] == eos))


def _pad(tokens: list, types: list, scores: list | None, vocab_size: int) -> None:
    import gguf

    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]".encode())
        types.append(int(gguf.TokenType.UNUSED))
        if scores is not None:
            scores.append(-1000.0)


def _beyond_embeddings(tokenizer, spec: dict, vocab_size: int) -> UnsupportedModelError:
    """The refusal for a tokenizer with ids the model has no embedding for, naming those tokens and the class that
    holds them: transformers 5 loads some model types' tokenizers as that type's class whatever
    tokenizer_config.json says (Qwen2, Phi-3: ``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``), and the class may add
    special tokens the saved vocabulary never had."""
    ids = {**(spec.get("model") or {}).get("vocab", {}), **{t["content"]: t["id"] for t in spec.get("added_tokens") or []}}
    beyond = sorted((i, token) for token, i in ids.items() if i >= vocab_size)
    named = ", ".join(f"{token!r} = {i}" for i, token in beyond[:3]) + (" …" if len(beyond) > 3 else "")
    return UnsupportedModelError(
        f"the tokenizer transformers loads for this model ({type(tokenizer).__name__}) has {len(beyond)} token(s) "
        f"beyond the model's {vocab_size} embeddings ({named})",
        "resize the model to its tokenizer before saving (model.resize_token_embeddings(len(tokenizer))), or save it "
        "with a tokenizer whose ids all have embeddings",
    )


def gguf_vocabulary(tokenizer, vocab_size: int) -> GGUFVocab:
    """llama.cpp's vocabulary for ``tokenizer`` (a transformers fast tokenizer) in a model of ``vocab_size``
    embeddings, or a one-line :class:`~ropekit.errors.UnsupportedModelError` (see the module text for which
    tokenizers are written and how)."""
    import gguf

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise UnsupportedModelError(f"tokenizer {type(tokenizer).__name__} is not a fast (tokenizers) tokenizer",
                                    "save the model with a fast tokenizer, or " + CONVERTER)
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    decoder = spec.get("decoder") or {}
    decoders = [d.get("type") for d in _kinds_decoder(decoder)]
    T = gguf.GGUFValueType
    largest = max([*(model.get("vocab") or {}).values(), *(t["id"] for t in spec.get("added_tokens") or [])],
                  default=-1)
    if largest >= vocab_size:
        raise _beyond_embeddings(tokenizer, spec, vocab_size)
    if model.get("type") != "BPE":
        raise _refuse(f"a {model.get('type')} model")
    if not model.get("byte_fallback") and decoders == ["ByteLevel"]:
        if not model.get("merges"):
            ids = {*(model.get("vocab") or {}).values(), *(t["id"] for t in spec.get("added_tokens") or [])}
            if len(ids) != vocab_size:
                raise UnsupportedModelError("a byte-level tokenizer without merges and with fewer tokens than the "
                                            "model has embeddings cannot be written",
                                            "save the model with its own tokenizer")
            # ids are bytes (the tiny models' tokenizer); a GGUF cannot hold the empty merge list gpt2 needs
            return GGUFVocab(source="none (token ids only: a byte-level tokenizer without merges)",
                             keys=[("tokenizer.ggml.model", "none", T.STRING, None)])
        pre = byte_level_pre(spec)
        kind, vocab_class = "gpt2", gguf.vocab.BpeVocab
    elif model.get("byte_fallback") and "ByteFallback" in decoders:
        space_prefix = sentencepiece_space_prefix(spec)
        pre, kind, vocab_class = "default", "llama", gguf.vocab.LlamaHfVocab
    else:
        raise _refuse(f"a BPE with decoder {'+'.join(map(str, decoders)) or 'none'} and byte_fallback "
                      f"{str(bool(model.get('byte_fallback'))).lower()}")

    added_ids = {int(t["id"]): bool(t.get("special")) for t in spec.get("added_tokens") or []}
    with tempfile.TemporaryDirectory(prefix="ropekit-vocab-") as tmp, _quiet_gguf():
        tokenizer.save_pretrained(tmp)
        try:
            source = vocab_class(Path(tmp))
        except (ValueError, KeyError, FileNotFoundError, TypeError) as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0][:80]
            raise _refuse(f"one gguf.vocab.{vocab_class.__name__} cannot read ({reason})") from None
        tokens, types = [], []
        for text, _score, token_type in source.all_tokens():
            text = text if isinstance(text, bytes) else text.encode("utf-8")
            token_type = int(token_type)
            if kind == "gpt2" and len(tokens) in added_ids:
                # BpeVocab makes the added tokens past the BPE vocabulary control tokens and leaves those inside it
                # normal; llama.cpp's converter types every added token by the tokenizer's own flag: control when
                # special, else user-defined (matched whole, printed as text)
                token_type = int(gguf.TokenType.CONTROL if added_ids[len(tokens)] else gguf.TokenType.USER_DEFINED)
            tokens.append(text)
            types.append(token_type)
        special = gguf.SpecialVocab(tmp, load_merges=(kind == "gpt2"), n_vocab=vocab_size)
    misplaced = next((i for i, text in enumerate(tokens) if backend.id_to_token(i) != text.decode("utf-8", "replace")),
                     None)
    if misplaced is not None:  # e.g. added tokens with a gap after the vocabulary, which LlamaHfVocab closes up
        raise _refuse(f"one whose token {misplaced} gguf.vocab.{vocab_class.__name__} lists as "
                      f"{tokens[misplaced][:40]!r}, not {backend.id_to_token(misplaced)!r}")
    if len(tokens) > vocab_size:
        raise UnsupportedModelError(f"the tokenizer has {len(tokens)} tokens, the model only {vocab_size} embeddings",
                                    "save the model with its own tokenizer")
    add_bos, add_eos = _probe_adds(tokenizer)
    special.add_special_token["bos"], special.add_special_token["eos"] = add_bos, add_eos
    keys = [("tokenizer.ggml.model", kind, T.STRING, None), ("tokenizer.ggml.pre", pre, T.STRING, None)]
    if kind == "llama":
        scores = _sentencepiece_scores(tokens, types, model.get("merges") or [])
        _pad(tokens, types, scores, vocab_size)
        keys += [("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING),
                 ("tokenizer.ggml.scores", scores, T.ARRAY, T.FLOAT32),
                 ("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32),
                 ("tokenizer.ggml.add_space_prefix", space_prefix, T.BOOL, None)]
        described = f"llama (SentencePiece-style BPE, {'' if space_prefix else 'no '}space prefix)"
    else:
        if not special.merges:
            raise _refuse("a byte-level BPE whose merges gguf's SpecialVocab cannot read")
        _pad(tokens, types, None, vocab_size)
        keys += [("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING),
                 ("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32)]
        described = f"gpt2 BPE (pre-tokenizer {pre})"
    return GGUFVocab(source=f"{described} from the tokenizer", keys=keys, special=special, model=kind, pre=pre)


def _kinds_decoder(decoder: dict) -> list[dict]:
    if not decoder:
        return []
    return list(decoder.get("decoders") or []) if decoder.get("type") == "Sequence" else [decoder]
