#!/usr/bin/env bash
# Renders and validates the Helm chart offline (ctest: deploy_k8s): sets up build/deploy-venv
# with tests/deploy/requirements.txt (helm-python-sdk: Helm's Go SDK in a wheel;
# kubernetes-validate: the Kubernetes schemas), runs k8s_validate.py, then yamllint on the
# rendered manifests (build/deploy-k8s/*.yaml; without the line-length rule for *-files.yaml, the
# PrometheusRule and the dashboards ConfigMap: the rule files, linted as they are by
# static_checks.sh, and the dashboards' JSON).
# Usage: k8s_validate.sh THETASERVE_BINARY
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${1:?usage: k8s_validate.sh THETASERVE_BINARY}"
venv="$root/build/deploy-venv"
req="$root/tests/deploy/requirements.txt"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$venv/requirements.txt" \
    || ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
  echo "k8s_validate: setting up $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
  cp "$req" "$venv/requirements.txt"
fi
out="$root/build/deploy-k8s"
rm -rf "$out"
"$venv/bin/python" "$root/tests/deploy/k8s_validate.py" "$root" "$bin" "$out"
echo "yamllint --strict on the rendered manifests:"
shopt -s nullglob
manifests=() files=()
for f in "$out"/*.yaml; do
  case "$f" in *-files.yaml) files+=("$f") ;; *) manifests+=("$f") ;; esac
done
yamllint --strict -c "$root/deploy/.yamllint.yaml" "${manifests[@]}"
printf '  clean: %s\n' "${manifests[@]}"
if [ "${#files[@]}" -gt 0 ]; then
  yamllint --strict -d "{extends: $root/deploy/.yamllint.yaml, rules: {line-length: disable}}" \
    "${files[@]}"
  printf '  clean (line-length aside): %s\n' "${files[@]}"
fi
echo "k8s_validate: passed"
