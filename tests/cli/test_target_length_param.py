"""``--param target_length=N`` on the command line, as training YAML takes it and as ``ropekit eval``'s own
refusal advises: the scale it sets is s = N / C (PI's L'/L), the same as ``--target-length N``. Before, ``extend``
called it an unknown parameter and ``eval`` refused the text '1024' as not an integer."""

from __future__ import annotations

import json

from ropekit.models.tiny import build_tiny_model

WINDOW = build_tiny_model("llama").config.max_position_embeddings


def _factor(out_dir) -> float:
    return json.loads((out_dir / "config.json").read_text())["rope_parameters"]["factor"]


def test_extend_takes_target_length_as_a_param(run_cli, tmp_path):
    target = 16 * WINDOW
    code, _, err = run_cli("extend", "tiny", "-m", "yarn", "--param", f"target_length={target}", "--out", str(tmp_path / "p"))
    assert code == 0, err
    code, _, err = run_cli("extend", "tiny", "-m", "yarn", "--target-length", str(target), "--out", str(tmp_path / "t"))
    assert code == 0, err
    assert _factor(tmp_path / "p") == _factor(tmp_path / "t") == target / WINDOW


def test_target_length_given_twice_or_not_a_number_is_one_line(run_cli, tmp_path):
    for args, said in ([("--param", "target_length=1024", "-t", "1024"), "target length given twice"],
                       [("--param", "target_length=abc"), "target_length must be an integer number of tokens"]):
        code, out, err = run_cli("extend", "tiny", "-m", "yarn", *args, "--out", str(tmp_path / "x"))
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("running on")]
        assert code == 2 and len(lines) == 1 and said in lines[0], err
        assert not (tmp_path / "x").exists()


def test_eval_takes_the_target_length_its_refusal_advises(run_cli, tmp_path):
    code, _, err = run_cli("eval", "ppl", "tiny", "-m", "yarn", "--lengths", str(WINDOW), "--samples", "1")
    assert code == 2 and "--param target_length=N" in err
    target = 4 * WINDOW
    results = tmp_path / "r.jsonl"
    code, _, err = run_cli("eval", "ppl", "tiny", "-m", "yarn", "--param", f"target_length={target}",
                           "--lengths", str(WINDOW), "--samples", "1", "--out", str(results))
    assert code == 0, err
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert records and all(r["params"]["factor"] == target / WINDOW for r in records)
