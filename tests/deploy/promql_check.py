#!/usr/bin/env python3
"""Helper of tests/deploy/promql_integration.sh.

  promql_check.py config REPO_ROOT METRICS_ADDR PROMETHEUS_ADDR OUT_FILE
      Writes a Prometheus config derived from deploy/prometheus/prometheus.yml: the same jobs
      and rule files, the thetaserve target rewritten to METRICS_ADDR, the prometheus job to
      PROMETHEUS_ADDR, 1 s scrape and rule evaluation intervals.

  promql_check.py wait-scraped PROMETHEUS_URL
      Waits (up to 30 s) until the thetaserve target has been scraped twice.

  promql_check.py check REPO_ROOT PROMETHEUS_URL [--wait SECONDS] [--savings]
      Evaluates through Prometheus' HTTP API (/api/v1/query) every PromQL expression of
        - every target of every panel of deploy/k8s/thetaserve/dashboards/*.json, with the dashboard
          variables set as Grafana would ($job and $instance to the scraped target's values,
          $__rate_interval to 1m) and every variable query (label_values(...));
        - every recording rule (its expression, and the series it records) and every alert rule
          of deploy/k8s/thetaserve/rules/*.yml. An alert expression is a condition (`x > 0.9`,
          `a > 0 and b == 0`) that is legitimately empty while the alert is not firing, so it is
          split at its top-level comparison and set operators and each non-literal operand is
          evaluated instead; `absent(x)` is empty while the target is scraped, so its argument
          x is evaluated (it must match the live target);
        - every seriesQuery and metricsQuery of deploy/k8s/prometheus-adapter-values.yaml (the
          Kubernetes namespace/pod matchers dropped: the test target has no such labels);
      and asserts each returns data: a non-empty result, and not all NaN (0/0) unless the
      expression is one that is 0/0 for a known reason (NAN_EXPECTED: the resident-V ratio is a
      gauge, 0/0 once the traffic has ended; with --savings, prefix caching is off under the
      sparse policy, so its hit rate is 0/0). Expressions that are empty at first are
      retried until --wait seconds have passed (recording rules need an evaluation or two). It
      also asserts the target is up and every rule's health is ok.
      --savings (a server under Top-θ with the sparse V policy): the memory-savings ratios the
      dashboards show must also be finite and below 1 (memory and reads saved), the share of
      retained rows already evicted in [0, 1]; SAVINGS lists the expressions.
"""
import glob
import json
import math
import os
import re
import sys
import time
import urllib.parse
import urllib.request

import yaml

RATE_INTERVAL = "1m"


def cmd_config(root, metrics_addr, prom_addr, out):
    with open(os.path.join(root, "deploy/prometheus/prometheus.yml"), encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    cfg["global"]["scrape_interval"] = "1s"
    cfg["global"]["scrape_timeout"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    # As compose mounts them: the chart's rules/ at rules/ beside prometheus.yml.
    base = os.path.join(root, "deploy/k8s/thetaserve")
    cfg["rule_files"] = [os.path.join(base, r) for r in cfg.get("rule_files", [])]
    jobs = []
    for job in cfg["scrape_configs"]:
        if job["job_name"] == "thetaserve":
            job["static_configs"] = [{"targets": [metrics_addr]}]
        elif job["job_name"] == "prometheus":
            job["static_configs"] = [{"targets": [prom_addr]}]
        else:
            print("promql_check: dropping scrape job %s (not on loopback)" % job["job_name"])
            continue
        jobs.append(job)
    if not any(j["job_name"] == "thetaserve" for j in jobs):
        sys.exit("promql_check: deploy/prometheus/prometheus.yml has no thetaserve job")
    cfg["scrape_configs"] = jobs
    cfg.pop("alerting", None)
    with open(out, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    print("promql_check: wrote %s (thetaserve -> %s, rules %s)" % (out, metrics_addr, cfg["rule_files"]))


class Prom:
    def __init__(self, url):
        self.url = url.rstrip("/")

    def get(self, path, **params):
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen("%s%s?%s" % (self.url, path, q), timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError("%s: %s" % (path, body))
        return body["data"]

    def query(self, expr):
        try:
            data = self.get("/api/v1/query", query=expr)
        except urllib.error.HTTPError as e:  # 400 = the expression does not parse
            return None, e.read().decode(errors="replace")
        return data["result"], None


def split_condition(expr):
    """Splits expr at top-level comparison (> < >= <= == !=) and set (and or unless) operators.
    Returns the operands (with bool/on(...)/ignoring(...)/group_x(...) modifiers removed)."""
    parts, depth, i, start, quote = [], 0, 0, 0, None
    n = len(expr)
    while i < n:
        c = expr[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
            i += 1
            continue
        if c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            op = None
            for cand in (">=", "<=", "==", "!=", ">", "<"):
                if expr.startswith(cand, i):
                    op = cand
                    break
            if op is None:
                m = re.match(r"(and|or|unless)\b", expr[i:])
                if m and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:")):
                    op = m.group(1)
            if op:
                parts.append(expr[start:i])
                i += len(op)
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    out = []
    for p in parts:
        p = p.strip()
        while True:
            m = re.match(r"(bool|on|ignoring|group_left|group_right)\b\s*(\([^)]*\))?\s*", p)
            if not m or not m.group(0):
                break
            p = p[m.end():]
        if p:
            out.append(p)
    return out


def is_literal(expr):
    return re.fullmatch(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?|[-+]?(Inf|NaN)", expr.strip()) is not None


def grafana_interpolate(expr, values):
    def repl(m):
        name = m.group(1) or m.group(2)
        if name == "__rate_interval" or name == "__interval":
            return RATE_INTERVAL
        if name in values:
            return values[name]
        return m.group(0)  # $1 of label_replace and the like: Grafana leaves it alone
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


def label_values_to_promql(q):
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", q)
    if m:
        return m.group(1), m.group(2)
    return q, None


# Expressions allowed to be all NaN (0/0), each with why: (regex on the expression, reason).
NAN_EXPECTED = [
    (r"v_rows_resident", "a gauge ratio: 0/0 while nothing runs (the check runs after the traffic)"),
]
# And under --savings (Top-θ with the sparse V policy), which turns prefix caching off.
NAN_EXPECTED_SPARSE = [
    (r"prefix_cache_hit", "prefix caching is off under the sparse V policy"),
]


def cmd_check(root, url, wait, nan_expected=NAN_EXPECTED):
    prom = Prom(url)
    deadline = time.time() + wait
    checks = []  # (where, expr, label_needed)

    # Target values for $job and $instance, as the dashboards' variables would offer them.
    while True:
        up, _ = prom.query('up{job="thetaserve"}')
        if up and up[0]["value"][1] == "1":
            break
        if time.time() > deadline:
            sys.exit("promql_check: the thetaserve target is not up: %s" % prom.get("/api/v1/targets"))
        time.sleep(1)
    job = up[0]["metric"]["job"]
    instance = up[0]["metric"]["instance"]
    # Grafana escapes a selected value for a regex matcher inside a PromQL string: regex
    # metacharacters get a backslash, and backslashes are doubled for the string literal.
    values = {k: re.escape(v).replace("\\", "\\\\") for k, v in (("job", job), ("instance", instance))}
    print("promql_check: target job=%s instance=%s is up" % (job, instance))

    for path in sorted(glob.glob(os.path.join(root, "deploy/k8s/thetaserve/dashboards/*.json"))):
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
        for v in dash.get("templating", {}).get("list", []):
            if v.get("type") != "query":
                continue
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            sel, label = label_values_to_promql(grafana_interpolate(q, values))
            checks.append(("%s variable $%s" % (name, v["name"]), sel, label))

        def walk(panels):
            for p in panels:
                yield p
                yield from walk(p.get("panels", []))
        for p in walk(dash.get("panels", [])):
            for t in p.get("targets", []):
                if t.get("expr"):
                    checks.append(("%s panel %r %s" % (name, p["title"], t["refId"]),
                                   grafana_interpolate(t["expr"], values), None))

    for path in sorted(glob.glob(os.path.join(root, "deploy/k8s/thetaserve/rules/*.yml"))):
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    checks.append(("%s record %s" % (name, rule["record"]), rule["expr"], None))
                    checks.append(("%s series %s (recorded)" % (name, rule["record"]), rule["record"], None))
                else:
                    operands = [o for o in split_condition(rule["expr"]) if not is_literal(o)]
                    for i, o in enumerate(operands):
                        where = "%s alert %s operand %d/%d" % (name, rule["alert"], i + 1, len(operands))
                        if o.startswith("absent(") and o.endswith(")"):
                            o, where = o[len("absent("):-1], where + " (absent's argument)"
                        checks.append((where, o, None))

    adapter_path = os.path.join(root, "deploy/k8s/prometheus-adapter-values.yaml")
    with open(adapter_path, encoding="utf-8") as f:
        adapter = yaml.safe_load(f)
    for rule in adapter["rules"]["custom"]:
        series = re.sub(r"\{[^}]*\}", "", rule["seriesQuery"]).strip()
        checks.append(("prometheus-adapter seriesQuery %s" % series, series, None))
        mq = (rule["metricsQuery"].replace("<<.Series>>", series)
              .replace("<<.LabelMatchers>>", 'job="%s"' % job).replace("<<.GroupBy>>", "instance"))
        checks.append(("prometheus-adapter metricsQuery %s" % series, mq, None))

    failed = []
    results = {}
    pending = list(range(len(checks)))
    while pending:
        still = []
        for k in pending:
            where, expr, label = checks[k]
            result, error = prom.query(expr)
            if error:
                failed.append((where, expr, "does not parse: " + error))
                continue
            if label:
                result = [r for r in (result or []) if label in r["metric"]]
            if result:
                results[k] = result
            else:
                still.append(k)
        pending = still
        if not pending or time.time() > deadline:
            break
        time.sleep(1)
    for k in pending:
        failed.append((checks[k][0], checks[k][1], "returned no data"))

    nan = 0
    for k, (where, expr, label) in enumerate(checks):
        if k not in results:
            continue
        r = results[k]
        vals = [float(x["value"][1]) for x in r]
        shown = ", ".join("%g" % v for v in vals[:3]) + (" ..." if len(vals) > 3 else "")
        if all(math.isnan(v) for v in vals):
            why = [reason for pattern, reason in nan_expected if re.search(pattern, expr)]
            if not why:
                failed.append((where, expr, "all NaN (0/0): the traffic never reached it"))
                continue
            nan += 1
            shown += "  (NaN: %s)" % why[0]
        print("  ok   %-70s %2d series  %s" % (where[:70], len(r), shown))

    # Rules evaluated without errors.
    rule_errors = []
    for g in prom.get("/api/v1/rules")["groups"]:
        for r in g["rules"]:
            if r.get("health") != "ok":
                rule_errors.append("%s: health %s %s" % (r["name"], r.get("health"), r.get("lastError", "")))
    for where, expr, why in failed:
        print("  FAIL %s\n       %s\n       %s" % (where, expr, why))
    for e in rule_errors:
        print("  FAIL rule " + e)
    total = len(checks)
    print("promql_check: %d expressions, %d returned data (%d all-NaN), %d failed; %d rule health errors"
          % (total, len(results), nan, len(failed), len(rule_errors)))
    return 1 if failed or rule_errors else 0


# (expression, lowest, highest, highest included): under Top-θ with --policy sparse. The resident
# ratio is a gauge (0/0 while nothing runs): its lowest value recorded during the traffic.
SAVINGS = [
    ("min_over_time((thetaserve:v_rows_resident:ratio >= 0)[5m:1s])", 0.0, 1.0, False),
    ("thetaserve:v_rows_read:ratio_rate5m", 0.0, 1.0, False),
    ("thetaserve:attention_elements_kept:ratio_rate5m", 0.0, 1.0, False),
    ("thetaserve:v_rows_retained_but_evicted:ratio_rate5m", 0.0, 1.0, True),
]


def cmd_savings(url, wait):
    prom = Prom(url)
    deadline = time.time() + wait
    failed = 0
    for expr, lo, hi, hi_ok in SAVINGS:
        while True:
            result, error = prom.query(expr)
            vals = [float(x["value"][1]) for x in (result or [])]
            ok = (not error and vals and
                  all(math.isfinite(v) and lo < v and (v <= hi if hi_ok else v < hi) for v in vals))
            if ok or time.time() > deadline:
                break
            time.sleep(1)
        shown = error or (", ".join("%g" % v for v in vals) if vals else "no data")
        print("  %s %-66s %s" % ("ok  " if ok else "FAIL", expr[:66], shown))
        failed += 0 if ok else 1
    print("promql_check: %d savings ratios, %d outside (0, 1)" % (len(SAVINGS), failed))
    return 1 if failed else 0


def cmd_wait_scraped(url, wait):
    """Waits until Prometheus has scraped the thetaserve target twice (it applies new targets
    up to 5 s after start), so the traffic that follows has a baseline for rate()."""
    prom = Prom(url)
    deadline = time.time() + wait
    while time.time() < deadline:
        result, _ = prom.query('count_over_time(up{job="thetaserve"}[1m]) >= 2')
        if result:
            print("promql_check: thetaserve target scraped %s times" % result[0]["value"][1])
            return 0
        time.sleep(0.5)
    print("promql_check: the thetaserve target was not scraped twice in %g s" % wait)
    return 1


def main(argv):
    if len(argv) >= 3 and argv[1] == "wait-scraped":
        return cmd_wait_scraped(argv[2], 30.0)
    if len(argv) >= 6 and argv[1] == "config":
        cmd_config(*argv[2:6])
        return 0
    if len(argv) >= 4 and argv[1] == "check":
        wait = 60.0
        if "--wait" in argv:
            wait = float(argv[argv.index("--wait") + 1])
        savings = "--savings" in argv
        rc = cmd_check(argv[2], argv[3], wait,
                       NAN_EXPECTED + (NAN_EXPECTED_SPARSE if savings else []))
        if savings:
            rc = cmd_savings(argv[3], wait) or rc
        return rc
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
