# Rounds of a measurement, each configuration a fresh server, and the medians of the rounds
# (sourced after serve.sh; bash).
#
#   round_serve() { serve_start "$log/server.log" "$bin" serve ... ; }   # for configuration $1
#   round_client() { python3 bench/serve/... ; }    # measures $1's server, prints a JSON line
#   rounds "$log/results" --scheduling-policy fcfs priority
#   rounds_medians "$log/results" policy "urgent_ttft_s:urgent TTFT s:.2f" ...
#
# rounds_setup (from the repository root) sets bin (THETASERVE_BIN, else build/thetaserve, built
# when missing) and model (the default model, fetched when missing), makes a temporary folder
# $log, and on exit stops the server and removes it.
# rounds RESULTS NAME CONFIG... runs REPEATS rounds (the caller sets it); in each, for each
# CONFIG, round_serve starts a server, round_client measures, its line is printed as
# "round R/REPEATS, NAME CONFIG: LINE" and kept in RESULTS, and serve_stop stops the server.
# round_client runs inside $(...), where bash turns -e off: its last command's failure is what
# stops the script.
# rounds_medians RESULTS HEADER KEY:TITLE:FORMAT... prints a blank line and a table: a row per
# configuration (in the rounds' order) under HEADER, its number of rounds, then for each column
# the median of KEY over its rounds' JSON lines, formatted with FORMAT (".2f") under TITLE.
# shellcheck shell=bash

rounds_setup() {
  bin="${THETASERVE_BIN:-$PWD/build/thetaserve}"
  model="$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  [ -f "$model" ] || bash scripts/fetch-model.sh
  [ -x "$bin" ] || bash scripts/build.sh
  log=$(mktemp -d)
  trap 'serve_stop; rm -rf "$log"' EXIT
}

rounds() {
  local results=$1 name=$2 rep config line
  shift 2
  for rep in $(seq "$REPEATS"); do
    for config in "$@"; do
      round_serve "$config"
      line=$(round_client "$config")
      echo "round $rep/$REPEATS, $name $config: $line"
      echo "$config $line" >> "$results"
      serve_stop
    done
  done
}

rounds_medians() {
  python3 - "$@" <<'PY'
import json, statistics, sys
results, header, columns = sys.argv[1], sys.argv[2], [c.split(":") for c in sys.argv[3:]]
rows = {}
for line in open(results):
    config, js = line.split(" ", 1)
    rows.setdefault(config, []).append(json.loads(js))
# A column is as wide as its title and one space (the first also as its longest configuration),
# and a space apart from the next; the last is not padded.
first = max([len(header)] + [len(c) for c in rows]) + 1
titles = [header.ljust(first), "rounds "] + [title + " " for _, title, _ in columns]
print("\n" + " ".join(titles) + " (medians)")
for config, r in rows.items():
    cells = [f"{config:<{first}}", f"{len(r):<7}"]
    for i, (key, title, fmt) in enumerate(columns):
        width = "" if i == len(columns) - 1 else f"<{len(title) + 1}"
        cells.append(f"{statistics.median(x[key] for x in r):{width}{fmt}}")
    print(" ".join(cells))
PY
}
