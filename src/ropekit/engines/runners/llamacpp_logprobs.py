"""Per-token log-probabilities (and greedy continuations) from llama.cpp through llama-cpp-python, for ``ropekit
verify --engine llamacpp``.

Runs under llama.cpp's own Python; see the package docstring for the protocol. ``model`` is a GGUF file. The
context is built the way llama.cpp's own tools build it, except for what makes the comparison about the RoPE and not
the storage: the KV cache in float32 (llama.cpp's default is f16), no flash attention, and logits kept for every
position. Every RoPE and YaRN setting is left to the file (llama.cpp's "from the model" defaults;
llama-cpp-python's own defaults would override the YaRN betas and attention factor). Extra request keys:
``kv_type`` (``f32``, the default, or ``f16``), ``logprobs`` (false: generate only, without keeping logits for every
position; the response's log-probabilities are then ``null``) and ``verbose``.
"""

import json
import os
import sys
import time


def _picked_logprobs(scores, ids, np) -> list:
    """``[None, log p(t_1 | t_0), …]`` from llama-cpp-python's per-position logits: a float64 log-softmax over a few
    rows at a time (all of them at once would be 12k × 49k × 8 bytes = 4.7 GB per temporary on SmolLM2)."""
    targets = np.asarray(ids[1:])
    picked = np.empty(len(ids) - 1, dtype=np.float64)
    for start in range(0, len(ids) - 1, 256):
        rows = np.asarray(scores[start:min(start + 256, len(ids) - 1)], dtype=np.float64)
        top = rows.max(axis=-1)
        norm = top + np.log(np.exp(rows - top[:, None]).sum(axis=-1))
        picked[start:start + len(rows)] = rows[np.arange(len(rows)), targets[start:start + len(rows)]] - norm
    return [None] + [float(v) for v in picked]


def main(request_path: str, response_path: str) -> None:
    with open(request_path) as fh:
        request = json.load(fh)
    started = time.perf_counter()
    import llama_cpp
    import numpy as np

    sequences = request["token_ids"]
    generate = request.get("generate") or {}
    new_tokens = int(generate.get("max_new_tokens", 0))
    longest = max(len(ids) for ids in sequences) + new_tokens
    n_ctx = max(int(request["n_ctx"]), longest)
    score = bool(request.get("logprobs", True))  # False: only generate (no logits kept for every position)
    defaults = llama_cpp.llama_context_default_params()
    kv_type = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16}[request.get("kv_type", "f32")]
    llm = llama_cpp.Llama(
        model_path=request["model"],
        n_ctx=n_ctx,
        n_batch=n_ctx if score else min(n_ctx, 512),  # llama-cpp-python keeps n_batch rows of logits
        n_ubatch=min(n_ctx, 512),  # bounds the attention scratch memory; the sums are the same per query
        n_threads=int(request.get("threads", 1)),
        n_threads_batch=int(request.get("threads", 1)),
        logits_all=score,
        flash_attn=False,
        type_k=kv_type,
        type_v=kv_type,
        # llama.cpp's own defaults: negative = from the model file
        rope_freq_base=0.0,
        rope_freq_scale=0.0,
        yarn_ext_factor=defaults.yarn_ext_factor,
        yarn_attn_factor=defaults.yarn_attn_factor,
        yarn_beta_fast=defaults.yarn_beta_fast,
        yarn_beta_slow=defaults.yarn_beta_slow,
        yarn_orig_ctx=0,
        seed=0,
        verbose=bool(request.get("verbose", False)),
    )
    logprobs, generated = [], []
    for ids in sequences:
        llm.reset()
        llm.eval(list(ids))
        logprobs.append(_picked_logprobs(llm.scores, ids, np) if score else None)
        if new_tokens:
            out = []
            for _ in range(new_tokens):
                if score:
                    last = llm.scores[llm.n_tokens - 1]
                else:  # llama-cpp-python keeps no logits without logits_all: the context's own last row
                    last = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
                token = int(np.argmax(last))
                out.append(token)
                if token == llm.token_eos():
                    break
                llm.eval([token])
            generated.append(out)
    response = {
        "logprobs": logprobs,
        "generated": generated if new_tokens else None,
        "engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})",
        "seconds": time.perf_counter() - started,
    }
    with open(response_path + ".tmp", "w") as fh:
        json.dump(response, fh)
    os.replace(response_path + ".tmp", response_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
