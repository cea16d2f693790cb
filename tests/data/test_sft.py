"""SFT: loss exactly on response tokens (byte tokenizer + ChatML), splitting at round boundaries."""

from __future__ import annotations

import itertools
import json

import pytest

from ropekit.data import sft
from ropekit.data.packing import IGNORE_INDEX
from ropekit.errors import RopekitError
from ropekit.models.byte_tokenizer import byte_tokenizer

PLAIN_CHATML = sft.CHATML_TEMPLATE.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi, café?"},
    {"role": "assistant", "content": "Hello! Sure."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


def _expected(messages):
    """Hand-built ChatML bytes and per-byte loss flags (byte tokenizer: token i is byte i)."""
    ids, train = [], []
    for m in messages:
        header = f"<|im_start|>{m['role']}\n".encode()
        ids += list(header)
        train += [False] * len(header)
        body = (m["content"] + "<|im_end|>").encode()
        ids += list(body)
        train += [m["role"] == "assistant"] * len(body)
        ids += [ord("\n")]
        train += [False]
    return ids, [t if flag else IGNORE_INDEX for t, flag in zip(ids, train)]


@pytest.mark.parametrize("template", [sft.CHATML_TEMPLATE, PLAIN_CHATML], ids=["generation-mask", "prefix-diff"])
def test_loss_exactly_on_assistant_tokens(template):
    tok = byte_tokenizer()
    assert sft.has_generation_markers(template) == (template is sft.CHATML_TEMPLATE)
    ids, labels = sft.encode_conversation(tok, CONVERSATION, template)
    exp_ids, exp_labels = _expected(CONVERSATION)
    assert ids == exp_ids
    assert labels == exp_labels  # token by token, incl. the two-byte 'é' in a user turn
    assert bytes(t for t in labels if t != IGNORE_INDEX) == b"Hello! Sure.<|im_end|>4<|im_end|>"


def test_default_template_only_without_own():
    tok = byte_tokenizer()
    assert sft.chat_template_of(tok) == (sft.CHATML_TEMPLATE, True)
    tok.chat_template = PLAIN_CHATML
    assert sft.chat_template_of(tok) == (PLAIN_CHATML, False)


def test_non_prefix_stable_template_is_refused():
    tok = byte_tokenizer()
    # renders the *number* of messages first: earlier renderings are not prefixes of the full one
    odd = "{{- messages|length -}}" + PLAIN_CHATML
    with pytest.raises(RopekitError, match="generation"):
        sft.encode_conversation(tok, CONVERSATION, odd)


def test_read_messages_and_sharegpt(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(json.dumps({"messages": CONVERSATION[1:3]}) + "\n\n" + json.dumps(
        {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]}) + "\n")
    array = tmp_path / "b.json"
    array.write_text(json.dumps([{"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "x"},
                                                    {"from": "chatgpt", "value": "y"}]}]))
    convs, label = sft.read_conversations(jsonl)
    assert label.startswith("sft:") and convs[0] == CONVERSATION[1:3]
    assert convs[1] == [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
    all_convs, _ = sft.read_conversations(tmp_path)
    assert len(all_convs) == 3 and [m["role"] for m in all_convs[2]] == ["system", "user", "assistant"]
    bad = tmp_path / "bad.jsonl"
    for line, needle in ((json.dumps({"conversations": [{"from": "robot", "value": "x"}]}), "unknown role"),
                         (json.dumps({"text": "x"}), "neither"), ("{oops", "not JSON")):
        bad.write_text(line + "\n")
        with pytest.raises(RopekitError, match=needle) as err:
            sft.read_conversations(bad)
        assert "\n" not in str(err.value)


def _long_conversation(rounds: int):
    messages = [{"role": "system", "content": "Sys."}]
    for r in range(rounds):
        messages.append({"role": "user", "content": f"question {r} " + "q" * (r % 4 * 5)})
        messages.append({"role": "assistant", "content": f"answer {r} " + "a" * (r % 3 * 7)})
    return messages


def test_split_keeps_rounds_whole_and_fits():
    tok = byte_tokenizer()
    template = sft.CHATML_TEMPLATE
    messages = _long_conversation(9)
    L = 170
    assert sft.token_length(tok, messages, template) > L
    pieces, dropped = sft.split_conversation(tok, messages, L, template)
    assert dropped == 0 and len(pieces) > 1
    header, _ = sft.rounds_of(messages)
    rebuilt = []
    for piece in pieces:
        assert sft.token_length(tok, piece, template) <= L
        assert piece[: len(header)] == header  # the system prompt starts every piece
        rebuilt += piece[len(header):]
    assert rebuilt == messages[len(header):]  # every turn once, in order, none cut
    for piece in pieces:  # pieces start at a user turn and are greedy: the next round would not fit
        assert piece[len(header)]["role"] == "user"
    for a, b in itertools.pairwise(pieces):
        assert sft.token_length(tok, a + b[len(header):len(header) + 2], template) > L


def test_overlong_round_dropped_and_stats():
    tok = byte_tokenizer()
    template = sft.CHATML_TEMPLATE
    messages = [{"role": "user", "content": "short"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "x" * 300}, {"role": "assistant", "content": "long"},
                {"role": "user", "content": "again"}, {"role": "assistant", "content": "fine"}]
    pieces, dropped = sft.split_conversation(tok, messages, 100, template)
    assert dropped == 1
    assert [m["content"] for p in pieces for m in p] == ["short", "ok", "again", "fine"]
    only_user = [{"role": "user", "content": "nobody answers"}]
    tiny = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    # hand-built lengths: only_user renders to 42 bytes, tiny to 63 (see _expected)
    assert len(_expected(only_user)[0]) == 42 and len(_expected(tiny)[0]) == 63
    examples, stats = sft.build_sft_examples(tok, [messages, only_user, tiny], 100, min_tokens=50)
    assert stats["too_short"] == 1  # only_user: below min_tokens (Entropy-ABF's filter, Zhang et al. 2024), dropped before splitting
    assert stats["no_response"] == 0 and stats["dropped_rounds"] == 1 and stats["split"] == 1
    assert stats["pieces"] == len(examples) == len(pieces) + 1
    assert examples[-1] == tuple(_expected(tiny))
    assert stats["default_template"] is True
    assert all(len(ids) <= 100 and len(ids) == len(labels) for ids, labels in examples)
    examples, stats = sft.build_sft_examples(tok, [only_user], 100)
    assert examples == [] and stats["no_response"] == 1
