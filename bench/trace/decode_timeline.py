#!/usr/bin/env python3
"""Per-step figures from a cupti_trace CSV of step_bench's decode steps (bench/trace/cupti_trace.cpp).

A step is the device work between two device-to-host copies (step_bench downloads the picked ids once a step).
For each step: its span, the time the GPU had no kernel running, and how much of that idle time waited on the
host (the kernel's launch call had not returned when the GPU ran out of work). For the median step, the time
each kernel adds to the step ("exposed": its end minus the later of its start and the latest end before it,
with kernels taken in order of their ends), summed by kernel name.

  decode_timeline.py TRACE.csv [--top 40] [--min-kernels 100] [--by-launch] [--sequence]

--sequence also lists the median step's device work in start order: start (us from the step's first start),
duration, exposed time, stream and kernel, to read a layer's critical path.

--by-launch keys kernels by name and launch shape (grid/block, where the trace has it), so that calls of one kernel
on different sizes are told apart.
"""
import argparse
import collections
import csv
import re
import subprocess


def short_name(mangled, cache={}):
    if mangled not in cache:
        try:
            out = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
        except OSError:
            out = mangled
        out = out.replace("(anonymous namespace)::", "").replace("deepinfer::cuda::", "")
        out = re.sub(r"^void ", "", out)
        out = re.sub(r"\([^()]*\)$", "", out)  # drop the parameter list
        cache[mangled] = out[:70]
    return cache[mangled]


def label(kind, name):
    if kind != "kernel":
        return kind
    if isinstance(name, tuple):
        return f"{short_name(name[0])} {name[1]}"
    return short_name(name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--min-kernels", type=int, default=100)
    ap.add_argument("--by-launch", action="store_true")
    ap.add_argument("--sequence", action="store_true")
    a = ap.parse_args()
    dev, api_end = [], {}
    for r in csv.DictReader(open(a.trace)):
        s, e = int(r["start_ns"]), int(r["end_ns"])
        if r["kind"] == "api":
            api_end[r["correlation"]] = e
        else:
            name = r["name"]
            if a.by_launch and r.get("launch"):
                name = (name, r["launch"])
            dev.append((s, e, r["kind"], name, r["correlation"], r["stream"]))
    dev.sort()
    d2h = [i for i, d in enumerate(dev) if d[2] == "memcpy" and d[3].startswith("kind2")]
    steps = []
    for i0, i1 in zip(d2h, d2h[1:]):
        ks = [d for d in dev[i0 + 1 : i1 + 1]]
        if sum(1 for d in ks if d[2] == "kernel") >= a.min_kernels:
            steps.append(ks)
    print(f"{len(steps)} steps of >= {a.min_kernels} kernels")
    print(f"{'step us':>9} {'kernels':>8} {'busy us':>9} {'idle us':>9} {'on host':>9}")
    summaries = []
    for ks in steps:
        t0, t1 = ks[0][0], max(d[1] for d in ks)
        by_end = sorted(ks, key=lambda d: d[1])
        latest, idle, host_idle = ks[0][0], 0, 0
        exposed = collections.Counter()
        calls = collections.Counter()
        added = {}
        # Idle: the gaps in the union of the step's device intervals (taken in start order, so that a short kernel
        # on another stream inside a long one counts no gap); on host: the part of a gap before the next kernel's
        # launch call returned.
        covered = ks[0][0]
        for s, e, kind, name, corr, _ in ks:
            if s > covered:  # the GPU had nothing running
                idle += s - covered
                if api_end.get(corr, 0) > covered:
                    host_idle += min(s, api_end[corr]) - covered
            covered = max(covered, e)
        for s, e, kind, name, corr, _ in by_end:
            key = label(kind, name)
            exposed[key] += max(0, e - max(s, latest))
            added[(s, corr)] = max(0, e - max(s, latest))
            calls[key] += 1
            latest = max(latest, e)
        span = t1 - t0
        n = sum(1 for d in ks if d[2] == "kernel")
        print(f"{span / 1e3:9.1f} {n:8d} {(span - idle) / 1e3:9.1f} {idle / 1e3:9.1f} {host_idle / 1e3:9.1f}")
        summaries.append((span, exposed, calls, n, ks, added))
    if not summaries:
        return
    # Decode steps: those of the commonest kernel count (the context's prefill chunks, and the occasional step that
    # also forks sequences or records the routing, launch other numbers).
    common = collections.Counter(x[3] for x in summaries).most_common(1)[0][0]
    decode = sorted((x for x in summaries if x[3] == common), key=lambda x: x[0])
    span, exposed, calls, n, ks, added = decode[len(decode) // 2]
    print(f"\nmedian step {span / 1e3:.1f} us, {n} kernels; time added to the step by kernel:")
    print(f"{'us':>8} {'calls':>6} {'us/call':>8}  kernel")
    for key, ns in exposed.most_common(a.top):
        print(f"{ns / 1e3:8.1f} {calls[key]:6d} {ns / 1e3 / calls[key]:8.2f}  {key}")
    rest = sum(exposed.values()) - sum(ns for _, ns in exposed.most_common(a.top))
    print(f"{rest / 1e3:8.1f}        (the rest)")
    if a.sequence:
        print(f"\nthe median step in start order:\n{'start':>8} {'us':>7} {'added':>7} {'stream':>6}  kernel")
        t0 = ks[0][0]
        for s, e, kind, name, corr, stream in ks:
            print(f"{(s - t0) / 1e3:8.1f} {(e - s) / 1e3:7.2f} {added[(s, corr)] / 1e3:7.2f} {stream:>6}  "
                  f"{label(kind, name)}")


if __name__ == "__main__":
    main()
