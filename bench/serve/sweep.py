#!/usr/bin/env python3
"""Sweeps load points against one or more server configurations.

For each --config NAME=FLAGS it starts the server on loopback with FLAGS added to its command
line, waits until it answers, runs every load point (closed-loop --concurrency list and/or
open-loop --request-rate list) with bench_serve's generator (bench_load.py), writes
RESULTS/<tag>-<NAME>.json (all points, plus machine and server metadata) and stops the server.
The prompts are built once (thetaserve's Tokenize RPC) and saved as RESULTS/dataset.json, or
replayed from --dataset, so that every configuration and every peer gets the same prompts.

thetaserve:
  sweep.py --backend thetaserve --server-bin build/thetaserve --model M.gguf \\
      --config "dense=" --config "kv64m=--kv-cache-memory 64M" --concurrency 1,8,32,64 ...
a peer (OpenAI-compatible HTTP): the command is a template with {host} {port} {model}:
  sweep.py --backend openai --server-cmd "llama-server -m {model} --host {host} --port {port}" \\
      --config "np64=-np 64 -c 16384 -t 2" --dataset RESULTS/dataset.json ...
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_serve  # noqa: E402

HOST = "127.0.0.1"


def free_port():
    s = socket.socket()
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def machine_info():
    info = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "platform": platform.platform(), "python": platform.python_version(),
            "nproc": os.cpu_count()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket",
                             "Hypervisor vendor", "L2 cache", "L3 cache"):
                info[k.strip()] = v.strip()
    except Exception:  # noqa: BLE001
        pass
    try:
        with open("/proc/meminfo") as f:
            info["MemTotal"] = f.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        info["git_commit"] = subprocess.run(
            ["git", "-C", str(bench_serve.ROOT), "rev-parse", "HEAD"], capture_output=True,
            text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(bench_serve.ROOT), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        info["git_dirty"] = bool(dirty)
    except Exception:  # noqa: BLE001
        pass
    try:
        with open("/proc/loadavg") as f:
            info["loadavg_at_start"] = f.read().split()[:3]
    except OSError:
        pass
    return info


class Server:
    def __init__(self, cmd, log_path, ready, name):
        self.cmd, self.log_path, self.ready, self.name = cmd, log_path, ready, name
        self.proc = None

    def start(self, timeout=300):
        self.log = open(self.log_path, "w")
        self.log.write("$ " + " ".join(shlex.quote(c) for c in self.cmd) + "\n")
        self.log.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited with {self.proc.returncode}; "
                                   f"log: {self.log_path}\n{tail(self.log_path)}")
            if self.ready():
                return time.time() - t0
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server {self.name} not ready after {timeout} s; log: {self.log_path}")

    def cpu_seconds(self):
        """User + system CPU time of the server process (all its threads) so far."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def stop(self, timeout=60):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def tail(path, n=20):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def grpc_ready(addr):
    """True once grpc.health.v1.Health/Check says SERVING (the model is loaded and warmed up;
    the server answers other RPCs, and refuses Generate with UNAVAILABLE, before that). The
    health messages are encoded by hand: HealthCheckRequest{} is empty, and
    HealthCheckResponse{status: SERVING} is field 1 varint 1."""
    import grpc

    def check():
        ch = grpc.insecure_channel(addr)
        try:
            call = ch.unary_unary("/grpc.health.v1.Health/Check")
            return call(b"", timeout=2) == b"\x08\x01"
        except grpc.RpcError:
            return False
        finally:
            ch.close()
    return check


def http_ready(base_url, paths=("/health", "/v1/models")):
    def check():
        for p in paths:
            try:
                with urllib.request.urlopen(base_url + p, timeout=2) as r:
                    if r.status == 200:
                        return True
            except Exception:  # noqa: BLE001
                pass
        return False
    return check


def parse_configs(items):
    out = []
    for it in items or ["default="]:
        name, sep, flags = it.partition("=")
        if not sep:
            name, flags = it, ""
        name = name.strip()
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise ValueError(f"config name {name!r}: letters, digits, - _ . only")
        out.append((name, shlex.split(flags)))
    return out


def parse_list(s, conv):
    return [conv(x) for x in str(s).split(",") if x.strip()] if s else []


def points_of(args):
    pts = []
    for c in parse_list(args.concurrency, int):
        n = max(args.min_prompts, args.prompts_per_concurrency * c)
        if args.max_prompts:
            n = min(n, args.max_prompts)
        pts.append({"max_concurrency": c, "request_rate": float("inf"), "num_prompts": n,
                    "label": f"c{c}"})
    for r in parse_list(args.request_rate, float):
        n = args.num_prompts
        pts.append({"max_concurrency": args.max_concurrency, "request_rate": r,
                    "num_prompts": n, "label": f"r{r:g}"})
    if not pts:
        raise SystemExit("give --concurrency and/or --request-rate")
    return pts


def point_cfg(args, pt, config_name, meta):
    ns = argparse.Namespace(**vars(args))
    ns.request_rate = pt["request_rate"]
    ns.max_concurrency = pt["max_concurrency"]
    ns.concurrency = None
    ns.num_prompts = pt["num_prompts"]
    ns.label = f"{config_name}/{pt['label']}"
    ns.extra_meta = meta
    return ns


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_serve.add_args(p, load_points=False)
    p.add_argument("--server-bin", help="thetaserve binary (thetaserve backend)")
    p.add_argument("--model", help="model file passed to the server")
    p.add_argument("--server-cmd", help="peer command template with {host} {port} {model}")
    p.add_argument("--peer-name", default="peer", help="name recorded for a peer server")
    p.add_argument("--peer-version", default="", help="version recorded for a peer server")
    p.add_argument("--config", action="append",
                   help="NAME=FLAGS: server flags of one configuration (repeatable)")
    p.add_argument("--concurrency", dest="concurrency", default=None,
                   help="closed-loop points, e.g. 1,8,32,64")
    p.add_argument("--request-rate", dest="request_rate", default=None,
                   help="open-loop points in req/s, e.g. 0.5,1,2,inf")
    p.add_argument("--prompts-per-concurrency", type=int, default=4,
                   help="closed loop: prompts per point = max(--min-prompts, this x C)")
    p.add_argument("--min-prompts", type=int, default=16)
    p.add_argument("--max-prompts", type=int, default=0)
    p.add_argument("--results-dir", required=True)
    p.add_argument("--tag", default="", help="file name prefix (default: backend)")
    p.add_argument("--dataset-only", action="store_true",
                   help="start the first configuration, write RESULTS/dataset.json, stop")
    p.add_argument("--ready-timeout", type=float, default=300)
    p.add_argument("--append", action="store_true",
                   help="keep the points already in RESULTS/<tag>-<NAME>.json (other labels) "
                        "and add these: lets a schedule alternate servers point by point")
    args = p.parse_args(argv)
    # SIGTERM (e.g. a killed script) unwinds like Ctrl-C, so the server is always stopped.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    results = pathlib.Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    pts = points_of(args) if (args.concurrency or args.request_rate) else []
    if not pts and not args.dataset_only:
        raise SystemExit("give --concurrency and/or --request-rate")
    # Every point gets its own slice of the dataset: no prompt is sent twice in a sweep, so a
    # server's prefix cache (llama-server has one) cannot turn a repeat into free prefill.
    offset = 0
    for pt in pts:
        pt["offset"] = offset
        offset += pt["num_prompts"]
    n_needed = offset or args.num_prompts
    configs = parse_configs(args.config)
    tag = args.tag or args.backend
    machine = machine_info()
    dataset_path = args.dataset or str(results / "dataset.json")
    reqs = None
    if args.dataset or (os.path.exists(dataset_path) and not args.dataset_only):
        reqs, dmeta = bench_serve.load_dataset(dataset_path)
        want = {"input_len": str(args.input_len), "output_len": str(args.output_len),
                "seed": args.seed, "shared_prefix_len": args.shared_prefix_len}
        have = {k: dmeta.get(k, 0 if k == "shared_prefix_len" else None) for k in want}
        if have != want:
            print(f"dataset {dataset_path} was made with {have}, this sweep asks {want}",
                  file=sys.stderr)
            if args.dataset:
                raise SystemExit("the --dataset does not match --input-len/--output-len/--seed")
            reqs = None
        elif len(reqs) < n_needed:
            print(f"dataset {dataset_path} has {len(reqs)} prompts, need {n_needed}: rebuilding",
                  file=sys.stderr)
            if args.dataset:
                raise SystemExit("give a larger --dataset")
            reqs = None
        else:
            print(f"dataset: {dataset_path} ({len(reqs)} prompts)", file=sys.stderr)

    summary_rows = []
    for name, flags in configs:
        port = free_port()
        if args.backend == "thetaserve":
            if not args.server_bin or not args.model:
                raise SystemExit("--server-bin and --model are needed for thetaserve")
            mport = free_port()
            cmd = [args.server_bin, "serve", "--model", args.model, "--host", HOST,
                   "--port", str(port), "--metrics-port", str(mport)] + flags
            args.addr = f"{HOST}:{port}"
            ready = grpc_ready(args.addr)
        else:
            if not args.server_cmd:
                raise SystemExit("--server-cmd is needed for a peer")
            cmd = shlex.split(args.server_cmd.format(host=HOST, port=port,
                                                     model=args.model or "")) + flags
            args.base_url = f"http://{HOST}:{port}"
            ready = http_ready(args.base_url)
        point_names = "_".join(pt["label"] for pt in pts) or "dataset"
        log_path = results / f"{tag}-{name}-{point_names}.server.log"
        server = Server(cmd, str(log_path), ready, name)
        print(f"[{name}] starting: {' '.join(shlex.quote(c) for c in cmd)}", file=sys.stderr)
        load_s = server.start(timeout=args.ready_timeout)
        print(f"[{name}] ready after {load_s:.1f} s", file=sys.stderr)
        try:
            if reqs is None:
                if args.backend != "thetaserve" and args.tokenizer != "words":
                    raise SystemExit("a peer needs --dataset (built against thetaserve's "
                                     "tokenizer) or --tokenizer words")
                ns = argparse.Namespace(**vars(args))
                ns.num_prompts = n_needed
                ns.dataset = None
                ns.save_dataset = dataset_path
                ns.tokenizer_addr = args.addr
                t0 = time.time()
                reqs = bench_serve.get_dataset(ns)
                print(f"dataset: {len(reqs)} prompts in {time.time() - t0:.1f} s -> "
                      f"{dataset_path}", file=sys.stderr)
                if args.dataset_only:
                    return 0
            meta = {"config": name, "server_flags": flags, "server_cmd": cmd,
                    "server_name": "thetaserve" if args.backend == "thetaserve"
                    else args.peer_name,
                    "server_version": machine.get("git_commit", "")
                    if args.backend == "thetaserve" else args.peer_version,
                    "dataset": os.path.abspath(dataset_path)}
            points = []
            out_path = results / f"{tag}-{name}.json"
            if args.append and out_path.exists():
                with open(out_path) as f:
                    new_labels = {f"{name}/{pt['label']}" for pt in pts}
                    points = [q for q in json.load(f).get("points", [])
                              if q.get("label") not in new_labels]
            for pt in pts:
                cfg = point_cfg(args, pt, name, meta)
                la0, cpu0 = loadavg(), server.cpu_seconds()
                r = bench_serve.run_benchmark(
                    cfg, reqs[pt["offset"]:pt["offset"] + pt["num_prompts"]])
                r["dataset_offset"] = pt["offset"]
                cpu1 = server.cpu_seconds()
                r["server_log"] = log_path.name
                if server.proc.poll() is not None:
                    r["server_exit_code"] = server.proc.returncode
                    print(f"[{name}] the server exited with {server.proc.returncode} during "
                          f"{pt['label']}; log: {log_path}\n{tail(log_path)}", file=sys.stderr)
                r["loadavg_before"], r["loadavg_after"] = la0, loadavg()
                if cpu0 is not None and cpu1 is not None:
                    # includes the warm-up request and any spinning of the server's threads
                    r["server_cpu_seconds"] = cpu1 - cpu0
                    r["server_cpu_utilization"] = (cpu1 - cpu0) / max(r["duration"], 1e-9)
                    if r["total_output_tokens"]:
                        r["server_cpu_ms_per_output_token"] = (
                            1000 * (cpu1 - cpu0) / r["total_output_tokens"])
                print(bench_serve.format_summary(r), file=sys.stderr)
                if r.get("errors"):
                    print("errors: " + "; ".join(r["errors"]), file=sys.stderr)
                points.append(r)
                summary_rows.append((name, pt["label"], r))
                # write after every point so an interrupted sweep keeps what it measured
                out = {"tag": tag, "backend": args.backend, "config": name,
                       "server_flags": flags, "server_cmd": cmd, "machine": machine,
                       "server_load_seconds": load_s,
                       "server_name": meta["server_name"],
                       "server_version": meta["server_version"], "points": points}
                with open(out_path, "w") as f:
                    json.dump(out, f, indent=1)
        finally:
            server.stop()
            print(f"[{name}] stopped", file=sys.stderr)

    lines = ["| config | point | completed | out tok/s | req/s | median TTFT ms | p99 TTFT ms "
             "| median TPOT ms | p99 TPOT ms | median ITL ms | median E2E ms "
             "| server CPU ms/tok | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, label, r in summary_rows:
        lines.append(
            f"| {name} | {label} | {r['completed']}/{r['num_prompts']} | "
            f"{r['output_throughput']:.1f} | {r['request_throughput']:.3f} | "
            f"{r['median_ttft_ms']:.0f} | {r.get('p99_ttft_ms', 0):.0f} | "
            f"{r['median_tpot_ms']:.1f} | {r.get('p99_tpot_ms', 0):.1f} | "
            f"{r['median_itl_ms']:.1f} | {r['median_e2el_ms']:.0f} | "
            f"{r.get('server_cpu_ms_per_output_token', float('nan')):.1f} | "
            f"{(r.get('loadavg_before') or ['?'])[0]} |")
    table = "\n".join(lines)
    print(table)
    with open(results / f"{tag}-summary.md", "w") as f:
        f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
