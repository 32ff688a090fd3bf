#!/usr/bin/env python3
"""Summarise `bench_kernels decode` logs of several passes (benchmarks/run_decode_ab.sh): one line per row,
its median us over the passes, min and max, its median ratio to the bandwidth time, and for a switch's row
(a [tag] after the shape) its median change against the default row of the same kernel and shape, with how
many passes it was faster in. A row's {plan} tag (the split plan it timed) is shown but not used to match.

    python3 benchmarks/decode_ab_summary.py pass1.log pass2.log ...

Exits 2 when a log has no decode rows or the passes do not time the same rows."""
import re
import statistics
import sys

ROW = re.compile(r"^(?P<name>\S.*?)\s+(?P<mb>\d+\.\d+) MB\s+(?P<us>\d+\.\d+) us\s+\d+ GB/s\s+[\d.]+ % of copy\s+"
                 r"(?P<ratio>\d+\.\d+)x bw time")
TAG = re.compile(r"\s*\[(?P<tag>[^\]]+)\]")
PLAN = re.compile(r"\s*\{[^}]*\}")


def parse(path):
    rows = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = ROW.match(line.rstrip("\n"))
            if not m:
                continue
            name = m.group("name")
            plan = PLAN.search(name)
            key = PLAN.sub("", name).strip()
            rows[key] = (float(m.group("us")), float(m.group("ratio")), plan.group(0).strip() if plan else "")
    return rows


def base_of(key):
    """The default row a switch's row compares with: the name without its [tag]; None for a default row."""
    m = TAG.search(key)
    if not m or m.group("tag") == "graph":
        return None
    return TAG.sub("", key).strip()


def main(paths):
    passes = [parse(p) for p in paths]
    for p, rows in zip(paths, passes):
        if not rows:
            with open(p, encoding="utf-8", errors="replace") as f:
                first = next((line.strip() for line in f if line.strip()), "(empty)")
            print(f"decode_ab_summary: {p}: no decode rows; it begins: {first}", file=sys.stderr)
            return 2
    keys = list(passes[0])
    for p, rows in zip(paths[1:], passes[1:]):
        if set(rows) != set(keys):
            missing = sorted(set(keys) ^ set(rows))
            print(f"decode_ab_summary: {p} times other rows than {paths[0]}: {missing[:4]}", file=sys.stderr)
            return 2
    width = max(len(k) for k in keys)
    print(f"{len(paths)} passes; us a call: median [min, max]; x bandwidth time (median); "
          "a switch's row against its default row in the same pass")
    for k in keys:
        us = [rows[k][0] for rows in passes]
        ratio = statistics.median(rows[k][1] for rows in passes)
        plan = passes[0][k][2]
        line = (f"{k:<{width}}  {statistics.median(us):8.2f} [{min(us):.2f}, {max(us):.2f}]  {ratio:5.2f}x"
                f"  {plan}")
        base = base_of(k)
        if base and base in passes[0]:
            change = [rows[k][0] / rows[base][0] - 1 for rows in passes]
            faster = sum(c < 0 for c in change)
            line += f"  {100 * statistics.median(change):+6.1f} % vs default, faster in {faster}/{len(paths)}"
        print(line)
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
