"""Conversations → token ids with a loss on the assistant's responses only, and long-conversation splitting.

**Input.** A ``.jsonl`` file (one conversation per line), a ``.json`` file holding a list of conversations
(ShareGPT dumps), or a directory of such files (sorted by relative path). A conversation is an object
with either ``messages: [{"role", "content"}, …]`` (the transformers chat format) or ShareGPT's
``conversations: [{"from", "value"}, …]``; roles ``human``/``gpt``/``chatgpt``/``bard``/``bing``/``model``/
``function``/``observation`` are mapped to ``user``/``assistant``/``tool`` (:data:`ROLE_ALIASES`).

**Rendering.** The tokenizer's own chat template (``apply_chat_template``). A tokenizer without one (the
tiny byte tokenizer) gets :data:`CHATML_TEMPLATE` — ChatML (``<|im_start|>role\\ncontent<|im_end|>\\n``),
passed per call, so the tokenizer object is not modified; the dataset summary says when it was used.

**Loss mask.** ``labels`` are −100 everywhere except the tokens of assistant responses: the response
text and the end-of-turn marker that closes it (the model must learn to stop), not the role header
before it nor whitespace after it. Two ways, same result on ChatML (tested):

* the template marks responses with ``{% generation %}`` (as :data:`CHATML_TEMPLATE` does): transformers'
  ``return_assistant_tokens_mask`` is used;
* otherwise, *prefix diffing*: for each assistant message ``i`` the conversation up to ``i`` is rendered
  with the generation prompt (where the response starts) and up to ``i + 1`` without (where the turn
  ends, trailing whitespace trimmed); both must be character prefixes of the full rendering, else the
  template rewrites earlier turns and :class:`RopekitError` asks for a template with generation markers.
  Character spans become token spans through the tokenizer's offset mapping (a token belongs to the
  response when it starts inside it), which is robust where BPE merges across the boundary.

**Long conversations** (Entropy-ABF (Zhang et al. 2024), Zhang et al., *Extending LLMs' Context Window with 100 Samples*, §4.1:
"kept English conversations only, excluded those with less than 10,000 tokens, and split longer
conversations so that we have a maximum sequence length of 16,384 tokens", following the FastChat
cleaning pipeline of Zheng et al.). Conversations shorter than ``min_tokens`` are dropped (the paper:
10,000 at 16,384; default 0 — language filtering is left to the user's data). Longer than the training
length, a conversation is split *at round boundaries* (a round = a user message and the replies up to
the next user message), greedily: each piece takes as many whole rounds as fit, measured exactly by
rendering and tokenizing the piece. Leading system messages are repeated at the start of every piece,
since each piece is trained as a conversation of its own. A single round that does not fit even alone
is dropped (FastChat would leave it over-long for later truncation, which cuts the response and its
end-of-turn marker); pieces without an assistant response are dropped too. Every piece is ≤ the
training length.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.jsonl import jsonl_rows
from ..errors import RopekitError
from .packing import IGNORE_INDEX

#: ChatML with ``{% generation %}`` markers around each response (for ``return_assistant_tokens_mask``).
#: Written with whitespace-control dashes: transformers renders templates with ``trim_blocks``.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

ROLE_ALIASES = {
    "system": "system",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
    "bing": "assistant", "model": "assistant",
    "tool": "tool", "function": "tool", "observation": "tool",
}
_SUFFIXES = (".jsonl", ".json")


# ---- reading ------------------------------------------------------------------------------------------
def normalize_conversation(record, where: str) -> list[dict]:
    """``[{"role", "content"}, …]`` from a ``messages`` or ShareGPT ``conversations`` record."""
    if not isinstance(record, dict):
        raise RopekitError(f"{where} is not a JSON object", 'write each conversation as {"messages": [...]}')
    if "messages" in record:
        turns, role_key, text_key = record["messages"], "role", "content"
    elif "conversations" in record:
        turns, role_key, text_key = record["conversations"], "from", "value"
    else:
        raise RopekitError(f"{where} has neither 'messages' nor 'conversations'",
                           'give it "messages": [{"role": ..., "content": ...}] or ShareGPT "conversations"')
    if not isinstance(turns, list) or not turns:
        raise RopekitError(f"{where}: the conversation is not a non-empty list", "give at least one message")
    out = []
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise RopekitError(f"{where} message {k} lacks '{role_key}' or '{text_key}'",
                               f'write each message as {{"{role_key}": ..., "{text_key}": ...}}')
        role = ROLE_ALIASES.get(str(turn[role_key]).strip().lower())
        if role is None:
            raise RopekitError(f"{where} message {k} has an unknown role '{turn[role_key]}'",
                               f"use one of {', '.join(sorted(ROLE_ALIASES))}")
        content = turn[text_key]
        if not isinstance(content, str):
            raise RopekitError(f"{where} message {k}: content is a {type(content).__name__}, not a string",
                               "give every message its text as one string")
        out.append({"role": role, "content": content})
    return out


def _file_conversations(p: Path) -> list[list[dict]]:
    out = []
    if p.suffix.lower() == ".jsonl":
        return [normalize_conversation(record, f"'{p}' line {number}")
                for number, record in jsonl_rows(p, "write one JSON object per line")]
    try:
        data = json.loads(p.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RopekitError(f"'{p}' is not a JSON file", "write a JSON list of conversations, or JSONL") from None
    records = data if isinstance(data, list) else [data]
    for k, record in enumerate(records):
        out.append(normalize_conversation(record, f"'{p}' item {k}"))
    return out


def read_conversations(path: str | Path) -> tuple[list[list[dict]], str]:
    """``(conversations, label)`` from a ``.jsonl``/``.json`` file or a directory of them (module doc)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise RopekitError(f"conversation file '{path}' does not exist", "pass a .jsonl/.json file or a directory of them")
    p = p.resolve()
    if p.is_dir():
        files = sorted((f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in _SUFFIXES),
                       key=lambda f: f.relative_to(p).as_posix())
        if not files:
            raise RopekitError(f"directory '{p}' holds no .jsonl or .json files", "put the conversations in .jsonl files")
        conversations = [c for f in files for c in _file_conversations(f)]
        label = f"sft-dir:{p}"
    else:
        if p.suffix.lower() not in _SUFFIXES:
            raise RopekitError(f"conversation file '{p}' is not .jsonl or .json", "pass conversations as JSONL")
        conversations = _file_conversations(p)
        label = f"sft:{p}"
    if not conversations:
        raise RopekitError(f"'{p}' holds no conversations", "give at least one conversation")
    return conversations, label


# ---- rendering and masks ----------------------------------------------------------------------------
def chat_template_of(tokenizer, template: str | None = None) -> tuple[str, bool]:
    """``(template, is_default)``: ``template`` if given, else the tokenizer's, else :data:`CHATML_TEMPLATE`."""
    if template:
        return template, False
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, dict):  # several named templates: the default one
        own = own.get("default")
    if isinstance(own, str) and own.strip():
        return own, False
    return CHATML_TEMPLATE, True


def has_generation_markers(template: str) -> bool:
    """Whether ``template`` marks responses with ``{% generation %}`` blocks."""
    compact = template.replace(" ", "").replace("-", "")
    return "{%generation%}" in compact


def render(tokenizer, messages: list[dict], template: str, add_generation_prompt: bool = False) -> str:
    """The conversation as text, through ``template``."""
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def _tokenize(tokenizer, text: str, offsets: bool = False):
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=offsets, verbose=False)
    return enc


def _prefix_diff_mask(tokenizer, messages, template, full: str, offsets) -> list[bool]:
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], template, add_generation_prompt=True)
        through = render(tokenizer, messages[: i + 1], template)
        if not (full.startswith(before) and full.startswith(through) and len(through) >= len(before)):
            raise RopekitError("the chat template renders earlier turns differently once later ones follow, "
                               "so response tokens cannot be found by prefixes",
                               "use a chat template whose responses are marked with {% generation %} blocks")
        end = len(before) + len(through[len(before):].rstrip())
        spans.append((len(before), end))
    mask = []
    for start, stop in offsets:
        mask.append(any(a <= start < b for a, b in spans) and stop > start)
    return mask


def encode_conversation(tokenizer, messages: list[dict], template: str) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one conversation; labels are the ids on response tokens, −100 elsewhere."""
    full = render(tokenizer, messages, template)
    enc = _tokenize(tokenizer, full, offsets=True)
    ids = list(enc["input_ids"])
    if has_generation_markers(template):
        out = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        if list(out["input_ids"]) != ids:
            raise RopekitError("the chat template's tokenization differs from tokenizing its rendered text",
                               "use a template without {% generation %} markers (prefix diffing is used then)")
        mask = [bool(m) for m in out["assistant_masks"]]
    else:
        offsets = enc.get("offset_mapping")
        if offsets is None:
            raise RopekitError("this tokenizer gives no character offsets, so response tokens cannot be located",
                               "use a fast (Rust) tokenizer, or a template with {% generation %} markers")
        mask = _prefix_diff_mask(tokenizer, messages, template, full, offsets)
    labels = [tok if m else IGNORE_INDEX for tok, m in zip(ids, mask)]
    return ids, labels


def token_length(tokenizer, messages: list[dict], template: str) -> int:
    """Number of tokens of the rendered conversation."""
    return len(_tokenize(tokenizer, render(tokenizer, messages, template))["input_ids"])


# ---- splitting ----------------------------------------------------------------------------------------
def rounds_of(messages: list[dict]) -> tuple[list[dict], list[list[dict]]]:
    """``(header, rounds)``: leading system messages, then runs that each start at a user message."""
    k = 0
    while k < len(messages) and messages[k]["role"] == "system":
        k += 1
    header, rounds = messages[:k], []
    for message in messages[k:]:
        if message["role"] == "user" and rounds and rounds[-1]:
            rounds.append([])
        if not rounds:
            rounds.append([])
        rounds[-1].append(message)
    return header, rounds


def split_conversation(tokenizer, messages: list[dict], max_tokens: int, template: str) -> tuple[list[list[dict]], int]:
    """``(pieces, dropped_rounds)``: the conversation as whole-round pieces of ≤ ``max_tokens`` tokens each."""
    if token_length(tokenizer, messages, template) <= max_tokens:
        return [messages], 0
    header, rounds = rounds_of(messages)
    pieces, current, dropped = [], [], 0
    for rnd in rounds:
        candidate = header + [m for r in current + [rnd] for m in r]
        if token_length(tokenizer, candidate, template) <= max_tokens:
            current.append(rnd)
            continue
        if current:
            pieces.append(header + [m for r in current for m in r])
        if token_length(tokenizer, header + rnd, template) <= max_tokens:
            current = [rnd]
        else:
            current = []
            dropped += 1
    if current:
        pieces.append(header + [m for r in current for m in r])
    return pieces, dropped


def build_sft_examples(tokenizer, conversations: list[list[dict]], max_tokens: int, *, min_tokens: int = 0,
                       template: str | None = None) -> tuple[list[tuple[list[int], list[int]]], dict]:
    """Filter, split and encode conversations: ``([(input_ids, labels), …], stats)``.

    ``stats`` counts ``conversations``, ``too_short`` (below ``min_tokens``, dropped), ``split`` (cut into
    several pieces), ``dropped_rounds`` (a round longer than ``max_tokens`` on its own), ``no_response``
    (pieces without assistant tokens, dropped), ``pieces`` (kept) and says whether ``default_template``
    (ChatML) was used.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
        raise RopekitError(f"max_tokens {max_tokens!r} is not an integer ≥ 2", "pass the training length")
    template, is_default = chat_template_of(tokenizer, template)
    stats = {"conversations": len(conversations), "too_short": 0, "split": 0, "dropped_rounds": 0,
             "no_response": 0, "pieces": 0, "default_template": is_default}
    examples = []
    for messages in conversations:
        if min_tokens and token_length(tokenizer, messages, template) < min_tokens:
            stats["too_short"] += 1
            continue
        pieces, dropped = split_conversation(tokenizer, messages, max_tokens, template)
        stats["dropped_rounds"] += dropped
        if len(pieces) > 1:
            stats["split"] += 1
        for piece in pieces:
            ids, labels = encode_conversation(tokenizer, piece, template)
            if all(label == IGNORE_INDEX for label in labels):
                stats["no_response"] += 1
                continue
            examples.append((ids, labels))
    stats["pieces"] = len(examples)
    return examples, stats
