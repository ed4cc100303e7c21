#!/usr/bin/env bash
# Perplexity of a text through the serving path — the OpenAI completions API with echo,
# logprobs and max_tokens 0, on a running `thetaserve serve` — against `thetaserve eval` on
# the same tokens (one window of exactly the prompt's length). The two compute the same
# log-likelihoods, so they should agree; extra flags go to both (e.g. --theta FILE for Top-θ,
# --kv-cache-dtype f32).
#
#   scripts/score-check.sh
#   CHARS=8000 scripts/score-check.sh --theta thetas.json
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/thetaserve}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
TEXT=${TEXT:-data/austen.txt}
CHARS=${CHARS:-5000}
PORT=${PORT:-53051}
HPORT=${HPORT:-53080}
source scripts/lib/serve.sh
work=$(mktemp -d)
trap 'serve_stop; rm -rf "$work"' EXIT
SERVE_PROBE=("$BIN" health --addr "127.0.0.1:$PORT")

# The first CHARS characters of the text, cut at a space.
python3 - "$TEXT" "$CHARS" "$work/text.txt" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()[: int(sys.argv[2])]
open(sys.argv[3], "w", encoding="utf-8").write(text[: text.rfind(" ")])
PY

echo "== serve $* (HTTP on $HPORT)"
serve_start "$work/serve.log" "$BIN" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
  --metrics-port 0 --http-port "$HPORT" "$@"
read -r tokens api_ppl < <(python3 - "$HPORT" "$work/text.txt" <<'PY'
import json, math, sys, urllib.request
text = open(sys.argv[2], encoding="utf-8").read()
body = json.dumps({"prompt": text, "echo": True, "logprobs": 0, "max_tokens": 0}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", body,
                             {"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=600))
lp = r["choices"][0]["logprobs"]["token_logprobs"]
assert lp[0] is None and all(x is not None for x in lp[1:])
print(len(lp), math.exp(-sum(lp[1:]) / (len(lp) - 1)))
PY
)
serve_stop

echo "== eval $* (one window of $tokens tokens)"
# eval's progress goes to a file, shown when it fails (a flag serve takes and eval does not
# ended the script with no word).
if ! eval_out=$("$BIN" eval --model "$MODEL" --text "$work/text.txt" --context "$tokens" \
    --max-tokens "$tokens" "$@" 2>"$work/eval.log"); then
  echo "score-check: eval failed:" >&2
  tr '\r' '\n' < "$work/eval.log" | tail -5 >&2
  exit 1
fi
eval_ppl=$(printf '%s\n' "$eval_out" | python3 -c '
import json, sys
for line in sys.stdin:
    if line.startswith("{"): print(json.loads(line)["perplexity"])')
python3 - "$tokens" "$api_ppl" "$eval_ppl" <<'PY'
import sys
n, api, ev = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
print(f"{n} tokens: perplexity through the API {api:.5f}, thetaserve eval {ev:.5f}, "
      f"difference {100 * (api / ev - 1):+.4f}%")
PY
