#!/usr/bin/env python3
"""Writes the thetaserve Grafana dashboards (deploy/k8s/thetaserve/dashboards/*.json).

The JSON files are committed (Grafana provisions them as they are: compose mounts the folder,
the Helm chart ships it as a ConfigMap for Grafana's dashboard sidecar); this script is their
source, so panels stay uniform. After editing it, run

    python3 deploy/grafana/make_dashboards.py          # rewrite the JSON files
    python3 deploy/grafana/make_dashboards.py --check  # exit 1 if the files differ (ctest runs this)

Every query filters on the dashboard variables $job and $instance (taken from
thetaserve_build_info) and uses $__rate_interval for rates. Ratios come from the recording rules
in deploy/k8s/thetaserve/rules/thetaserve-recording.yml. The integration test
tests/deploy/promql_integration.sh evaluates every expression written here against a real
server scraped by a real Prometheus. Panel titles and descriptions are what docs/deploy.md
explains; a check there asserts every title is documented.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "k8s", "thetaserve", "dashboards"))
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance"'
RI = "$__rate_interval"


def sel(metric, extra=""):
    inner = SEL if not extra else extra + ", " + SEL
    return "%s{%s}" % (metric, inner)


def rate(metric, extra=""):
    return "rate(%s[%s])" % (sel(metric, extra), RI)


def quantile(q, hist, by="le"):
    return "histogram_quantile(%s, sum by (%s) (%s))" % (q, by, rate(hist + "_bucket"))


def target(expr, legend, ref, instant=False, fmt="time_series"):
    t = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend,
         "range": not instant, "instant": instant, "format": fmt, "editorMode": "code"}
    return t


def targets(*pairs):
    return [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(pairs)]


class Layout:
    """Places panels left to right on Grafana's 24-column grid."""

    def __init__(self):
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def place(self, panel, w, h):
        if self.x + w > 24:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        panel["id"] = self.next_id
        self.next_id += 1
        panel["gridPos"] = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_h = max(self.row_h, h)
        return panel

    def row(self, title):
        if self.x:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        panel = {"type": "row", "title": title, "collapsed": False, "panels": []}
        self.place(panel, 24, 1)
        self.x = 0
        self.y += 1
        self.row_h = 0
        return panel


def timeseries(title, description, tgts, unit="short", stack=False, minv=None, maxv=None,
               threshold=None, legend_calcs=("mean", "max", "lastNotNull"), right=None):
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if not stack else 40,
              "showPoints": "never", "spanNulls": False,
              "stacking": {"mode": "normal" if stack else "none", "group": "A"},
              "axisPlacement": "auto", "axisSoftMin": 0}
    defaults = {"unit": unit, "custom": custom}
    if minv is not None:
        defaults["min"] = minv
    if maxv is not None:
        defaults["max"] = maxv
    if threshold is not None:
        custom["thresholdsStyle"] = {"mode": "line+area"}
        defaults["thresholds"] = {"mode": "absolute", "steps": [
            {"color": "transparent", "value": None}, {"color": "red", "value": threshold}]}
    overrides = []
    if right:  # (refId, unit): that query on a right-hand axis of its own unit
        ref, runit = right
        overrides.append({"matcher": {"id": "byFrameRefID", "options": ref},
                          "properties": [{"id": "custom.axisPlacement", "value": "right"},
                                         {"id": "unit", "value": runit}]})
    return {
        "type": "timeseries", "title": title, "description": description, "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": {"legend": {"displayMode": "table", "placement": "bottom",
                               "calcs": list(legend_calcs)},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": tgts,
    }


def stat(title, description, tgts, unit="short", decimals=None, text_mode="value",
         thresholds=None, color_mode="value"):
    defaults = {"unit": unit, "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": thresholds or [
                    {"color": "green", "value": None}]}}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat", "title": title, "description": description, "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "textMode": text_mode, "colorMode": color_mode, "graphMode": "area",
                    "justifyMode": "auto", "orientation": "auto"},
        "targets": tgts,
    }


def gauge(title, description, tgts, thresholds):
    return {
        "type": "gauge", "title": title, "description": description, "datasource": DS,
        "fieldConfig": {"defaults": {"unit": "percentunit", "min": 0, "max": 1,
                                     "color": {"mode": "thresholds"},
                                     "thresholds": {"mode": "absolute", "steps": thresholds}},
                        "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "showThresholdLabels": False, "showThresholdMarkers": True},
        "targets": tgts,
    }


def heatmap(title, description, tgts):
    # Each series (one per layer) is one row of the heatmap: calculate=false means the values
    # are drawn as they are, not bucketed again. The layer label is zero-padded in the query so
    # that rows sort 000, 001, ..., 029 rather than 0, 1, 10, 11, ...
    return {
        "type": "heatmap", "title": title, "description": description, "datasource": DS,
        "fieldConfig": {"defaults": {"custom": {"hideFrom": {"legend": False, "tooltip": False,
                                                             "viz": False},
                                                "scaleDistribution": {"type": "linear"}}},
                        "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "RdYlGn", "steps": 64, "scale": "linear",
                      "exponent": 0.5, "fill": "dark-orange", "reverse": False,
                      "min": 0, "max": 1},
            "yAxis": {"axisPlacement": "left", "reverse": True, "unit": "none",
                      "axisLabel": "layer"},
            "rowsFrame": {"layout": "auto", "value": "kept fraction"},
            "cellValues": {"unit": "percentunit", "decimals": 1},
            "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": True},
            "legend": {"show": True},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "showValue": "never",
        },
        "targets": tgts,
    }


def variables():
    def query_var(name, label, query):
        return {
            "type": "query", "name": name, "label": label, "datasource": DS,
            "definition": query,
            "query": {"query": query, "refId": "StandardVariableQuery"},
            "refresh": 2, "includeAll": True, "allValue": ".*", "multi": True, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "hide": 0, "options": [], "regex": "", "skipUrlSync": False,
        }
    return {"list": [
        {"type": "datasource", "name": "datasource", "label": "Data source",
         "query": "prometheus", "current": {}, "hide": 0, "includeAll": False, "multi": False,
         "options": [], "refresh": 1, "regex": "", "skipUrlSync": False},
        query_var("job", "Job", "label_values(thetaserve_build_info, job)"),
        query_var("instance", "Instance",
                  'label_values(thetaserve_build_info{job=~"$job"}, instance)'),
    ]}


def dashboard(uid, title, description, panels):
    return {
        "uid": uid, "title": title, "description": description,
        "tags": ["thetaserve"], "editable": True, "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s",
        "timepicker": {}, "timezone": "", "schemaVersion": 39, "version": 1,
        "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [{"title": "thetaserve dashboards", "type": "dashboards", "tags": ["thetaserve"],
                   "asDropdown": False, "includeVars": True, "keepTime": True}],
        "templating": variables(),
        "panels": panels,
    }


BUILD_INFO = ('count by (version, backend, matmul_activations, kv_cache_dtype, theta_mode, '
              'kv_policy) (%s)' % sel("thetaserve_build_info"))
BUILD_LEGEND = ("{{backend}} ({{matmul_activations}}) · KV {{kv_cache_dtype}} · θ {{theta_mode}} · "
                "V {{kv_policy}} · v{{version}}")
PCT_STEPS = [{"color": "green", "value": None}, {"color": "orange", "value": 0.75},
             {"color": "red", "value": 0.9}]


def serving():
    L = Layout()
    p = []
    p.append(L.row("Overview"))
    p.append(L.place(stat("Requests running", "Sequences in the running batch, summed over the selected instances.",
                          targets(("sum(%s)" % sel("thetaserve_requests_running"), "running"))), 4, 4))
    p.append(L.place(stat("Requests waiting", "Queued or preempted sequences waiting for KV pages, summed over the selected instances. The HorizontalPodAutoscaler scales on this.",
                          targets(("sum(%s)" % sel("thetaserve_requests_waiting"), "waiting")),
                          thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1},
                                      {"color": "red", "value": 16}]), 4, 4))
    p.append(L.place(stat("Finished requests/s", "Requests finished per second over 5 minutes, every outcome but refusals (recording rule thetaserve:requests_finished:rate5m).",
                          targets(("sum(%s)" % sel("thetaserve:requests_finished:rate5m"), "finished/s")),
                          unit="reqps", decimals=2), 4, 4))
    p.append(L.place(stat("Generated tokens/s", "Output tokens per second, summed over the selected instances.",
                          targets(("sum(%s)" % rate("thetaserve_generation_tokens_total"), "tokens/s")),
                          unit="short", decimals=1), 4, 4))
    p.append(L.place(stat("KV cache used", "Highest KV page pool use among the selected instances: (K + V pages used) / pages in the pool (recording rule thetaserve:kv_pages_used:ratio). The alert fires above 90% for 5 minutes.",
                          targets(("max(%s)" % sel("thetaserve:kv_pages_used:ratio"), "used")),
                          unit="percentunit", decimals=1, thresholds=PCT_STEPS), 4, 4))
    p.append(L.place(stat("Build", "Version, backend (with what its weight matmuls multiply: int8, f32 or bf16 activations), KV cache element type, θ mode and V-cache policy of the selected instances (thetaserve_build_info), with how many instances run each.",
                          [target(BUILD_INFO, BUILD_LEGEND, "A", instant=True)],
                          text_mode="value_and_name", color_mode="none"), 4, 4))

    p.append(L.row("Requests"))
    p.append(L.place(timeseries("Request rate by outcome", "Requests per second by how they ended: stop (stop string or token), length (max_tokens), eos, cancelled (client gone, deadline, Abort, drain), error, rejected (refused at submission: queue full, draining, bad input).",
                                targets(("sum by (outcome) (%s)" % rate("thetaserve_requests_total"), "{{outcome}}")),
                                unit="reqps", stack=True), 8, 8))
    p.append(L.place(timeseries("Refusals by code", "Requests refused at submission per second, by the gRPC status code they were answered with (the HTTP API's are counted by the same codes): RESOURCE_EXHAUSTED = the waiting queue at --max-queue (the ThetaserveQueueFull alert), UNAVAILABLE = loading or draining, INVALID_ARGUMENT = bad input, UNAUTHENTICATED = a missing or wrong API key, ALREADY_EXISTS = a request_id already in flight; and 'displaced': requests accepted, then ended with RESOURCE_EXHAUSTED while waiting so that a more urgent one could take their place in the full queue (--scheduling-policy priority; counted by the alert too).",
                                targets(("sum by (code) (%s)" % rate("thetaserve_requests_rejected_total"), "{{code}}"),
                                        ("sum(%s)" % rate("thetaserve_requests_displaced_total"), "displaced")),
                                unit="reqps", stack=True), 8, 8))
    p.append(L.place(timeseries("Running and waiting requests", "Sequences in the running batch and sequences waiting (queued, or preempted for recompute), summed over the selected instances.",
                                targets(("sum(%s)" % sel("thetaserve_requests_running"), "running"),
                                        ("sum(%s)" % sel("thetaserve_requests_waiting"), "waiting"))), 8, 8))

    p.append(L.place(timeseries("HTTP API connections", "Connections open on the OpenAI-compatible HTTP API against their limit (--max-http-connections, as the descriptor limit left it), summed over the selected instances. Past half the limit, idle and stalled connections are closed after 5 s; at it, new ones get 503. The ThetaserveHttpConnectionsNearLimit alert fires above 90% for 10 minutes.",
                                targets(("sum(%s)" % sel("thetaserve_http_connections_open"), "open"),
                                        ("sum(%s)" % sel("thetaserve_http_connections_limit"), "limit"))), 8, 8))
    p.append(L.place(timeseries("HTTP API responses by route", "Requests the HTTP API's routes answered per second, by route and status class (2xx, 4xx, 5xx; a stream counts by its 200).",
                                targets(("sum by (route, status) (%s)" % rate("thetaserve_http_requests_total"), "{{route}} {{status}}")),
                                unit="reqps", stack=True), 8, 8))
    p.append(L.place(timeseries("HTTP transport refusals by reason", "Connections the HTTP API's transport refused itself per second, before any route saw a request: connections = over --max-http-connections (503), request_bytes = over the bound on request bytes held across connections (503), threads = no thread to be had (503), bad_request = a request it could not read (malformed, no Host, too large: 4xx). Not among the refusals by code.",
                                targets(("sum by (reason) (%s)" % rate("thetaserve_http_refused_total"), "{{reason}}")),
                                unit="reqps", stack=True), 8, 8))

    p.append(L.row("Latency"))
    for title, hist, desc in [
        ("Time to first token", "thetaserve_time_to_first_token_seconds",
         "Arrival to first generated token: p50, p90 and p99 over the selected instances (histogram_quantile over the histogram's rate)."),
        ("Inter-token latency", "thetaserve_inter_token_latency_seconds",
         "Time between consecutive token deliveries of a request: p50, p90 and p99."),
        ("End-to-end request latency", "thetaserve_e2e_request_latency_seconds",
         "Arrival to finish of a request: p50, p90 and p99."),
        ("Queue time", "thetaserve_request_queue_time_seconds",
         "Arrival to the request's first scheduled engine step: p50, p90 and p99. Grows when the KV cache or --max-num-seqs limits admission."),
    ]:
        p.append(L.place(timeseries(title, desc, targets(
            (quantile("0.5", hist), "p50"), (quantile("0.9", hist), "p90"),
            (quantile("0.99", hist), "p99")), unit="s"), 12, 8))

    p.append(L.row("Throughput and engine"))
    p.append(L.place(timeseries("Tokens per second", "Generated tokens and prompt tokens computed per second (prompt tokens include the recomputation of preempted sequences).",
                                targets(("sum(%s)" % rate("thetaserve_generation_tokens_total"), "generated"),
                                        ("sum(%s)" % rate("thetaserve_prompt_tokens_total"), "prompt"))), 12, 8))
    p.append(L.place(timeseries("Preemptions", "Sequences preempted per second (their pages freed and the sequence requeued for recompute when the KV page pool runs out, or, under --scheduling-policy priority, to let a waiting request of an earlier priority start: 'for priority'), and preemptions for KV pages per finished request per instance (recording rule thetaserve:preemptions_per_request:ratio_rate5m; the alert fires above 0.1 for 10 minutes).",
                                targets(("sum(%s)" % rate("thetaserve_preemptions_total"), "preemptions/s"),
                                        ("sum(%s)" % rate("thetaserve_priority_preemptions_total"), "for priority/s"),
                                        (sel("thetaserve:preemptions_per_request:ratio_rate5m"), "per request {{instance}}")),
                                right=("C", "none")), 12, 8))
    p.append(L.place(timeseries("Engine step duration p90 by phase", "90th percentile of one engine step (forward pass and sampling), by what the batch held: prefill only, decode only, or mixed.",
                                targets((quantile("0.9", "thetaserve_step_duration_seconds", "le, phase"), "{{phase}}")),
                                unit="s"), 12, 8))
    p.append(L.place(timeseries("Batch size", "Mean sequences and mean tokens per engine step over the rate interval.",
                                targets(("sum(%s) / sum(%s)" % (rate("thetaserve_batch_size_sum"), rate("thetaserve_batch_size_count")), "sequences per step"),
                                        ("sum(%s) / sum(%s)" % (rate("thetaserve_batch_tokens_sum"), rate("thetaserve_batch_tokens_count")), "tokens per step"))), 12, 8))

    p.append(L.row("Process"))
    p.append(L.place(timeseries("Resident memory", "Resident memory of each selected instance's server process (process_resident_memory_bytes, read from /proc at each scrape): the weights, the KV page pool and the host offload pool once touched, and what serving allocates. Steady under steady load; growth while the load stays level is a leak.",
                                targets((sel("process_resident_memory_bytes"), "{{instance}}")),
                                unit="bytes"), 8, 8))
    p.append(L.place(timeseries("CPU use", "CPU time the server process used per second of wall time (rate of process_cpu_seconds_total), per instance: 1 = one core busy. On a CPU backend the engine's threads (--threads) account for most of it.",
                                targets(("rate(%s[%s])" % (sel("process_cpu_seconds_total"), RI), "{{instance}}")),
                                unit="none"), 8, 8))
    p.append(L.place(timeseries("Threads and open descriptors", "Threads (process_threads) and open file descriptors (process_open_fds: sockets, the model file, logs) of each instance's server process; descriptors as a fraction of their limit (process_max_fds) on the right axis (the ThetaserveFileDescriptorsNearLimit alert fires above 90% for 10 minutes). Both should come back down when clients leave.",
                                targets((sel("process_threads"), "threads {{instance}}"),
                                        (sel("process_open_fds"), "open fds {{instance}}"),
                                        ("%s / %s" % (sel("process_open_fds"), sel("process_max_fds")), "fds / limit {{instance}}")),
                                right=("C", "percentunit")), 8, 8))
    return dashboard("thetaserve-serving", "thetaserve / Serving",
                     "Requests, latency, throughput and preemptions of thetaserve.", p)


def kv_cache():
    L = Layout()
    p = []
    p.append(L.row("Overview"))
    p.append(L.place(gauge("KV pages used", "Highest KV page pool use among the selected instances: (K + V pages used) / pages in the pool (recording rule thetaserve:kv_pages_used:ratio).",
                           targets(("max(%s)" % sel("thetaserve:kv_pages_used:ratio"), "used")), PCT_STEPS), 5, 5))
    p.append(L.place(stat("V rows stored / dense", "V rows resident over the rows a dense cache would hold for the same sequences, summed over the selected instances. 100% = no memory saved (policy full, or dense attention); lower with the sparse and offload V policies (offload keeps the rest in host memory: Host offload row).",
                          targets(("sum(%s) / sum(%s)" % (sel("thetaserve_v_rows_resident"), sel("thetaserve_v_rows_dense_equivalent")), "stored / dense")),
                          unit="percentunit", decimals=1), 5, 5))
    p.append(L.place(stat("V rows read / dense", "V rows attention read over the rows dense attention would read, over the rate interval. 100% under dense attention; Top-θ reads only the retained rows.",
                          targets(("sum(%s) / sum(%s)" % (rate("thetaserve_v_rows_read_total"), rate("thetaserve_v_rows_read_dense_total")), "read / dense")),
                          unit="percentunit", decimals=1), 5, 5))
    p.append(L.place(stat("V memory saved", "Bytes of V cache not stored compared with a dense cache: (dense equivalent − resident) × bytes per row, summed over the selected instances.",
                          targets(("sum(%s)" % sel("thetaserve_v_bytes_saved"), "saved")),
                          unit="bytes", decimals=1), 5, 5))
    p.append(L.place(stat("Attention mode", "θ mode (dense or top-theta), V-cache policy, backend (with its matmuls' activations) and KV cache element type of the selected instances (thetaserve_build_info).",
                          [target(BUILD_INFO, BUILD_LEGEND, "A", instant=True)],
                          text_mode="value_and_name", color_mode="none"), 4, 5))

    p.append(L.row("KV page pool"))
    p.append(L.place(timeseries("KV pages used by kind", "Pages of the shared pool holding K (dense: every token) and V (dense tail plus retained rows under the sparse policy), with the free pages (what admission can use) and the pool's capacity.",
                                targets(("sum by (kind) (%s)" % sel("thetaserve_kv_pages_used"), "{{kind}} pages"),
                                        ("sum(%s)" % sel("thetaserve_kv_pages_free"), "free"),
                                        ("sum(%s)" % sel("thetaserve_kv_pages_capacity"), "capacity"))), 12, 8))
    p.append(L.place(timeseries("KV cache usage", "Per instance, (K + V pages used) / capacity (recording rule thetaserve:kv_pages_used:ratio). The red band marks the 90% alert threshold.",
                                targets((sel("thetaserve:kv_pages_used:ratio"), "{{instance}}")),
                                unit="percentunit", minv=0, maxv=1, threshold=0.9), 12, 8))
    p.append(L.place(timeseries("KV cache memory", "Bytes of the KV page pool held by requests (K and V pages used × the page size, which --kv-cache-dtype sets: 4, 2 or 1 bytes an element, 1.0625 for q8_0) and the pool's size, summed over the selected instances.",
                                targets(("sum(sum without (kind) (%s) * %s)" % (sel("thetaserve_kv_pages_used"), sel("thetaserve_kv_page_size_bytes")), "used"),
                                        ("sum(%s * %s)" % (sel("thetaserve_kv_pages_capacity"), sel("thetaserve_kv_page_size_bytes")), "capacity")),
                                unit="bytes"), 12, 8))

    p.append(L.row("V cache savings"))
    p.append(L.place(timeseries("V rows resident vs dense equivalent", "V rows stored (per layer and KV head) against the rows a dense cache would store for the same sequences. The gap is the memory the sparse V policy saves (under offload, moved to host memory: Host offload row).",
                                targets(("sum(%s)" % sel("thetaserve_v_rows_resident"), "resident"),
                                        ("sum(%s)" % sel("thetaserve_v_rows_dense_equivalent"), "dense equivalent"))), 12, 8))
    p.append(L.place(timeseries("V bytes saved", "Bytes of V cache saved against a dense cache, summed over the selected instances.",
                                targets(("sum(%s)" % sel("thetaserve_v_bytes_saved"), "saved")), unit="bytes"), 12, 8))
    p.append(L.place(timeseries("V rows read vs dense", "V rows read by attention per second against the rows dense attention would read. The gap is the read traffic Top-θ saves.",
                                targets(("sum(%s)" % rate("thetaserve_v_rows_read_total"), "read"),
                                        ("sum(%s)" % rate("thetaserve_v_rows_read_dense_total"), "dense"))), 12, 8))
    p.append(L.place(timeseries("Savings ratios", "Per instance: V rows stored / dense (thetaserve:v_rows_resident:ratio), V rows read / dense (thetaserve:v_rows_read:ratio_rate5m) and attention elements kept / dense (thetaserve:attention_elements_kept:ratio_rate5m). 1 = no saving.",
                                targets((sel("thetaserve:v_rows_resident:ratio"), "stored {{instance}}"),
                                        (sel("thetaserve:v_rows_read:ratio_rate5m"), "read {{instance}}"),
                                        (sel("thetaserve:attention_elements_kept:ratio_rate5m"), "attention kept {{instance}}")),
                                unit="percentunit", minv=0), 12, 8))

    p.append(L.row("Eviction"))
    p.append(L.place(timeseries("V rows evicted and retained-but-evicted", "V rows dropped per second by the sparse policy, and dropped rows a later query retained anyway (their mass went to compensation instead of being read).",
                                targets(("sum(%s)" % rate("thetaserve_v_rows_evicted_total"), "evicted"),
                                        ("sum(%s)" % rate("thetaserve_v_rows_retained_but_evicted_total"), "retained but evicted"))), 12, 8))
    p.append(L.place(timeseries("Retained-but-evicted fraction", "Per instance, of the V rows attention used (read, or retained by θ but already dropped), the fraction the sparse policy had dropped (recording rule thetaserve:v_rows_retained_but_evicted:ratio_rate5m): the eviction's regret, whose attention mass went to compensation instead of being read. 0 while nothing is evicted; empty while idle.",
                                targets((sel("thetaserve:v_rows_retained_but_evicted:ratio_rate5m"), "{{instance}}")),
                                unit="percentunit", minv=0), 12, 8))

    p.append(L.row("Host offload"))
    p.append(L.place(timeseries("Host pool pages", "Under --policy offload: pages of the host pool holding V rows moved out of the KV cache, and the pool's capacity (--offload-memory). When it is full, rows are dropped as under the sparse policy (see Eviction). Empty or 0 under the other policies.",
                                targets(("sum(%s)" % sel("thetaserve_host_pages_used"), "used"),
                                        ("sum(%s)" % sel("thetaserve_host_pages_capacity"), "capacity"))), 12, 8))
    p.append(L.place(timeseries("V rows offloaded and read from host", "V rows moved to host memory per second, and rows attention read back from there (rows a later query retained after they left the KV cache; under the sparse policy these would be retained-but-evicted).",
                                targets(("sum(%s)" % rate("thetaserve_v_rows_offloaded_total"), "offloaded"),
                                        ("sum(%s)" % rate("thetaserve_v_rows_read_host_total"), "read from host"))), 12, 8))

    p.append(L.row("Prefix cache"))
    p.append(L.place(timeseries("Prefix cache hit rate", "Per instance, of the tokens admitted requests looked up in the prefix cache, the fraction found there (recording rule thetaserve:prefix_cache_hit:ratio_rate5m): their K and V were adopted, not computed. Empty with --prefix-caching off or under the sparse and offload V policies.",
                                targets((sel("thetaserve:prefix_cache_hit:ratio_rate5m"), "{{instance}}")),
                                unit="percentunit", minv=0, maxv=1), 12, 8))
    p.append(L.place(timeseries("Prefix cache pages and evictions", "KV pages only the prefix cache holds (reclaimable, counted as free), and cached blocks evicted per second to make room for new work (right axis).",
                                targets(("sum(%s)" % sel("thetaserve_kv_pages_cached"), "cached pages"),
                                        ("sum(%s)" % rate("thetaserve_prefix_cache_evicted_blocks_total"), "evicted blocks/s")),
                                right=("B", "short")), 12, 8))

    p.append(L.row("Per layer"))
    kept = "avg by (layer) (%s)" % sel("thetaserve_attention_kept_ratio")
    padded = ('label_replace(label_replace(%s, "layer", "00$1", "layer", "([0-9])"), '
              '"layer", "0$1", "layer", "([0-9][0-9])")' % kept)
    p.append(L.place(heatmap("Attention kept fraction by layer", "Per layer (rows, 000 at the top), the fraction of attention elements kept in the last engine step, averaged over the selected instances (thetaserve_attention_kept_ratio). 1 under dense attention; Top-θ keeps less in most layers (layers 0 and 1 stay dense).",
                             targets((padded, "{{layer}}"))), 24, 10))
    return dashboard("thetaserve-kv-cache", "thetaserve / KV cache",
                     "KV page pool use and the V-cache and attention savings of Top-θ.", p)


def render():
    return {"serving.json": serving(), "kv-cache.json": kv_cache()}


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for name, dash in render().items():
        text = json.dumps(dash, indent=2, ensure_ascii=False) + "\n"
        path = os.path.join(OUT, name)
        if check:
            try:
                with open(path, encoding="utf-8") as f:
                    if f.read() != text:
                        stale.append(path)
            except FileNotFoundError:
                stale.append(path)
        else:
            os.makedirs(OUT, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            print("wrote", os.path.relpath(path))
    if stale:
        print("stale dashboards (run python3 deploy/grafana/make_dashboards.py):", *stale)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
