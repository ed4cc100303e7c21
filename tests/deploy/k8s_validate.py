#!/usr/bin/env python3
"""Renders the Helm chart deploy/k8s/thetaserve offline with Helm's own template engine
(helm-python-sdk) for several sets of values, and checks what comes out:

1. `helm lint --strict` (kube version 1.30) passes for each values set;
2. values.schema.json refuses bad values (a flag the chart owns, a GPU count of 0, a typo);
3. every rendered object validates against the Kubernetes OpenAPI schemas of 1.27 (the chart's
   kubeVersion floor), 1.30 and the newest kubernetes-validate ships, strictly (unknown fields
   fail); the ServiceMonitor and the PrometheusRule, custom resources those schemas lack,
   against tests/deploy/servicemonitor.schema.json and prometheusrule.schema.json;
4. the objects fit together: Service target ports and probe ports exist on the container, the
   ServiceMonitor selects the Service and scrapes its metrics port, the PrometheusRule holds
   exactly the groups of the chart's rules/*.yml (the files compose's Prometheus loads and
   promtool checks and tests), the dashboards ConfigMap holds exactly the chart's
   dashboards/*.json (the files compose's Grafana provisions), the HPA targets the
   Deployment with a metric prometheus-adapter-values.yaml serves, the PDB selects the pods,
   terminationGracePeriodSeconds covers preStop + drain, the probes are native gRPC probes on
   the health service, the GPU request and node selector follow gpu.enabled;
5. every serve flag the chart's ConfigMap, extraArgs and deploy/docker/compose*.yaml set is a
   flag of `thetaserve serve --help`.

The rendered manifests are written to OUT_DIR/<values set>.yaml for yamllint and for people; the
two objects that carry the chart's files (the PrometheusRule, whose folded expressions Helm's
toYaml writes on one line, and the dashboards ConfigMap's JSON), to OUT_DIR/<values set>-files.yaml.
Usage: k8s_validate.py REPO_ROOT THETASERVE_BINARY OUT_DIR
"""
import json
import os
import re
import subprocess
import sys

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

root, binary, out_dir = sys.argv[1:4]
chart_dir = os.path.join(root, "deploy/k8s/thetaserve")
KUBE_VERSIONS = ["1.27.0", "1.30.0", kubernetes_validate.utils.latest_version()]
# Flags the chart can set before the server has them: --theta arrives with issue 5 (Top-θ).
errors = []


def err(msg):
    errors.append(msg)
    print("  FAIL " + msg)


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


help_text = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True).stdout
help_text += subprocess.run([binary, "serve", "--help"], capture_output=True, text=True).stderr
server_flags = set(re.findall(r"--([a-z][a-z0-9-]*)", help_text))
if "kv-cache-memory" not in server_flags:
    err("could not read the flags of `%s serve --help`" % binary)


def check_flag(where, flag):
    if flag in server_flags:
        return
    err("%s sets --%s, which is not a flag of `thetaserve serve`" % (where, flag))


sm_schema = load_yaml(os.path.join(root, "tests/deploy/servicemonitor.schema.json"))
rule_schema = load_yaml(os.path.join(root, "tests/deploy/prometheusrule.schema.json"))
CR_SCHEMAS = {"ServiceMonitor": sm_schema, "PrometheusRule": rule_schema}
rule_groups = []
for rule_file in sorted(os.listdir(os.path.join(chart_dir, "rules"))):
    if rule_file.endswith(".yml"):
        rule_groups.extend(load_yaml(os.path.join(chart_dir, "rules", rule_file))["groups"])
if not rule_groups:
    err("no rule groups in %s/rules/*.yml" % chart_dir)
dashboards = {}
for dash_file in sorted(os.listdir(os.path.join(chart_dir, "dashboards"))):
    if dash_file.endswith(".json"):
        with open(os.path.join(chart_dir, "dashboards", dash_file), encoding="utf-8") as f:
            dashboards[dash_file] = json.load(f)
if len(dashboards) != 2:
    err("expected the two dashboards in %s/dashboards, found %s" % (chart_dir, sorted(dashboards)))
adapter = load_yaml(os.path.join(root, "deploy/k8s/prometheus-adapter-values.yaml"))
adapter_metrics = {r["name"]["as"] for r in adapter["rules"]["custom"]}
cpu_values = load_yaml(os.path.join(chart_dir, "values-cpu.yaml"))

SCENARIOS = {
    # name: (values, what to expect)
    "default": ({}, {"gpu": True, "hpa": True, "sm": True, "rules": True, "dash": True, "pdb": True,
                     "fetch": True}),
    "cpu": (cpu_values, {"gpu": False, "hpa": True, "sm": True, "rules": True, "dash": True,
                         "pdb": True, "fetch": True}),
    "pvc-theta-apikey": ({
        "model": {"fetch": False, "existingClaim": "thetaserve-models",
                  "file": "Llama-3.1-8B-Instruct.Q4_K_M.gguf"},
        "theta": {"file": "thetas.json"},
        "apiKey": {"existingSecret": "thetaserve-api"},
        "autoscaling": {"enabled": False},
        "replicaCount": 2,
        "serviceMonitor": {"labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"labels": {"release": "kube-prometheus-stack"}},
        "grafanaDashboards": {"labels": {"dashboards": "thetaserve"}, "annotations": {}},
        "config": {"max-num-seqs": "128", "threads": "8", "no-vmc": True},
        "extraEnv": [{"name": "OMP_NUM_THREADS", "value": "8"}],
        "gpu": {"count": 2},
        "drain": {"timeoutSeconds": 120, "preStopSleepSeconds": 10},
    }, {"gpu": True, "hpa": False, "sm": True, "rules": True, "dash": True, "pdb": True,
        "fetch": False}),
    "minimal": ({
        "serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False},
        "grafanaDashboards": {"enabled": False},
        "autoscaling": {"enabled": False},
        "podDisruptionBudget": {"enabled": False}, "gpu": {"enabled": False},
        "image": {"tag": "0.1.0-cpu"},
    }, {"gpu": False, "hpa": False, "sm": False, "rules": False, "dash": False, "pdb": False,
        "fetch": True}),
}

BAD_VALUES = {
    "a flag the chart owns in config": {"config": {"port": "1"}},
    "TLS on the pod (the kubelet's gRPC probes are plaintext)": {"config": {"tls-cert": "/c.pem"}},
    "gpu.count 0": {"gpu": {"count": 0}},
    "a misspelt top-level key": {"imagee": {"tag": "x"}},
    "a misspelt probe field": {"probes": {"startup": {"periodSecond": 5}}},
}

BAD_RENDERS = {
    "fetching a model other than the default": {"model": {"file": "other.gguf"}},
    "no fetch and no volume": {"model": {"fetch": False}},
    "TLS through extraArgs": {"extraArgs": ["--tls-cert", "/c.pem"]},
    "the API key through extraArgs": {"extraArgs": ["--api-key=sesame"]},
}

os.makedirs(out_dir, exist_ok=True)
n_objects = 0
with helm.Chart.load(chart_dir) as chart:
    print("chart %s %s (Helm SDK %s via helm-python-sdk %s)"
          % (chart.name, chart.version, helm.helm_sdk_version(), helm.helm_c_version()))

    print("values.schema.json refuses bad values:")
    for what, values in BAD_VALUES.items():
        try:
            chart.validate_schema(values)
            err("values.schema.json accepted %s: %s" % (what, json.dumps(values)))
        except helm.HelmError as e:
            print("  ok   refused %s (%s)" % (what, " ".join(str(e).split())[:120]))

    print("the templates refuse inconsistent values:")
    for what, values in BAD_RENDERS.items():
        try:
            chart.render(values, name="thetaserve", namespace="llm")
            err("the chart rendered %s: %s" % (what, json.dumps(values)))
        except helm.HelmError as e:
            print("  ok   refused %s (%s)" % (what, " ".join(str(e).split())[:120]))

    for name, (values, expect) in SCENARIOS.items():
        print("values set %r:" % name)
        report = helm.lint(chart_dir, values, strict=True, kube_version="v1.30.0")
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        for m in problems:
            err("%s: helm lint: %s" % (name, m))
        if not problems:
            print("  ok   helm lint --strict")
        rendered = chart.render(values, name="thetaserve", namespace="llm")
        docs = []
        parts = {"": [], "-files": []}
        for path in sorted(rendered):
            if not path.endswith((".yaml", ".yml")) or not rendered[path].strip():
                continue
            part = "-files" if path.endswith(("/grafana-dashboards.yaml", "/prometheusrule.yaml")) else ""
            parts[part].append("# Source: %s\n%s" % (path, rendered[path].strip() + "\n"))
            docs.extend(d for d in yaml.safe_load_all(rendered[path]) if d)
        for part, texts in parts.items():
            if texts:
                with open(os.path.join(out_dir, name + part + ".yaml"), "w", encoding="utf-8") as f:
                    f.write("---\n".join(texts))
        by_kind = {}
        for d in docs:
            by_kind.setdefault(d["kind"], []).append(d)
        print("  ok   rendered: " + ", ".join("%s" % k for k in sorted(by_kind)))

        # 3. schemas
        for d in docs:
            n_objects += 1
            label = "%s %s/%s" % (name, d["kind"], d["metadata"]["name"])
            if d["kind"] in CR_SCHEMAS:
                try:
                    jsonschema.validate(d, CR_SCHEMAS[d["kind"]])
                except jsonschema.ValidationError as e:
                    err("%s: %s at %s" % (label, e.message, "/".join(map(str, e.path))))
                continue
            for v in KUBE_VERSIONS:
                try:
                    kubernetes_validate.validate(d, v, strict=True)
                except kubernetes_validate.ValidationError as e:
                    err("%s: Kubernetes %s: %s at %s" % (label, v, e.message, "/".join(map(str, e.path))))
                except kubernetes_validate.utils.SchemaNotFoundError as e:
                    err("%s: no schema in Kubernetes %s: %s" % (label, v, e))
        print("  ok   schemas (Kubernetes %s; ServiceMonitor, PrometheusRule subset schemas)"
              % ", ".join(KUBE_VERSIONS)
              if not any(e.startswith(name + " ") for e in errors) else "  (schema failures above)")

        # 4. how the objects fit together
        def one(kind):
            objs = by_kind.get(kind, [])
            if len(objs) != 1:
                err("%s: expected one %s, got %d" % (name, kind, len(objs)))
                return None
            return objs[0]

        # The server's flags, and (grafanaDashboards.enabled) the dashboards.
        dash_cms = [c for c in by_kind.get("ConfigMap", []) if c["metadata"]["name"].endswith("-dashboards")]
        by_kind["ConfigMap"] = [c for c in by_kind.get("ConfigMap", []) if c not in dash_cms]
        dep, svc, cm = one("Deployment"), one("Service"), one("ConfigMap")
        if not (dep and svc and cm):
            continue
        if expect["dash"] != bool(dash_cms) or len(dash_cms) > 1:
            err("%s: %d dashboards ConfigMaps, expected %d" % (name, len(dash_cms), expect["dash"]))
        for d in dash_cms:
            data = {k: json.loads(v) for k, v in d.get("data", {}).items()}
            if data != dashboards:
                err("%s: the dashboards ConfigMap holds %s, not the chart's dashboards/*.json"
                    % (name, sorted(data)))
            want = values.get("grafanaDashboards", {}).get("labels", {"grafana_dashboard": "1"})
            if set(want.items()) - set(d["metadata"]["labels"].items()):
                err("%s: the dashboards ConfigMap lacks the labels %s" % (name, want))
            size = sum(len(v) for v in d["data"].values())
            if size > 900 * 1024:
                err("%s: the dashboards ConfigMap holds %d bytes (the API's limit is 1 MiB)" % (name, size))
        pod = dep["spec"]["template"]
        spec = pod["spec"]
        main = [c for c in spec["containers"] if c["name"] == "thetaserve"][0]
        ports = {p["name"]: p["containerPort"] for p in main["ports"]}
        flags = cm["data"]
        if set(dep["spec"]["selector"]["matchLabels"].items()) - set(pod["metadata"]["labels"].items()):
            err("%s: the Deployment's selector does not match its pod labels" % name)
        if str(ports.get("grpc")) != flags.get("THETASERVE_FLAG_PORT"):
            err("%s: container port grpc %s != --port %s" % (name, ports.get("grpc"), flags.get("THETASERVE_FLAG_PORT")))
        if str(ports.get("metrics")) != flags.get("THETASERVE_FLAG_METRICS_PORT"):
            err("%s: container port metrics != --metrics-port" % name)
        if str(ports.get("http")) != flags.get("THETASERVE_FLAG_HTTP_PORT"):
            err("%s: container port http %s != --http-port %s" % (name, ports.get("http"), flags.get("THETASERVE_FLAG_HTTP_PORT")))
        if "http" not in [p.get("targetPort") for p in svc["spec"]["ports"]]:
            err("%s: the Service does not expose the HTTP API" % name)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = main.get(probe)
            if not p or "grpc" not in p:
                err("%s: %s is not a native gRPC probe" % (name, probe))
            elif p["grpc"]["port"] != ports.get("grpc"):
                err("%s: %s probes port %s, not the gRPC port" % (name, probe, p["grpc"]["port"]))
        if main.get("readinessProbe", {}).get("grpc", {}).get("service") != "thetaserve.v1.Generation":
            err("%s: readiness should ask the health service for thetaserve.v1.Generation" % name)
        pre = main.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        drain = int(flags.get("THETASERVE_FLAG_DRAIN_TIMEOUT", "0"))
        sleep = int(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else None
        if sleep is None:
            err("%s: no preStop sleep" % name)
        elif spec["terminationGracePeriodSeconds"] < sleep + drain + 5:
            err("%s: terminationGracePeriodSeconds %s < preStop %s + drain %s + 5"
                % (name, spec["terminationGracePeriodSeconds"], sleep, drain))
        gpu_limit = main["resources"].get("limits", {}).get("nvidia.com/gpu")
        if expect["gpu"] != bool(gpu_limit) or expect["gpu"] != ("nvidia.com/gpu.present" in spec.get("nodeSelector", {})):
            err("%s: GPU request/node selector %s, expected gpu=%s" % (name, gpu_limit, expect["gpu"]))
        if flags.get("THETASERVE_FLAG_DEVICE") != ("cuda" if expect["gpu"] else "cpu"):
            err("%s: --device %s" % (name, flags.get("THETASERVE_FLAG_DEVICE")))
        if not spec["securityContext"].get("runAsNonRoot"):
            err("%s: the pod does not run as non-root" % name)
        inits = [c["name"] for c in spec.get("initContainers", [])]
        if expect["fetch"] != ("fetch-model" in inits):
            err("%s: init containers %s, expected fetch=%s" % (name, inits, expect["fetch"]))
        model_path = flags.get("THETASERVE_MODEL", "")
        mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
        if os.path.dirname(model_path) not in mounts:
            err("%s: the model %s is not on a mounted volume" % (name, model_path))
        # A switch given as a YAML boolean reaches the entrypoint as "true" (the bare flag).
        for flag, value in values.get("config", {}).items():
            if value is True and flags.get("THETASERVE_FLAG_" + flag.upper().replace("-", "_")) != "true":
                err("%s: config %s: true is not rendered as \"true\"" % (name, flag))
        theta = flags.get("THETASERVE_FLAG_THETA")
        if theta and os.path.dirname(theta) not in mounts:
            err("%s: the θ file %s is not on a mounted volume" % (name, theta))
        for p in svc["spec"]["ports"]:
            if p["targetPort"] not in ports:
                err("%s: Service port %s targets %s, not a container port" % (name, p["name"], p["targetPort"]))
        if set(svc["spec"]["selector"].items()) - set(pod["metadata"]["labels"].items()):
            err("%s: the Service does not select the pods" % name)

        sm = by_kind.get("ServiceMonitor", [])
        if expect["sm"] != bool(sm):
            err("%s: ServiceMonitor present=%s, expected %s" % (name, bool(sm), expect["sm"]))
        for s in sm:
            if set(s["spec"]["selector"]["matchLabels"].items()) - set(svc["metadata"]["labels"].items()):
                err("%s: the ServiceMonitor does not select the Service" % name)
            if s["spec"]["endpoints"][0]["port"] not in {p["name"] for p in svc["spec"]["ports"]}:
                err("%s: the ServiceMonitor scrapes a port the Service lacks" % name)
            if s["spec"]["endpoints"][0].get("path") != "/metrics":
                err("%s: the ServiceMonitor does not scrape /metrics" % name)
        rules = by_kind.get("PrometheusRule", [])
        if expect["rules"] != bool(rules):
            err("%s: PrometheusRule present=%s, expected %s" % (name, bool(rules), expect["rules"]))
        for r in rules:
            if r["spec"]["groups"] != rule_groups:
                err("%s: the PrometheusRule's groups are not those of rules/*.yml" % name)
            want = values.get("prometheusRule", {}).get("labels", {})
            if set(want.items()) - set(r["metadata"]["labels"].items()):
                err("%s: the PrometheusRule lacks the labels %s" % (name, want))
        hpa = by_kind.get("HorizontalPodAutoscaler", [])
        if expect["hpa"] != bool(hpa):
            err("%s: HPA present=%s, expected %s" % (name, bool(hpa), expect["hpa"]))
        if hpa and "replicas" in dep["spec"]:
            err("%s: the Deployment sets replicas while the HPA owns them" % name)
        if not hpa and dep["spec"].get("replicas") != values.get("replicaCount", 1):
            err("%s: replicas %s" % (name, dep["spec"].get("replicas")))
        for h in hpa:
            ref = h["spec"]["scaleTargetRef"]
            if ref["kind"] != "Deployment" or ref["name"] != dep["metadata"]["name"]:
                err("%s: the HPA scales %s/%s" % (name, ref["kind"], ref["name"]))
            for m in h["spec"]["metrics"]:
                if m["type"] == "Pods" and m["pods"]["metric"]["name"] not in adapter_metrics:
                    err("%s: the HPA metric %s is not served by prometheus-adapter-values.yaml"
                        % (name, m["pods"]["metric"]["name"]))
        pdb = by_kind.get("PodDisruptionBudget", [])
        if expect["pdb"] != bool(pdb):
            err("%s: PDB present=%s, expected %s" % (name, bool(pdb), expect["pdb"]))
        for p in pdb:
            if set(p["spec"]["selector"]["matchLabels"].items()) - set(pod["metadata"]["labels"].items()):
                err("%s: the PDB does not select the pods" % name)

        # 5. flags
        for key, value in flags.items():
            if key.startswith("THETASERVE_FLAG_") and value != "":
                check_flag("%s ConfigMap" % name, key[len("THETASERVE_FLAG_"):].lower().replace("_", "-"))
        for a in main.get("args", [])[1:]:
            if a.startswith("--"):
                check_flag("%s extraArgs" % name, a[2:].split("=")[0])
        if not any(e.startswith(name + ":") or e.startswith(name + " ") for e in errors):
            print("  ok   objects fit together; serve flags exist")

for compose in ("compose.yaml", "compose.gpu.yaml"):
    c = load_yaml(os.path.join(root, "deploy/docker", compose))
    for key in c["services"]["thetaserve"].get("environment", {}):
        if key.startswith("THETASERVE_FLAG_"):
            check_flag("deploy/docker/" + compose, key[len("THETASERVE_FLAG_"):].lower().replace("_", "-"))

print("k8s_validate: %d values sets, %d objects, %s"
      % (len(SCENARIOS), n_objects, "%d FAILED" % len(errors) if errors else "all passed"))
sys.exit(1 if errors else 0)
