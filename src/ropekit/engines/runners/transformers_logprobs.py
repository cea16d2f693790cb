"""Per-token log-probabilities (and greedy continuations) from plain transformers, for ``ropekit verify --engine
transformers``: the exported directory loaded with ``AutoModelForCausalLM.from_pretrained`` and nothing of ropekit.

See the package docstring for the protocol; ``n_ctx`` is not used (transformers has no context size to set).
"""

import json
import os
import sys
import time


def main(request_path: str, response_path: str) -> None:
    request = json.loads(open(request_path).read())
    started = time.perf_counter()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    if "ropekit" in sys.modules:
        raise SystemExit("the transformers runner must run without ropekit")
    torch.set_num_threads(int(request.get("threads", 1)))
    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=torch.float32).eval()
    generate = request.get("generate") or {}
    new_tokens = int(generate.get("max_new_tokens", 0))
    eos = model.config.eos_token_id  # one id, or several (Llama 3.1 Instruct): the first pads
    pad_id = (eos[0] if eos else 0) if isinstance(eos, (list, tuple)) else (eos if eos is not None else 0)
    logprobs, generated = [], []
    with torch.no_grad():
        for ids in request["token_ids"]:
            tokens = torch.tensor([ids])
            log = torch.log_softmax(model(tokens).logits[0].double(), dim=-1)
            picked = log[:-1].gather(-1, tokens[0, 1:, None])[:, 0]
            logprobs.append([None] + [float(v) for v in picked])
            if new_tokens:
                out = model.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=new_tokens,
                                     do_sample=False, pad_token_id=pad_id)
                generated.append(out[0, len(ids):].tolist())
    response = {
        "logprobs": logprobs,
        "generated": generated if new_tokens else None,
        "engine": f"transformers {transformers.__version__}",
        "seconds": time.perf_counter() - started,
    }
    with open(response_path + ".tmp", "w") as fh:
        json.dump(response, fh)
    os.replace(response_path + ".tmp", response_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
