#!/usr/bin/env bash
# Entry point of the thetaserve images (deploy/docker/Dockerfile, Dockerfile.cpu); the Helm
# chart and compose.yaml use it too.
#
#   entrypoint.sh serve [FLAG...]   run `thetaserve serve` (the default command)
#   entrypoint.sh fetch-model       fetch the default model with scripts/fetch-model.sh, exit
#   entrypoint.sh health            gRPC health check (the image's HEALTHCHECK), exit 0 = SERVING
#   entrypoint.sh print-args        print the serve command line it would run, one word a line
#   entrypoint.sh ANYTHING...       run `thetaserve ANYTHING...` (client, generate, eval, --help)
#
# Configuration through the environment (so compose files and Kubernetes ConfigMaps can set it):
#   THETASERVE_MODEL        model path (default $THETASERVE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   THETASERVE_FETCH_MODEL  auto (default): fetch the default model with scripts/fetch-model.sh
#                           when it is missing; always: run fetch-model.sh (it checks the sha256
#                           and does nothing when the file is right); never: the model must be
#                           mounted
#   THETASERVE_FLAG_<NAME>  becomes `--<name> VALUE` on the serve command line, NAME lowercased
#                           and _ turned into -: THETASERVE_FLAG_KV_CACHE_MEMORY=2G gives
#                           --kv-cache-memory 2G; an empty value is left out. The switches
#                           (flags that take no value, such as --no-vmc) take true (the bare
#                           flag) or false (left out); --prefix-caching takes on|off, and true
#                           or false (YAML's reading of an unquoted on or off) as those. Unknown
#                           flags make the server refuse to start (it names the flag).
#   THETASERVE_API_KEY      read by the server itself (--api-key)
#   THETASERVE_HOME         install root (default: the folder above this script's bin/)
#   THETASERVE_PYTHON       python with the grpc module, for `health` (default python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
home="${THETASERVE_HOME:-$(dirname "$here")}"
bin="${THETASERVE_BIN:-$home/bin/thetaserve}"
default_model="$home/models/SmolLM2-135M-Instruct.Q4_1.gguf"
model="${THETASERVE_MODEL:-$default_model}"
fetch="${THETASERVE_FETCH_MODEL:-auto}"

log() { echo "entrypoint: $*" >&2; }

flag_value() {  # flag_value NAME -> the value of THETASERVE_FLAG_NAME, or nothing
  local var="THETASERVE_FLAG_$1"
  printf '%s' "${!var:-}"
}

serve_args() {  # fills the array `args` with the serve command line
  args=("$bin" serve --model "$model")
  local var name value
  while read -r var; do
    [[ "$var" == THETASERVE_FLAG_* ]] || continue
    value="${!var}"
    [ -n "$value" ] || continue
    name="${var#THETASERVE_FLAG_}"
    name="${name,,}"
    name="${name//_/-}"
    case "$name:$value" in
      # --prefix-caching takes on|off, which YAML (Helm values, compose) reads as booleans: an
      # unquoted off reached here as false and was dropped (caching stayed on), on as a bare
      # --prefix-caching, which the server refuses.
      prefix-caching:true) args+=("--$name" on) ;;
      prefix-caching:false) args+=("--$name" off) ;;
      *:true) args+=("--$name") ;;  # a switch (--no-vmc, --exact-top-k)
      *:false) ;;
      *) args+=("--$name" "$value") ;;
    esac
  done < <(compgen -e | LC_ALL=C sort)
}

fetch_model() {
  local script="$home/scripts/fetch-model.sh"
  [ -x "$script" ] || [ -f "$script" ] || { log "missing $script"; exit 1; }
  PIP_NO_CACHE_DIR=1 bash "$script"
}

ensure_model() {
  case "$fetch" in
    always)
      if [ "$model" != "$default_model" ]; then
        log "THETASERVE_FETCH_MODEL=always fetches only the default model ($default_model), not $model"
        exit 1
      fi
      fetch_model ;;
    auto)
      if [ ! -e "$model" ]; then
        if [ "$model" = "$default_model" ]; then
          log "$model is missing: fetching it with scripts/fetch-model.sh"
          fetch_model
        else
          log "model $model does not exist: mount it there (THETASERVE_FETCH_MODEL=auto fetches only the default model)"
          exit 1
        fi
      fi ;;
    never)
      [ -e "$model" ] || { log "model $model does not exist and THETASERVE_FETCH_MODEL=never"; exit 1; } ;;
    *)
      log "THETASERVE_FETCH_MODEL must be auto, always or never (got '$fetch')"
      exit 1 ;;
  esac
}

# shown: the words given with an API key's value as *** (for the log and print-args, which
# printed it in clear).
masked() {
  shown=("$@")
  for i in "${!shown[@]}"; do
    if [ "${shown[$i]}" = "--api-key" ] && [ $((i + 1)) -lt ${#shown[@]} ]; then shown[i + 1]="***"; fi
  done
}

cmd="${1:-serve}"
[ $# -gt 0 ] && shift
case "$cmd" in
  serve)
    ensure_model
    serve_args
    masked "${args[@]}" "$@"
    log "exec ${shown[*]}"
    exec "${args[@]}" "$@" ;;
  print-args)
    serve_args
    masked "${args[@]}" "$@"
    printf '%s\n' "${shown[@]}" ;;
  fetch-model)
    fetch_model ;;
  health)
    port="$(flag_value PORT)"
    tls=()
    if [ -n "$(flag_value TLS_CERT)" ]; then
      tls=(--tls-ca "$(flag_value TLS_CERT)" --server-name "${THETASERVE_HEALTHCHECK_SERVER_NAME:-localhost}")
    fi
    exec "${THETASERVE_PYTHON:-python3}" "$here/healthcheck.py" --addr "127.0.0.1:${port:-50051}" \
      --service "${THETASERVE_HEALTHCHECK_SERVICE:-}" "${tls[@]}" "$@" ;;
  *)
    exec "$bin" "$cmd" "$@" ;;
esac
