"""``train --resume --dry-run`` refuses a config the resumed run would refuse, with the same line."""

from __future__ import annotations

import yaml

from ropekit.train import example_yaml


def _snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_dry_run_resume_refuses_a_changed_config_like_the_run(run_cli, monkeypatch, tmp_path):
    monkeypatch.setenv("ROPEKIT_CACHE", str(tmp_path / "cache"))
    raw = yaml.safe_load(example_yaml("tiny-full"))
    raw["train"]["threads"] = 1
    raw["output"]["save_every"] = 1
    config = tmp_path / "tiny-full.yaml"
    config.write_text(yaml.safe_dump(raw))
    out_dir = tmp_path / "run"
    code, _, err = run_cli("train", str(config), "--out", str(out_dir), "--max-steps", "2")
    assert code == 0, err
    assert raw["method"]["params"]["factor"] == 4
    raw["method"]["params"]["factor"] = 8
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(raw))
    before = _snapshot(out_dir)

    code, out, dry_err = run_cli("train", str(changed), "--out", str(out_dir), "--max-steps", "4", "--resume", "--dry-run")
    assert code == 2 and out == "" and len(dry_err.strip().splitlines()) == 1, dry_err
    assert "config differs" in dry_err and "method.params.factor" in dry_err
    assert _snapshot(out_dir) == before

    code, out, run_err = run_cli("train", str(changed), "--out", str(out_dir), "--max-steps", "4", "--resume")
    assert code == 2 and out == "" and run_err == dry_err
    assert _snapshot(out_dir) == before

    # the config the run was made with still plans its resume
    code, _, err = run_cli("train", str(config), "--out", str(out_dir), "--max-steps", "2", "--resume", "--dry-run")
    assert code == 0, err
