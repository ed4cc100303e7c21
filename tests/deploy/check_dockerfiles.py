#!/usr/bin/env python3
"""Static checks of deploy/docker/Dockerfile (CUDA) and Dockerfile.cpu, standing in for a
`docker build` that cannot run here (no Docker engine on these machines):

- multi-stage: the CUDA one builds FROM nvidia/cuda:*-devel-* and runs FROM
  nvidia/cuda:*-runtime-*; the CPU one builds and runs FROM debian:12-slim;
- the build steps are the scripts CI runs: RUN lines call scripts/install-deps.sh,
  scripts/build.sh and scripts/fetch-model.sh (so the image cannot drift from CI);
- the final stage runs as a non-root USER, has a HEALTHCHECK through `entrypoint.sh health`
  (the gRPC health service), and ENTRYPOINT is a file the image copies in;
- every COPY source from the build context exists and is not excluded by the Dockerfile's
  .dockerignore.

Usage: check_dockerfiles.py REPO_ROOT
"""
import fnmatch
import os
import re
import shlex
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
errors = []


def parse(path):
    """Instructions as (KEYWORD, rest) with line continuations joined and comments dropped."""
    out, cur = [], ""
    with open(path, encoding="utf-8") as f:
        for line in f:
            s = line.rstrip("\n")
            if not cur and (not s.strip() or s.lstrip().startswith("#")):
                continue
            if s.rstrip().endswith("\\"):
                cur += s.rstrip()[:-1] + " "
                continue
            cur += s
            kw, _, rest = cur.strip().partition(" ")
            out.append((kw.upper(), rest.strip()))
            cur = ""
    return out


def ignored(rel, patterns):
    hit = False
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        parts = rel.split("/")
        match = any(fnmatch.fnmatch("/".join(parts[:i]), p) for i in range(1, len(parts) + 1))
        if p.startswith("**/"):
            match = match or any(fnmatch.fnmatch(x, p[3:]) for x in parts)
        if match:
            hit = not neg
    return hit


def check(name, build_base, run_base):
    path = os.path.join(root, "deploy/docker", name)
    rel = os.path.relpath(path, root)
    ins = parse(path)
    ignore_file = path + ".dockerignore"
    patterns = []
    if os.path.exists(ignore_file):
        with open(ignore_file, encoding="utf-8") as f:
            patterns = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    else:
        errors.append("%s: no %s" % (rel, os.path.basename(ignore_file)))
    args = {}
    for kw, rest in ins:
        if kw == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args.setdefault(k, v.strip('"'))

    def expand(s):
        return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), s)

    froms = [expand(rest).split() for kw, rest in ins if kw == "FROM"]
    if len(froms) < 2:
        errors.append("%s: not multi-stage" % rel)
    else:
        if not re.match(build_base, froms[0][0]):
            errors.append("%s: build stage FROM %s, want %s" % (rel, froms[0][0], build_base))
        if not re.match(run_base, froms[-1][0]):
            errors.append("%s: final stage FROM %s, want %s" % (rel, froms[-1][0], run_base))
    runs = " ".join(rest for kw, rest in ins if kw == "RUN")
    for script in ("scripts/install-deps.sh", "scripts/build.sh", "scripts/fetch-model.sh"):
        if "bash " + script not in runs:
            errors.append("%s: no RUN step calls %s (the image must build with CI's scripts)" % (rel, script))
    last_from = max(i for i, (kw, _) in enumerate(ins) if kw == "FROM")
    final = ins[last_from:]
    users = [rest for kw, rest in final if kw == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        errors.append("%s: the final stage must switch to a non-root USER" % rel)
    hc = [rest for kw, rest in final if kw == "HEALTHCHECK"]
    if not hc or "entrypoint.sh" not in hc[-1] or '"health"' not in hc[-1]:
        errors.append("%s: no HEALTHCHECK through entrypoint.sh health" % rel)
    copied = set()
    for kw, rest in ins:
        if kw != "COPY":
            continue
        words = shlex.split(rest)
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        srcs, dest = paths[:-1], paths[-1]
        if any(f.startswith("--from") for f in flags):
            continue
        for src in srcs:
            if src == ".":
                continue
            if not os.path.exists(os.path.join(root, src)):
                errors.append("%s: COPY source %s does not exist" % (rel, src))
            elif ignored(src.rstrip("/"), patterns):
                errors.append("%s: COPY source %s is excluded by the .dockerignore" % (rel, src))
            target = dest if not dest.endswith("/") else dest + os.path.basename(src)
            copied.add(target)
    ep = [rest for kw, rest in final if kw == "ENTRYPOINT"]
    if not ep:
        errors.append("%s: no ENTRYPOINT" % rel)
    else:
        exe = shlex.split(ep[-1].strip("[]").replace(",", " "))[0]
        if exe not in copied:
            errors.append("%s: ENTRYPOINT %s is not a file the image copies in" % (rel, exe))
    for must_ignore in ("build", "models", ".git"):
        if not ignored(must_ignore, patterns):
            errors.append("%s: .dockerignore should exclude %s" % (rel, must_ignore))
    print("check_dockerfiles: %s: %d instructions, %d stages" % (rel, len(ins), len(froms)))


check("Dockerfile", r"nvidia/cuda:[0-9.]+-devel-ubuntu", r"nvidia/cuda:[0-9.]+-runtime-ubuntu")
check("Dockerfile.cpu", r"debian:12-slim$", r"debian:12-slim$")
for e in errors:
    print("check_dockerfiles: " + e)
print("check_dockerfiles: %s" % ("FAILED" if errors else "ok"))
sys.exit(1 if errors else 0)
