"""`ropekit eval ruler`: RULER's 13 generators (fit, content, answers), metrics, seeds, QA files, skip, resume, CLI.

Generators are checked under two tokenizers — the byte tokenizer (one token per byte, no BOS) and a small
byte-level BPE with a BOS trained here on the prose — to show that length control follows the tokenizer.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import pytest
import torch

# tests/eval is on sys.path (rootdir-less test dir)
from eval_tokenizers import trained_bpe

from ropekit.errors import RopekitError
from ropekit.eval import ruler
from ropekit.eval.common import make_context
from ropekit.data.ruler import tasks as T
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

SYNTHETIC = [n for n in ruler.TASKS if not n.startswith("qa")]
SINGULAR = {"niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3"}


# ---- fixtures ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def byte_tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def bpe_tok():
    """A 500-token byte-level BPE trained on the prose, adding ``<s>`` (BOS) in front of every text."""
    from ropekit.data.prose import prose_sentences

    return trained_bpe(prose_sentences()[:2000], 500, eos="</s>", bos="<s>", pad=False)


SQUAD = {
    "version": "v2.0",
    "data": [
        {"title": "Rivers", "paragraphs": [
            {"context": "The Danube flows through Vienna and Budapest before reaching the Black Sea.", "qas": [
                {"id": "a", "question": "Where does the Danube end?", "is_impossible": False,
                 "answers": [{"text": "the Black Sea", "answer_start": 56}, {"text": "Black Sea", "answer_start": 60}]},
                {"id": "b", "question": "Who named the Danube?", "is_impossible": True, "answers": [],
                 "plausible_answers": [{"text": "Romans", "answer_start": 0}]},
            ]},
            {"context": "The Rhine rises in the Swiss Alps and ends in the North Sea near Rotterdam.", "qas": [
                {"id": "c", "question": "Where does the Rhine rise?", "is_impossible": False,
                 "answers": [{"text": "the Swiss Alps", "answer_start": 19}]},
            ]},
        ]},
        {"title": "Metals", "paragraphs": [
            {"context": "Copper conducts electricity well and turns green when it weathers outdoors.", "qas": [
                {"id": "d", "question": "What colour does weathered copper turn?", "is_impossible": False,
                 "answers": [{"text": "green", "answer_start": 42}]},
            ]},
            {"context": "Tin is soft and was alloyed with copper to make bronze in antiquity.", "qas": [
                {"id": "e", "question": "What alloy do tin and copper make?", "is_impossible": False,
                 "answers": [{"text": "bronze", "answer_start": 54}]},
            ]},
        ]},
    ],
}
HOTPOT = [
    {"_id": "h1", "question": "Which river passes the city where the composer was born?", "answer": "Danube",
     "context": [["Vienna", ["Vienna is the capital of Austria. ", "The Danube passes it."]],
                 ["Composer", ["The composer was born in Vienna."]],
                 ["Rome", ["Rome lies on the Tiber."]]]},
    {"_id": "h2", "question": "What metal is alloyed with tin to make bronze?", "answer": "copper",
     "context": [["Bronze", ["Bronze is an alloy of copper and tin."]],
                 ["Tin", ["Tin is soft."]],
                 ["Rome", ["Rome lies on the Tiber."]]]},
]


@pytest.fixture
def qa_dir(tmp_path):
    (tmp_path / "dev-v2.0.json").write_text(json.dumps(SQUAD))
    (tmp_path / "hotpot_dev_distractor_v1.json").write_text(json.dumps(HOTPOT))
    return str(tmp_path)


def plan_for(tok, name, length, *, seed=0, data=None, chat=False):
    plans, skipped, _ = ruler.prepare(tok, lengths=[length], tasks=[name], data=data, chat=chat, seed=seed)
    assert not skipped
    return plans[0]


# ---- independent readers of a generated prompt ------------------------------------------------------
def between(text, start, end):
    i = text.rindex(start) + len(start)
    return text[i:text.index(end, i)]


def numbered_words(listing):
    """The words of ``"1. w 2. w …"`` (independently of the generator), checking the numbering is 1…n."""
    parts = re.split(r"(?:^| )(\d+)\. ", listing)
    numbers, words = parts[1::2], parts[2::2]
    assert parts[0] == "" and [int(n) for n in numbers] == list(range(1, len(numbers) + 1))
    return words


def check_content(name, sample, text):
    """Every reference is where the task says it is, as an independent reading of the prompt text."""
    spec = ruler.TASKS[name]
    context = text[: -len(sample.answer_prefix)]
    refs = sample.references
    if spec.family == "niah":
        s = spec.settings
        plural = s["type_needle_v"]
        assert len(refs) == s["num_needle_q"] * s["num_needle_v"]
        query = re.search(r"^What (?:is|are all) the special magic \w+ for (.+) mentioned in the provided text\?$",
                          context, re.MULTILINE).group(1)
        keys = query.replace(", and ", ", ").split(", ")
        assert len(keys) == s["num_needle_q"]
        for ref in refs:  # each answer is the value of a needle about one of the queried keys
            assert any(f"One of the special magic {plural} for {k} is: {ref}." in context for k in keys), ref
        for k in keys:
            assert context.count(f"for {k} is: ") == s["num_needle_v"]
        if name in SINGULAR:
            single = plural[:-1]
            assert f"A special magic {single} is hidden within the following text." in context
            assert f"What is the special magic {single} for {query} mentioned" in context
            assert sample.answer_prefix == f" The special magic {single} for {query} mentioned in the provided text is"
        else:
            assert f"Some special magic {plural} are hidden within the following text." in context
            assert f"What are all the special magic {plural} for {query} mentioned" in context
            assert sample.answer_prefix == f" The special magic {plural} for {query} mentioned in the provided text are"
    elif name == "vt":
        value = re.search(r"assigned the value (\d+) in the text above\.$", context).group(1)
        assert len(refs) == 5 and len(set(refs)) == 5 and all(re.fullmatch(r"[A-Z]{5}", r) for r in refs)
        lines = context.split("\n")
        chain = [f"VAR {refs[0]} = {value}"] + [f"VAR {refs[j + 1]} = VAR {refs[j]} " for j in range(4)]
        at = [lines.index(c) for c in chain]
        assert at == sorted(at)  # in chain order
        assert sample.answer_prefix == (" Answer: According to the chain(s) of variable assignment in the text above, "
                                        f"5 variables are assigned the value {value}, they are: ")
    elif name == "cwe":
        words = numbered_words(between(context, "Memorize the ones that appear most often.\n", "\nQuestion:"))
        counts = Counter(words).most_common()
        assert {w for w, _ in counts[:10]} == set(refs) and len(refs) == 10
        if len(counts) > 10:
            assert counts[9][1] > counts[10][1]
    elif name == "fwe":
        words = between(context, "Find the three most frequently appeared coded words. ", "\nQuestion:").split(" ")
        counts = Counter(w for w in words if w != "...").most_common()
        assert [w for w, _ in counts[:3]] == refs or {w for w, _ in counts[:3]} == set(refs)
        assert all(re.fullmatch(r"[a-z]{6}", w) for w in refs)
        if len(counts) > 3:
            assert counts[2][1] > counts[3][1]
    else:  # qa: the test files' answers are all spans of the gold documents
        assert all(r in context for r in refs)


# ---- generators --------------------------------------------------------------------------------------
@pytest.mark.parametrize("which,length", [("byte", 2048), ("bpe", 1024)])
def test_every_generator_fits_its_tokenizer_and_holds_its_answers(which, length, byte_tok, bpe_tok, qa_dir):
    tok = byte_tok if which == "byte" else bpe_tok
    plans, skipped, chat = ruler.prepare(tok, lengths=[length], data=qa_dir, samples=2)
    assert not skipped and not chat and [p.spec.name for p in plans] == list(ruler.TASKS)
    for plan in plans:
        ttg = plan.spec.tokens_to_generate
        for index in range(2):
            sample = plan.sample(index)
            ids = tok(sample.text).input_ids  # recount independently, BOS included
            assert sample.ids == ids and sample.prompt_tokens == len(ids)
            assert len(ids) + ttg <= length, plan.spec.name
            if which == "bpe":
                assert ids[0] == tok.bos_token_id
            assert sample.text.endswith(sample.answer_prefix)
            check_content(plan.spec.name, sample, sample.text)
        if plan.spec.family != "fwe":
            # the binary search gave the largest haystack whose probe fits
            assert plan.measure(plan.knob) + ttg <= length < plan.measure(plan.knob + 1) + ttg, plan.spec.name


def test_length_control_follows_the_tokenizer(byte_tok, bpe_tok):
    """The same task and length hold more haystack under a coarser tokenizer; the BOS is counted."""
    for name in ("niah_single_1", "niah_single_2", "vt", "fwe"):
        by_byte, by_bpe = plan_for(byte_tok, name, 1024), plan_for(bpe_tok, name, 1024)
        assert by_bpe.knob > by_byte.knob, name
        text = by_bpe.sample(0).text
        assert by_bpe.sample(0).prompt_tokens == len(bpe_tok(text, add_special_tokens=False).input_ids) + 1


def test_binary_search_equals_a_linear_scan(byte_tok):
    """The largest fitting knob, against the naive scan upward from an empty haystack."""
    for name in ("niah_single_1", "niah_single_2", "niah_multikey_3", "vt"):
        plan = plan_for(byte_tok, name, 900)
        knob = 0
        while plan.measure(knob + 1) <= plan.budget:
            knob += 1
        assert plan.knob == knob, name


def test_cwe_frequency_settings_switch_at_4096(byte_tok):
    for length, example, item in ((2048, (20, 3, 1), (6, 1)), (8192, (40, 10, 3), (30, 3))):
        plan = plan_for(byte_tok, "cwe", length)
        sample = plan.sample(0)
        assert sample.fewshot == 1
        shot, real = sample.text.split("\nBelow is a numbered list", 1)
        shot_words = numbered_words(between(shot, "most often.\n", "\nQuestion:"))
        shot_answer = numbered_words(shot.split("appear most often in the list are: ", 1)[1])
        counts = Counter(shot_words)
        assert len(counts) == example[0] and set(shot_answer) == {w for w, c in counts.items() if c == example[1]}
        assert sorted(set(counts.values())) == sorted({example[1], example[2]})
        real_counts = Counter(numbered_words(between(real, "most often.\n", "\nQuestion:")))
        assert {w for w, c in real_counts.items() if c == item[0]} == set(sample.references)
        assert set(real_counts.values()) == set(item) and len(real_counts) == sample.knob


def test_fwe_counts_are_zipf_with_the_searched_n(byte_tok):
    plan = plan_for(byte_tok, "fwe", 2048)
    sample = plan.sample(0)
    words = between(sample.text, "coded words. ", "\nQuestion:").split(" ")
    counts = Counter(words)
    vocab = (2048 - 50) // 50
    zeta2 = math.pi ** 2 / 6  # ζ(2), independently of scipy
    expected = sorted((int(sample.knob * k ** -2.0 / zeta2) for k in range(1, vocab + 1)), reverse=True)
    assert counts["..."] == expected[0]
    assert sorted(counts.values(), reverse=True) == [c for c in expected if c > 0]
    assert [counts[r] for r in sample.references] == expected[1:4]
    # RULER's linear N search: one more step (budget // 32) would not fit
    assert plan.measure(plan.knob + plan.generator.incremental) >= plan.budget


def test_vt_one_shot_example_is_randomised_per_sample(byte_tok):
    plan = plan_for(byte_tok, "vt", 2048)
    shots = []
    for index in range(2):
        sample = plan.sample(index)
        assert sample.fewshot == 1
        example, _ = sample.text.split("\nMemorize and track", 1)
        names = example.split("they are: ")[1].split()
        value = re.search(r"assigned the value (\d+) in the text above", example).group(1)
        assert len(names) == 5 and all(re.fullmatch(r"[A-Z]{3}", n) for n in names) and value != "12345"
        assert f"VAR {names[0]} = {value}\n" in example and f"VAR {names[4]} = VAR {names[3]} \n" in example
        assert not set(names) & set(sample.references)
        shots.append((names, value))
    assert shots[0] != shots[1]


def test_same_seed_same_bytes_other_seed_other_samples(byte_tok):
    for name in ("niah_multikey_1", "vt", "cwe", "fwe"):
        a = plan_for(byte_tok, name, 2048, seed=3).sample(1)
        b = plan_for(byte_tok, name, 2048, seed=3).sample(1)
        c = plan_for(byte_tok, name, 2048, seed=4).sample(1)
        assert a.text == b.text and a.references == b.references
        assert a.text != c.text


def test_short_lengths_fit_or_name_their_minimum(byte_tok):
    one = plan_for(byte_tok, "niah_single_1", 512).sample(0)
    assert one.prompt_tokens + 128 <= 512 and one.knob == 0  # the needle alone: no noise line fits
    vt = plan_for(byte_tok, "vt", 512).sample(0)
    assert vt.fewshot == 0 and vt.prompt_tokens + 30 <= 512  # the one-shot example cannot fit
    with pytest.raises(RopekitError, match=r"'niah_single_1' cannot fit in 256 tokens.*--lengths (\d+) or more") as err:
        plan_for(byte_tok, "niah_single_1", 256)
    need = int(re.search(r"--lengths (\d+) or more", str(err.value)).group(1))
    assert 256 < need <= 600
    assert plan_for(byte_tok, "niah_single_1", need).sample(0).prompt_tokens + 128 <= need
    with pytest.raises(RopekitError, match="'cwe' cannot fit in 1024"):
        plan_for(byte_tok, "cwe", 1024)


def test_a_smaller_generation_budget_gives_the_haystack_its_room(byte_tok):
    """``tokens_to_generate`` replaces RULER's budget in the length rule only (prompt + budget ≤ length): the
    haystack grows by what the budget gave back, nothing else of the task changes."""
    plans, _, _ = ruler.prepare(byte_tok, lengths=[512], tasks=["niah_single_1", "vt"], tokens_to_generate=12)
    for plan in plans:
        default = plan_for(byte_tok, plan.spec.name, 512)
        assert plan.spec.tokens_to_generate == 12 and plan.budget == 500
        assert plan.spec.settings == default.spec.settings and plan.spec.metric == default.spec.metric
        sample = plan.sample(0)
        assert sample.prompt_tokens + 12 <= 512 < plan.measure(plan.knob + 1) + 12
        assert plan.knob > default.knob
    # a length too short for the needle and RULER's 128 tokens holds it with 12
    with pytest.raises(RopekitError, match="'niah_single_1' cannot fit in 460 tokens"):
        plan_for(byte_tok, "niah_single_1", 460)
    small = ruler.prepare(byte_tok, lengths=[460], tasks=["niah_single_1"], tokens_to_generate=12)[0][0].sample(0)
    assert small.prompt_tokens + 12 <= 460
    for bad in (0, -3, 2.5, True):
        with pytest.raises(RopekitError, match="--tokens-to-generate"):
            ruler.prepare(byte_tok, lengths=[512], tasks=["vt"], tokens_to_generate=bad)


def test_qa_files_are_read_as_ruler(byte_tok, qa_dir, tmp_path_factory):
    squad = plan_for(byte_tok, "qa_1", 1024, data=qa_dir)
    items = squad.qa.items
    assert [i.query for i in items] == ["Where does the Danube end?", "Where does the Rhine rise?",
                                        "What colour does weathered copper turn?", "What alloy do tin and copper make?"]
    assert list(items[0].references) == ["the Black Sea", "Black Sea"]
    assert len(squad.qa.documents) == 4 and len(items[0].more) == 1
    for index, item in enumerate(items):
        sample = squad.sample(index)  # sample i asks question i
        assert sample.text.endswith(f"Question: {item.query} Answer:")
        assert "Document 1:\n" in sample.text and all(f"\n{d}" in sample.text for d in (squad.qa.documents[g] for g in item.gold))
    hotpot = plan_for(byte_tok, "qa_2", 1024, data=qa_dir)
    assert hotpot.qa.documents[0] == "Bronze\nBronze is an alloy of copper and tin." and len(hotpot.qa.documents) == 5
    sample = hotpot.sample(0)
    assert sample.references == ["Danube"]
    assert "Vienna\nVienna is the capital of Austria. The Danube passes it." in sample.text
    with pytest.raises(RopekitError, match="exceeds the 2 answerable questions"):
        ruler.prepare(byte_tok, lengths=[1024], tasks=["qa_2"], data=qa_dir, samples=3)
    bad = tmp_path_factory.mktemp("bad")
    (bad / "dev-v2.0.json").write_text('{"data": [{"paragraphs": [{"qas": []}]}]}')
    with pytest.raises(RopekitError, match="not a SQuAD v2 file"):
        ruler.prepare(byte_tok, lengths=[1024], tasks=["qa_1"], data=str(bad))


def test_chat_template_wraps_the_task_and_the_prefix_ends_it(byte_tok):
    tok = byte_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    assert ruler.resolve_chat(tok, None) is True and ruler.resolve_chat(byte_tok, None) is False
    cwe = plan_for(tok, "cwe", 2048, chat=True).sample(0)
    assert cwe.text.startswith("<|user|>Below is a numbered list")
    assert "\n<|assistant|>Answer: The top 10 words that appear most often in the list are: 1. " in cwe.text
    assert cwe.text.endswith("<|assistant|>" + T.CWE_ANSWER_PREFIX)
    assert cwe.prompt_tokens == len(tok(cwe.text, add_special_tokens=False).input_ids)
    with pytest.raises(RopekitError, match="no chat template"):
        ruler.resolve_chat(byte_tok, True)


def test_unknown_task_and_bad_options(byte_tok, tmp_path):
    with pytest.raises(RopekitError, match="unknown RULER task 'niah'"):
        ruler.prepare(byte_tok, lengths=[1024], tasks=["niah"])
    with pytest.raises(RopekitError, match="--samples 0"):
        ruler.prepare(byte_tok, lengths=[1024], tasks=["vt"], samples=0)
    with pytest.raises(RopekitError, match="does not exist"):
        ruler.prepare(byte_tok, lengths=[1024], tasks=["qa_1"], data=str(tmp_path / "nowhere"))


# ---- metrics -------------------------------------------------------------------------------------------
def test_essay_needles_go_where_rulers_depth_puts_them():
    """RULER's niah.py inserts at ``int(len(document_sents) * (depth / 100))``: the fraction is formed first, and
    for some sentence counts that is one sentence earlier than ``n * depth / 100`` (300 at 41 %: 122, not 123)."""
    assert T.depth_cut(300, 41) == 122 and T.depth_cut(600, 41) == 245 and T.depth_cut(1100, 69) == 758
    ruler_rule = {(n, d): int(n * (d / 100)) for n in range(1, 5000, 7) for d in T.DEPTHS}
    assert {key: T.depth_cut(*key) for key in ruler_rule} == ruler_rule


def test_metrics_match_hand_computed_cases():
    assert ruler.string_match_all("The numbers are 1234567 and 7654321.", ["1234567", "7654321", "1111111"]) == pytest.approx(2 / 3)
    assert ruler.string_match_all("ANSWER: Pale-Cactus", ["pale-cactus"]) == 1.0
    assert ruler.string_match_all("", ["x"]) == 0.0
    # any alias is enough (RULER); lm-eval's port would give 1/2 here
    assert ruler.string_match_part("Paris, of course", ["paris", "Lyon"]) == 1.0
    assert ruler.string_match_part("nothing here", ["paris", "Lyon"]) == 0.0
    assert ruler.postprocess("  the answer\x01is\t42 \n") == "the answer\nis\n42"
    assert ruler.postprocess("\x00\x1f") == ""


def test_summary_rows_average_and_skipped_notes():
    key = {"task": "ruler", "method": "plain", "params": {}}
    records = [
        {**key, "length": 512, "subtask": "niah_single_1", "sample": 0, "score": 1.0, "prediction": "x",
         "prompt_tokens": 496, "tokens_to_generate": 16},
        {**key, "length": 512, "subtask": "niah_single_1", "sample": 1, "score": 0.0, "prediction": "",
         "prompt_tokens": 420, "tokens_to_generate": 16},
        {**key, "length": 512, "subtask": "vt", "sample": 0, "score": 0.4, "prediction": "y"},
        {**key, "length": 512, "subtask": "qa_1", "sample": None, "skipped": "no --data directory given"},
    ]
    rows = ruler.summarize(records)
    assert [r["subtask"] for r in rows] == ["niah_single_1", "vt", "qa_1", "average"]
    assert rows[0]["accuracy"] == 0.5 and rows[0]["nulls"] == 1 and rows[1]["accuracy"] == 0.4
    assert rows[0]["fill"] == round(((496 + 16) / 512 + (420 + 16) / 512) / 2, 3)  # a shrunk haystack shows
    assert rows[1]["fill"] is None  # records without token counts
    assert rows[2]["accuracy"] is None and "no --data" in rows[2]["skipped"]
    assert rows[3]["accuracy"] == pytest.approx((0.5 + 0.4) / 2) and rows[3]["tasks"] == 2


# ---- end to end ------------------------------------------------------------------------------------
class Sink:
    def __init__(self):
        self.total, self.steps, self.notes = None, 0, []

    def set_total(self, total):
        self.total = total

    def advance(self, n=1, description=None):
        self.steps += n
        if description:
            self.notes.append(description)


def eos_first_model():
    """A tiny llama whose every next token is EOS (byte 0): one forward pass per sample, an empty prediction."""
    model = build_tiny_model("llama")
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[0] = 1.0
    model.lm_head = head
    return model


def test_all_thirteen_tasks_run_end_to_end_and_resume(byte_tok, qa_dir, tmp_path, monkeypatch):
    out = tmp_path / "ruler.jsonl"
    model = eos_first_model()
    sink = Sink()
    ctx = make_context("ruler", model, byte_tok, method=None, params=None, lengths=[1280], key_fields=ruler.KEY_FIELDS,
                       out=str(out), progress=sink)
    ruler.run(ctx, lengths=[1280], samples=1, data=qa_dir)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sink.total == 13 and sink.steps == 13 and [r["subtask"] for r in records] == list(ruler.TASKS)
    for r in records:
        spec = ruler.TASKS[r["subtask"]]
        assert r["prediction"] == "" and r["score"] == 0.0 and r["generated_tokens"] == 0
        assert r["prompt_tokens"] + spec.tokens_to_generate <= 1280 and r["metric"] == spec.metric
        assert r["references"] and r["seconds"] >= 0 and r["haystack"] and r["chat"] is False
    assert {r["haystack"] for r in records if r["subtask"] == "niah_single_2"} == {"python-docs-prose"}
    rows = ruler.summarize(records)
    assert len(rows) == 14 and rows[-1]["subtask"] == "average" and rows[-1]["tasks"] == 13
    assert all(r["nulls"] == 1 for r in rows[:-1])

    calls = []
    monkeypatch.setattr(ruler, "greedy_generate", lambda *a, **k: calls.append(1) or [])
    again = make_context("ruler", model, byte_tok, method=None, params=None, lengths=[1280], key_fields=ruler.KEY_FIELDS,
                         out=str(out), resume=True)
    ruler.run(again, lengths=[1280], samples=1, data=qa_dir)
    assert calls == [] and len(out.read_text().splitlines()) == 13


def test_missing_qa_data_is_skipped_with_a_reason(byte_tok, tmp_path):
    sink = Sink()
    out = tmp_path / "r.jsonl"
    ctx = make_context("ruler", eos_first_model(), byte_tok, method=None, params=None, lengths=[512],
                       key_fields=ruler.KEY_FIELDS, out=str(out), progress=sink)
    ruler.run(ctx, lengths=[512], tasks=["niah_single_1", "qa_1", "qa_2"], samples=1, data=str(tmp_path))
    assert sink.total == 1
    notes = [n for n in sink.notes if "skipped" in n]
    assert notes == [f"ruler: qa_1 skipped — dev-v2.0.json (SQuAD v2 dev) is not in --data {tmp_path}",
                     f"ruler: qa_2 skipped — hotpot_dev_distractor_v1.json (HotpotQA dev distractor) is not in --data {tmp_path}"]
    rows = ruler.summarize(list(ctx.writer.records()))
    assert [r["subtask"] for r in rows] == ["niah_single_1", "qa_1", "qa_2", "average"]
    assert rows[1]["skipped"].startswith("dev-v2.0.json") and rows[-1]["tasks"] == 1
    # only qa tasks and no data: nothing would run, so the run is refused rather than empty
    with pytest.raises(RopekitError, match="RULER task qa_1 cannot run: dev-v2.0.json"):
        ruler.prepare(byte_tok, lengths=[512], tasks=["qa_1"], data=str(tmp_path))


def test_records_carry_the_budget_given(byte_tok, tmp_path):
    out = tmp_path / "r.jsonl"
    ctx = make_context("ruler", build_tiny_model("llama"), byte_tok, method=None, params=None, lengths=[460],
                       key_fields=ruler.KEY_FIELDS, out=str(out))
    ruler.run(ctx, lengths=[460], tasks=["niah_single_1"], samples=2, tokens_to_generate=5)
    records = list(ctx.writer.records())
    assert len(records) == 2
    for r in records:  # the budget given bounds the generation and is recorded
        assert r["tokens_to_generate"] == 5 and r["generated_tokens"] <= 5 and r["prompt_tokens"] + 5 <= 460


def test_cli_runs_two_tasks_at_512(run_cli):
    code, out, err = run_cli("eval", "ruler", "tiny", "--lengths", "512", "--tasks", "niah_single_1,vt", "--samples", "1", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["subtask"] for r in rows] == ["niah_single_1", "vt", "average"]
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["length"] == 512 for r in rows)
