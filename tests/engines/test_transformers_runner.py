"""The plain-transformers runner of ``ropekit verify`` (run as its own script, as verify runs it): its greedy
continuation equals transformers' ``generate`` for a model whose ``eos_token_id`` is a list (Llama 3.1 Instruct's
form), where it passed the list as ``pad_token_id`` and transformers refused the generation config."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from ropekit.models.tiny import build_tiny_model
from ropekit.engines.runners import transformers_logprobs


def test_generation_with_several_end_tokens(tmp_path):
    model = build_tiny_model("llama").eval()
    model.config.eos_token_id = [0, 5]
    model.generation_config.eos_token_id = [0, 5]
    model.save_pretrained(tmp_path / "model")
    ids = [3, 17, 42, 9, 100, 7]
    request = {"model": str(tmp_path / "model"), "token_ids": [ids], "threads": 1, "generate": {"max_new_tokens": 6}}
    (tmp_path / "request.json").write_text(json.dumps(request))
    done = subprocess.run([sys.executable, transformers_logprobs.__file__, str(tmp_path / "request.json"),
                           str(tmp_path / "response.json")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    response = json.loads((tmp_path / "response.json").read_text())
    with torch.no_grad():
        tokens = torch.tensor([ids])
        expected = model.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=6, do_sample=False,
                                  pad_token_id=0)[0, len(ids):].tolist()
        log = torch.log_softmax(model(tokens).logits[0].double(), -1)
    assert response["generated"] == [expected]
    assert response["logprobs"][0][0] is None
    torch.testing.assert_close(torch.tensor(response["logprobs"][0][1:], dtype=torch.float64),
                               log[:-1].gather(-1, tokens[0, 1:, None])[:, 0], atol=1e-6, rtol=0)
