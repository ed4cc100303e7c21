#!/usr/bin/env bash
# Top-θ fidelity study on SmolLM2: calibrate on KJV, evaluate on Austen (disjoint), dense vs
# Top-θ at several k, placements, compensations, V policies and contexts, plus exact top-k
# (the paper's baseline). Appends one JSON line per configuration to $OUT/fidelity.jsonl and
# draws plots with scripts/plot_fidelity.py.
#
#   scripts/fidelity-study.sh            # full study (about two hours on 2 cores)
#   QUICK=1 scripts/fidelity-study.sh    # context 2048 only
#
# Resumable: every finished configuration is recorded in $OUT/fidelity.done ("context flags"),
# and a rerun skips it, so an interrupted study continues where it stopped (for the same model
# and token counts; the file's first line says which). Starting over means removing both
# fidelity.done and fidelity.jsonl: rows are appended.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/thetaserve}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-out/fidelity}
CAL_TOKENS=${CAL_TOKENS:-8192}
EVAL_TOKENS=${EVAL_TOKENS:-4096}
mkdir -p "$OUT"
[ -x "$BIN" ] || bash scripts/build.sh
[ -f data/kjv.txt ] || bash scripts/fetch-corpora.sh
RESULTS="$OUT/fidelity.jsonl"
DONE="$OUT/fidelity.done"
# A resume is only valid for the same evaluation: the done file starts with what it was for.
SIGNATURE="# model=$(basename "$MODEL") eval-tokens=$EVAL_TOKENS cal-tokens=$CAL_TOKENS"
if [ ! -s "$DONE" ]; then
  echo "$SIGNATURE" > "$DONE"
elif [ "$(head -1 "$DONE")" != "$SIGNATURE" ]; then
  echo "fidelity-study: $DONE was written for '$(head -1 "$DONE")', not '$SIGNATURE':" \
       "move it and $RESULTS away to start over" >&2
  exit 2
fi
# The policy-sparse configuration the 2048 study chose (docs/results.md, "Which V rows to
# store"): 512 recent rows plus the 7% of older rows with the most retained mass.
SPARSE=(--policy sparse --local-window 512 --keep-fraction 0.07)

if [ "${QUICK:-0}" = 1 ]; then
  KS=(16 32 64 128); PLACEMENTS=(post pre); CONTEXTS=(2048)
else
  KS=(16 32 64 128); PLACEMENTS=(post pre); CONTEXTS=(512 2048 8192)
fi

theta_file() {  # calibrates on first use
  local f="$OUT/theta_k$1_$2.json"
  if [ ! -f "$f" ]; then
    echo "== calibrate k=$1 placement=$2" >&2
    "$BIN" calibrate --model "$MODEL" --corpus data/kjv.txt --k "$1" --placement "$2" \
      --context 2048 --max-tokens "$CAL_TOKENS" --out "$f" >&2
  fi
  echo "$f"
}

run() {  # context, then eval flags
  local ctx=$1; shift
  local tokens=$EVAL_TOKENS key="$ctx $*"
  [ "$ctx" -gt "$tokens" ] && tokens=$ctx
  if grep -qxF -- "$key" "$DONE"; then echo "== done already: context=$ctx $*"; return; fi
  echo "== eval context=$ctx $* ($(date -u +%H:%M:%S))"
  "$BIN" eval --model "$MODEL" --text data/austen.txt --context "$ctx" --max-tokens "$tokens" \
    --out "$RESULTS" "$@" | tail -1
  echo "$key" >> "$DONE"
}

# Most informative first: k=64 post-softmax with both policies, the compensation ablations
# and the exact top-k baseline, then the other k and the pre-softmax placement.
for ctx in "${CONTEXTS[@]}"; do
  f=$(theta_file 64 post)
  run "$ctx" --theta "$f"                                    # SDC exact + VMC, policy full
  run "$ctx" --theta "$f" --policy sparse                    # the design's rule: any hit in the tail
  run "$ctx" --theta "$f" "${SPARSE[@]}"                      # mass budget
  run "$ctx" --theta "$f" --sdc none --no-vmc                # no compensation
  run "$ctx" --theta "$f" --sdc exact --no-vmc               # SDC only
  run "$ctx" --theta "$f" --sdc none                         # VMC only
  run "$ctx" --theta "$f" --exact-top-k                      # exact top-k, same compensation
  run "$ctx" --theta "$f" --exact-top-k --sdc none --no-vmc  # exact top-k, plain
  f=$(theta_file 64 pre)
  run "$ctx" --theta "$f"
  run "$ctx" --theta "$(theta_file 64 post)" --sdc exp-threshold
  run "$ctx" --theta "$(theta_file 64 post)" --sdc offline
  for p in "${PLACEMENTS[@]}"; do
    for k in "${KS[@]}"; do
      [ "$k" = 64 ] && continue
      f=$(theta_file "$k" "$p")
      run "$ctx" --theta "$f"
      if [ "$p" = post ]; then run "$ctx" --theta "$f" "${SPARSE[@]}"; fi
    done
  done
done
PY=python3
if ! python3 -c "import matplotlib" 2>/dev/null; then
  python3 -m venv build/plot-venv && build/plot-venv/bin/pip install -q matplotlib && PY=build/plot-venv/bin/python
fi
"$PY" scripts/plot_fidelity.py "$RESULTS" docs/plots | tee "$OUT/fidelity_table.md"
