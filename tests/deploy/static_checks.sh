#!/usr/bin/env bash
# Offline checks of deploy/ (ctest: deploy_static). Each step prints what it checks; the first
# failure stops the script with a non-zero exit.
#   promtool check config / check rules / test rules (tests/deploy/prometheus-rules.test.yml)
#   yamllint --strict on every YAML file of the repository (Helm templates excepted: their
#     rendered output is linted by k8s_validate.sh)
#   the dashboards JSON is what deploy/grafana/make_dashboards.py writes, and
#     check_dashboards.py (structure, metric names, docs)
#   docker-compose config on compose.yaml and compose.yaml + compose.gpu.yaml, and their
#     build contexts and bind-mount sources exist
#   check_dockerfiles.py (stages, CI's scripts, non-root, HEALTHCHECK, COPY sources)
#   ShellCheck on the deploy and test shell scripts
#   entrypoint.sh: THETASERVE_FLAG_* variables become the expected serve flags
# Usage: static_checks.sh [REPO_ROOT]
set -euo pipefail
root="$(cd "${1:-$(dirname "$0")/../..}" && pwd)"
cd "$root"

need() {
  command -v "$1" >/dev/null 2>&1 || {
    echo "static_checks: $1 not found (Debian package $2; run scripts/install-deps.sh)" >&2
    exit 1
  }
}
need promtool prometheus
need yamllint yamllint
need docker-compose docker-compose
need shellcheck shellcheck
step() { echo; echo "== $*"; }

# prometheus.yml as compose mounts it: at /etc/prometheus, with the chart's rules/ beside it.
step "promtool check config deploy/prometheus/prometheus.yml (with deploy/k8s/thetaserve/rules as rules/)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
promdir="$tmp/prometheus"
mkdir "$promdir"
cp deploy/prometheus/prometheus.yml "$promdir/"
cp -r deploy/k8s/thetaserve/rules "$promdir/rules"
promtool check config "$promdir/prometheus.yml" | tee "$promdir/check.log"
grep -q "SUCCESS: 2 rule files found" "$promdir/check.log" \
  || { echo "prometheus.yml does not load the chart's two rule files"; exit 1; }

step "promtool check rules deploy/k8s/thetaserve/rules/*.yml"
promtool check rules deploy/k8s/thetaserve/rules/*.yml

step "promtool test rules tests/deploy/prometheus-rules.test.yml"
promtool test rules tests/deploy/prometheus-rules.test.yml

step "yamllint --strict (every *.yaml / *.yml of the repository)"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t yamls < <(git -C "$root" ls-files --cached --others --exclude-standard -- '*.yaml' '*.yml' \
    | grep -v '^deploy/k8s/[^/]*/templates/' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
else
  mapfile -t yamls < <(find . -path ./build -prune -o -path './build-*' -prune -o -path ./.git -prune \
    -o \( -name '*.yaml' -o -name '*.yml' \) -print | sed 's|^\./||' | grep -v '^deploy/k8s/[^/]*/templates/')
fi
printf '  %s\n' "${yamls[@]}"
yamllint --strict -c deploy/.yamllint.yaml "${yamls[@]}"
echo "yamllint: ${#yamls[@]} files clean"

step "Grafana dashboards: generated JSON is current; structure, metric names, docs"
python3 deploy/grafana/make_dashboards.py --check
python3 tests/deploy/check_dashboards.py "$root"

step "docker-compose config (compose.yaml, and with compose.gpu.yaml)"
docker-compose -f deploy/docker/compose.yaml config >"$tmp/cpu.yaml"
docker-compose -f deploy/docker/compose.yaml -f deploy/docker/compose.gpu.yaml config >"$tmp/gpu.yaml"
python3 - "$tmp/cpu.yaml" "$tmp/gpu.yaml" <<'PY'
import os, sys, yaml
bad = []
for path in sys.argv[1:]:
    c = yaml.safe_load(open(path))
    for name, svc in c["services"].items():
        b = svc.get("build")
        if b:
            df = os.path.join(b["context"], b.get("dockerfile", "Dockerfile"))
            if not os.path.isfile(df):
                bad.append("%s: %s: no Dockerfile %s" % (path, name, df))
        for v in svc.get("volumes", []):
            src = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
            if src.startswith("/") and not os.path.exists(src):
                bad.append("%s: %s: bind-mount source %s does not exist" % (path, name, src))
    gpu = c["services"]["thetaserve"].get("deploy", {}).get("resources", {}).get("reservations", {})
    print("compose %s: services %s%s" % (os.path.basename(path), ", ".join(sorted(c["services"])),
                                        ", GPU reserved" if gpu.get("devices") else ""))
for b in bad:
    print("compose: " + b)
sys.exit(1 if bad else 0)
PY

step "Dockerfiles"
python3 tests/deploy/check_dockerfiles.py "$root"

step "shellcheck"
shellcheck -x deploy/docker/*.sh tests/deploy/*.sh scripts/*.sh scripts/lib/*.sh
echo "shellcheck: clean"

step "entrypoint.sh: THETASERVE_FLAG_* -> serve flags"
got="$(env -i PATH="$PATH" THETASERVE_HOME=/opt/thetaserve THETASERVE_FLAG_KV_CACHE_MEMORY=2G \
  THETASERVE_FLAG_MAX_NUM_SEQS=8 THETASERVE_FLAG_THREADS= THETASERVE_FLAG_NO_VMC=true \
  THETASERVE_FLAG_EXACT_TOP_K=false bash deploy/docker/entrypoint.sh print-args --max-queue 3 \
  | tr '\n' ' ')"
want="/opt/thetaserve/bin/thetaserve serve --model /opt/thetaserve/models/SmolLM2-135M-Instruct.Q4_1.gguf --kv-cache-memory 2G --max-num-seqs 8 --no-vmc --max-queue 3 "
if [ "$got" != "$want" ]; then
  echo "entrypoint print-args: got  '$got'" >&2
  echo "                       want '$want'" >&2
  exit 1
fi
echo "entrypoint: ok"
# --prefix-caching on|off: YAML reads an unquoted on/off as a boolean (Helm renders it "true" /
# "false"); both reach serve as on/off, never as a bare flag or nothing.
for pair in false:off true:on off:off on:on; do
  given="${pair%%:*}" wanted="${pair##*:}"
  got="$(env -i PATH="$PATH" THETASERVE_HOME=/opt/thetaserve THETASERVE_FLAG_PREFIX_CACHING="$given" \
    bash deploy/docker/entrypoint.sh print-args | tr '\n' ' ')"
  case "$got" in
    *" --prefix-caching $wanted ") ;;
    *) echo "entrypoint: THETASERVE_FLAG_PREFIX_CACHING=$given gave '$got'" >&2; exit 1 ;;
  esac
done
echo "entrypoint: --prefix-caching on/off, quoted or read as booleans: ok"
# print-args shows an API key as the serve log does: *** (it printed it in clear).
got="$(env -i PATH="$PATH" THETASERVE_HOME=/opt/thetaserve THETASERVE_FLAG_API_KEY=s3cret \
  bash deploy/docker/entrypoint.sh print-args | tr '\n' ' ')"
case "$got" in
  *s3cret*) echo "entrypoint print-args showed the API key: '$got'" >&2; exit 1 ;;
  *"--api-key ***"*) echo "entrypoint: print-args masks the API key: ok" ;;
  *) echo "entrypoint print-args lost --api-key: '$got'" >&2; exit 1 ;;
esac
if env -i PATH="$PATH" THETASERVE_HOME="$tmp" THETASERVE_MODEL="$tmp/none.gguf" \
    bash deploy/docker/entrypoint.sh serve 2>"$tmp/err"; then
  echo "entrypoint serve with a missing non-default model should fail" >&2
  exit 1
fi
grep -q "does not exist" "$tmp/err" || { cat "$tmp/err"; exit 1; }
echo "entrypoint: a missing mounted model is refused: ok"

echo
echo "static_checks: all passed"
