"""Every method's exports in every format on tiny models, as file hashes and one-line refusals: run it before and
after a refactor of install/ or methods/ and compare the two JSON files (they must be equal, apart from methods
added in between). Deterministic on one machine and library versions; not a stored golden file, since
config.json carries transformers' version.

    PYTHONPATH=src python scripts/export_snapshot.py before.json   # on the old commit
    PYTHONPATH=src python scripts/export_snapshot.py after.json    # on the new one; then diff the two
"""
import hashlib, json, sys, shutil
from pathlib import Path
import torch
torch.set_num_threads(1)
import ropekit
from ropekit.methods import list_methods
from ropekit.models.tiny import build_tiny_model
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.install import save_pretrained, inspect_model, rope_info
from ropekit.install.gguf_export import write_gguf
from ropekit.install.vllm import vllm_serving
from ropekit.install.capabilities import why_not, model_features

out = {}
import tempfile
work = Path(tempfile.mkdtemp(prefix="ropekit-snapshot-"))

def h(p: Path):
    if p.is_file():
        return hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest()[:16] for f in sorted(p.iterdir()) if f.is_file()}

def attempt(key, fn):
    try:
        out[key] = fn()
    except Exception as e:
        out[key] = f"REFUSED {type(e).__name__}: {e}"

VARIANTS = {"ntk_by_parts": [{"ramp": "dim"}], "dual_chunk": [{"chunk_size": 48, "local_size": 16}],
            "yarn": [{"truncate": False}], "dynamic_ntk": [{"trained_length": 128}]}
BASES = ["llama", "llama3", "qwen2", "phi3.5"]
target = sys.argv[1]
only = sys.argv[2:] or None
for base in BASES:
    model0 = build_tiny_model(base)
    info0 = rope_info(model0)
    attempt(f"{base}/inspect", lambda: json.loads(json.dumps(inspect_model(model0), default=str)))
    feats = model_features(model0)
    for m in list_methods():
        if only and m.name not in only: continue
        r = why_not(m, info0, feats)
        out[f"{base}/{m.name}/why_not"] = None if r is None else list(r)
        if r is not None: continue
        for vi, extra in enumerate([{}] + VARIANTS.get(m.name, [])):
            params = {**m.example_params(info0), **extra}
            key = f"{base}/{m.name}/{vi}"
            try:
                model = build_tiny_model(base)
                ropekit.extend(model, m.name, **params)
            except Exception as e:
                out[key] = f"EXTEND REFUSED {type(e).__name__}: {e}"; continue
            attempt(f"{key}/inspect", lambda: json.loads(json.dumps(inspect_model(model), default=str)))
            for fmt in ("auto", "native", "longrope", "ropekit"):
                for fl in (None, 128):
                    if fl and fmt != "longrope": continue
                    d = work / f"{key.replace('/', '_')}_{fmt}_{fl}"
                    def go():
                        rep = save_pretrained(model, d, byte_tokenizer(), rope_format=fmt, freeze_length=fl)
                        rep = {k: v for k, v in rep.items() if k != "path"}
                        v = vllm_serving(d)
                        return {"report": json.loads(json.dumps(rep, default=str)), "files": h(d),
                                "vllm": [v.exact, v.why, v.max_model_len, v.hf_overrides, v.command.replace(str(d), "DIR"), v.env]}
                    attempt(f"{key}/save/{fmt}/{fl}", go)
                    shutil.rmtree(d, ignore_errors=True)
            if base == "llama" or base == "llama3":
                for fl in (None, 128):
                    p = work / f"{key.replace('/', '_')}_{fl}.gguf"
                    def g():
                        rep = write_gguf(model, byte_tokenizer(), p, outtype="f32", freeze_length=fl)
                        rep = {k: v for k, v in rep.items() if k != "path"}
                        return {"report": json.loads(json.dumps(rep, default=str)), "hash": h(p)}
                    attempt(f"{key}/gguf/{fl}", g)
                    if p.exists(): p.unlink()
json.dump(out, open(target, "w"), indent=1, sort_keys=True)
shutil.rmtree(work, ignore_errors=True)
print(len(out), "entries")
