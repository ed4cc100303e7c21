#!/usr/bin/env python3
"""Static checks of the Grafana dashboards, their provisioning and the Prometheus rules.

- every dashboard parses, has a unique uid, the datasource/job/instance variables, panels with
  unique ids on the 24-column grid without overlaps, a description, and Prometheus targets
  that use the ${datasource} variable and have an expression;
- every thetaserve_* name in a dashboard or rule is a metric of docs/metrics.md (histograms
  with _bucket/_sum/_count) and every thetaserve:* name is a recording rule;
- every panel title is explained in docs/deploy.md (as **Title** in its panel tables);
- the provisioning files point where deploy/docker/compose.yaml mounts the dashboards.

Run by tests/deploy/static_checks.sh; needs only python3 and PyYAML (python3-yaml, which
yamllint depends on) or falls back to a minimal check without it.
Usage: check_dashboards.py REPO_ROOT
"""
import glob
import json
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
errors = []


def err(msg):
    errors.append(msg)


try:
    import yaml
except ImportError:  # yamllint depends on PyYAML, so this is rare
    yaml = None


def read(path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


# Metrics documented in docs/metrics.md: `thetaserve_...` in the first column of its tables.
metrics_md = read("docs/metrics.md")
documented = {}
for line in metrics_md.splitlines():
    m = re.match(r"\|\s*`(thetaserve_[a-z0-9_]+)`\s*\|\s*([a-z ()0-9]+?)\s*\|", line)
    if m:
        documented[m.group(1)] = m.group(2)
if len(documented) < 20:
    err("docs/metrics.md: found only %d metrics, the table format changed?" % len(documented))
known = set()
for name, kind in documented.items():
    known.add(name)
    if kind.startswith("histogram"):
        known.update({name + "_bucket", name + "_sum", name + "_count"})

# Recording rules.
rule_files = sorted(glob.glob(os.path.join(root, "deploy/k8s/thetaserve/rules/*.yml")))
records = set()
rule_exprs = []
for path in rule_files:
    if yaml is None:
        break
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                records.add(rule["record"])
            rule_exprs.append((os.path.relpath(path, root), rule.get("record") or rule.get("alert"),
                               rule["expr"]))

NAME = re.compile(r"\bthetaserve[_:][a-zA-Z0-9_:]*")


def check_names(where, expr):
    for name in NAME.findall(expr):
        if ":" in name:
            if yaml is not None and name not in records:
                err("%s: %s is not a recording rule of deploy/k8s/thetaserve/rules" % (where, name))
        elif name not in known:
            err("%s: %s is not a metric of docs/metrics.md" % (where, name))


for where, name, expr in rule_exprs:
    check_names("%s (%s)" % (where, name), expr)

docs = read("docs/deploy.md")


def walk(panels):
    for p in panels:
        yield p
        yield from walk(p.get("panels", []))


uids = set()
dash_files = sorted(glob.glob(os.path.join(root, "deploy/k8s/thetaserve/dashboards/*.json")))
if len(dash_files) < 2:
    err("expected the Serving and KV cache dashboards in deploy/k8s/thetaserve/dashboards")
n_panels = n_targets = 0
for path in dash_files:
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    for key in ("uid", "title", "panels", "templating", "schemaVersion"):
        if key not in d:
            err("%s: no %s" % (rel, key))
    if d.get("uid") in uids:
        err("%s: duplicate uid %s" % (rel, d.get("uid")))
    uids.add(d.get("uid"))
    if d.get("title", "") not in docs:
        err("%s: dashboard title %r is not in docs/deploy.md" % (rel, d.get("title")))
    variables = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
    if variables.get("datasource", {}).get("type") != "datasource":
        err("%s: no datasource variable" % rel)
    for name in ("job", "instance"):
        v = variables.get(name)
        if not v or v.get("type") != "query":
            err("%s: no %s query variable" % (rel, name))
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        check_names("%s variable %s" % (rel, name), q)
    ids = set()
    cells = {}
    for p in walk(d.get("panels", [])):
        pid = p.get("id")
        if pid in ids:
            err("%s: duplicate panel id %s" % (rel, pid))
        ids.add(pid)
        g = p.get("gridPos")
        if not g or g["x"] < 0 or g["w"] < 1 or g["x"] + g["w"] > 24 or g["h"] < 1:
            err("%s: panel %r has a bad gridPos %s" % (rel, p.get("title"), g))
        else:
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    if (x, y) in cells:
                        err("%s: panels %r and %r overlap" % (rel, cells[(x, y)], p.get("title")))
                        break
                    cells[(x, y)] = p.get("title")
                else:
                    continue
                break
        if p.get("type") == "row":
            continue
        n_panels += 1
        title = p.get("title", "")
        if not title or not p.get("description"):
            err("%s: panel %s needs a title and a description" % (rel, pid))
        if title and "**%s**" % title not in docs:
            err("%s: panel %r is not explained in docs/deploy.md" % (rel, title))
        if p.get("datasource", {}).get("uid") != "${datasource}":
            err("%s: panel %r does not use the ${datasource} variable" % (rel, title))
        targets = p.get("targets", [])
        if not targets:
            err("%s: panel %r has no queries" % (rel, title))
        refs = set()
        for t in targets:
            n_targets += 1
            if t.get("refId") in refs:
                err("%s: panel %r repeats refId %s" % (rel, title, t.get("refId")))
            refs.add(t.get("refId"))
            if t.get("datasource", {}).get("uid") != "${datasource}":
                err("%s: panel %r target %s does not use ${datasource}" % (rel, title, t.get("refId")))
            expr = t.get("expr", "")
            if not expr.strip():
                err("%s: panel %r target %s has no expr" % (rel, title, t.get("refId")))
            for var in re.findall(r"\$\{?(\w+)", expr):
                # $1 in label_replace is a regex group: Grafana leaves unknown names alone.
                if var not in variables and not var.startswith("__") and not var.isdigit():
                    err("%s: panel %r uses undefined variable $%s" % (rel, title, var))
            check_names("%s panel %r" % (rel, title), expr)

# Provisioning and compose agree on paths.
if yaml is not None:
    ds = yaml.safe_load(read("deploy/grafana/provisioning/datasources/prometheus.yaml"))
    if not any(x.get("type") == "prometheus" for x in ds.get("datasources", [])):
        err("datasource provisioning has no prometheus datasource")
    prov = yaml.safe_load(read("deploy/grafana/provisioning/dashboards/thetaserve.yaml"))
    path = prov["providers"][0]["options"]["path"]
    compose = yaml.safe_load(read("deploy/docker/compose.yaml"))
    mounts = compose["services"]["grafana"]["volumes"]
    if not any(m.split(":")[0] == "../k8s/thetaserve/dashboards" and m.split(":")[1] == path
               for m in mounts):
        err("compose.yaml does not mount ../k8s/thetaserve/dashboards at %s (the provisioning path)"
            % path)

for e in errors:
    print("check_dashboards: " + e)
print("check_dashboards: %d dashboards, %d panels, %d queries, %d rules: %s"
      % (len(dash_files), n_panels, n_targets, len(rule_exprs), "FAILED" if errors else "ok"))
sys.exit(1 if errors else 0)
