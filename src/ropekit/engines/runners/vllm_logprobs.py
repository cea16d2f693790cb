"""Per-token log-probabilities (and greedy continuations) from vLLM, for ``ropekit verify --engine vllm``.

Runs under vLLM's own Python; see the package docstring for the protocol. Extra request keys: ``hf_overrides``
(config values vLLM should use instead of config.json's, e.g. its own names for RoPE keys) and ``dtype``.
"""

import json
import os
import sys
import time


def main(request_path: str, response_path: str) -> None:
    request = json.loads(open(request_path).read())
    started = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    sequences = request["token_ids"]
    generate = request.get("generate") or {}
    new_tokens = int(generate.get("max_new_tokens", 0))
    llm = LLM(
        model=request["model"],
        dtype=request.get("dtype", "float32"),
        max_model_len=int(request["n_ctx"]),
        hf_overrides=request.get("hf_overrides") or None,
        enforce_eager=True,  # no graph capture on CPU: the first request is the measurement
        seed=0,
    )
    # prompt_logprobs=0 returns the log-probability of each prompt token itself (plus none of the alternatives)
    params = SamplingParams(max_tokens=max(1, new_tokens), temperature=0.0, prompt_logprobs=0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in sequences], params)
    logprobs, generated = [], []
    for ids, output in zip(sequences, outputs):
        row = []
        for position, entry in enumerate(output.prompt_logprobs):
            row.append(None if entry is None else float(entry[ids[position]].logprob))
        logprobs.append(row)
        generated.append(list(output.outputs[0].token_ids)[:new_tokens])
    response = {
        "logprobs": logprobs,
        "generated": generated if new_tokens else None,
        "engine": f"vLLM {vllm.__version__}",
        "seconds": time.perf_counter() - started,
    }
    with open(response_path + ".tmp", "w") as fh:
        json.dump(response, fh)
    os.replace(response_path + ".tmp", response_path)


if __name__ == "__main__":  # vLLM starts worker processes: the guard keeps them from re-running this
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's engine threads can abort the interpreter's own teardown ("terminate called without an active
    # exception") after the work is done and written; leave without it
    os._exit(0)
