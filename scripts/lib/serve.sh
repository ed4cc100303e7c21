# Starting and stopping a server for the measurement scripts (sourced; bash).
#
#   SERVE_PROBE=(curl -sf --max-time 5 "localhost:$PORT/health")    # or: ("$BIN" health --addr ...)
#   serve_start "$log/server.log" "$BIN" serve --model "$MODEL" ...
#   ...
#   serve_stop
#
# serve_start runs the command in the background with its output in LOG (SERVE_PID) and waits
# up to SERVE_WAIT seconds (60) until "${SERVE_PROBE[@]}" succeeds; if the server exits first
# or never answers, it prints the log's tail and returns 1 (set -e stops the script; inside
# $(...), where bash turns -e off, follow it with || exit 1).
# serve_stop sends SIGTERM and waits; it does nothing when no server is up, so it can sit in an
# EXIT trap.
# shellcheck shell=bash

SERVE_PID=
SERVE_PROBE=()

serve_start() {
  local log=$1
  shift
  if [ "${#SERVE_PROBE[@]}" -eq 0 ]; then
    echo "serve_start: set SERVE_PROBE to a command that succeeds once the server answers" >&2
    return 1
  fi
  "$@" >"$log" 2>&1 &
  SERVE_PID=$!
  local deadline=$((SECONDS + ${SERVE_WAIT:-60}))
  until "${SERVE_PROBE[@]}" >/dev/null 2>&1; do
    if ! kill -0 "$SERVE_PID" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
      if kill -0 "$SERVE_PID" 2>/dev/null; then
        echo "the server did not answer ${SERVE_PROBE[*]} within ${SERVE_WAIT:-60} s: $*" >&2
      else
        echo "the server exited before it answered: $*" >&2
      fi
      tail -20 "$log" >&2
      serve_stop
      return 1
    fi
    sleep 0.3
  done
}

serve_stop() {
  [ -n "$SERVE_PID" ] || return 0
  kill -TERM "$SERVE_PID" 2>/dev/null || true
  wait "$SERVE_PID" 2>/dev/null || true
  SERVE_PID=
}
