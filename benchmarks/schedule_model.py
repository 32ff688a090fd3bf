#!/usr/bin/env python3
# A model, not a measurement: how long a kernel whose CTAs do unequal work takes if each CTA's time were a fixed
# cost plus one unit per unit of its work, for the launch orders the kernel can run in. Clusters (or CTAs)
# start in launch order on the first free slot and run to their end: list scheduling, no preemption. Each
# order is printed beside `lpt` (longest first, the best a static order does) and `bound` (the larger of the
# total work over the slots and the longest job). It says where to look, not what the GPU does: the real times
# vary with masks, L2 hit rates and the clock, and the block scheduler follows the launch order only roughly.
# bench_kernels measures (`dflash`, `attention`).
#
#   python3 benchmarks/schedule_model.py dfa-kv [--slots 66] [--fixed 2] [--window 2048 0] [--sequences 1 8]
#     The DFlash attention's dk/dv pass (kernels/attention/dflash_attention_kv.cu) on bench_kernels dflash's problem:
#     its work lists rebuilt from the same anchors (one every ~8 tokens, 512 per 4096-token sequence), a
#     cluster per (128-key tile, kv head) whose two CTAs take the contiguous halves of the list of blocks that
#     see the tile; a unit is one item (a block's 64 query rows against the tile). One CTA per SM, two SMs a
#     cluster. Orders: `head` (the default grid, each kv head's tiles in a row), `tile`
#     (each tile's kv heads in a row) and `tile4` (the same within groups of 4 kv heads: the kernel's order).
#     --context-only: the grid without the own-row tiles (the dq pass writes those rows, as the kernel does).
#   python3 benchmarks/schedule_model.py attention [--slots 132] [--fixed 1]
#     The Hopper causal attention (kernels/attention/attention_sm90.cu) at bench_kernels attention's 8 x 4096 tokens,
#     128 query rows an item, a unit one key tile (128 keys; 80 at head dim 256 scale alike). Item orders:
#     `head` (each head's tiles longest first: the kernel's order) and `heads` (each tile's heads
#     together, a sequence's longest tiles first), each on three schedules: one CTA an item (--fixed paid per
#     item, the hardware starting them in order), `zigzag` (the persistent grid's
#     static rounds of 132 items, every other one reversed; the fixed cost taken as hidden) and `dynamic`
#     (the kernel's schedule: the persistent CTAs take the next item as they free up, fixed cost hidden).
import argparse
import heapq


def cluster_items(window, sequences, length=4096, per_seq=512, block=16, keys=128):
    """Items per CTA of each key tile's cluster (rank 0, rank 1), tiles in row order."""
    anchors = [8 * i + (i * 5) % 8 for i in range(per_seq)]
    total = sequences * length
    blocks = []  # (sequence start, anchor, first own row)
    for s in range(sequences):
        for i, a in enumerate(anchors):
            blocks.append((s * length, a, total + (s * per_seq + i) * block))

    def ctx_lo(a):  # the first context key of the block's first query row
        return min(a, max(0, a - (window - 1))) if window > 0 else 0

    rows = total + len(blocks) * block
    tiles = []
    for t in range((rows + keys - 1) // keys):
        r0, r1 = t * keys, min(t * keys + keys, rows)
        n = sum(1 for s0, a, bj in blocks
                if (s0 + ctx_lo(a) < r1 and s0 + a > r0) or (bj < r1 and bj + block > r0))
        tiles.append((n // 2, n - n // 2))
    return tiles


def makespan(durations, slots):
    free = [0.0] * slots
    for d in durations:
        t = heapq.heappop(free)
        heapq.heappush(free, t + d)
    return max(free)


def attention_jobs(length=4096, rows=128, keys=128):
    """Key tiles per query tile, longest first, of one (sequence, head)."""
    n = (length + rows - 1) // rows
    return [((min(length, (n - x) * rows) + keys - 1) // keys) for x in range(n)]


def zigzag(durations, slots):
    """Static rounds of `slots` items, every other round reversed; each slot's total."""
    total = [0.0] * slots
    for i, d in enumerate(durations):
        r, c = divmod(i, slots)
        total[slots - 1 - c if r & 1 else c] += d
    return max(total)


def report(name, orders, slots, extra=None):
    base = orders["head"]
    m = {k: makespan(v, slots) for k, v in orders.items()}
    m.update(extra or {})
    m["lpt"] = makespan(sorted(base, reverse=True), slots)
    bound = max(sum(base) / slots, max(base))
    alts = ", ".join(f"{k} {m[k]:.0f} ({m[k] / m['head'] - 1:+.1%})" for k in m if k not in ("head", "lpt"))
    print(f"{name}: head {m['head']:.0f}, {alts}, lpt {m['lpt']:.0f}, bound {bound:.0f}")


def main():
    ap = argparse.ArgumentParser(description="list-scheduling model of launch orders (see the file's head)")
    ap.add_argument("kernel", choices=["dfa-kv", "attention"])
    ap.add_argument("--slots", type=int, help="jobs that run at once (dfa-kv: 66 clusters; attention: 132 CTAs)")
    ap.add_argument("--fixed", type=float, help="a job's fixed cost in work units (dfa-kv 2, attention 1)")
    ap.add_argument("--window", type=int, nargs="+", default=[2048, 0], help="dfa-kv: sliding windows (0 full)")
    ap.add_argument("--sequences", type=int, nargs="+", default=[1, 8], help="dfa-kv: sequences of 4096")
    ap.add_argument("--context-only", action="store_true", help="dfa-kv: no own-row tiles (the dq pass writes them)")
    a = ap.parse_args()
    if a.kernel == "dfa-kv":
        slots = a.slots or 66
        fixed = 2.0 if a.fixed is None else a.fixed
        heads = 8
        print(f"dk/dv pass, 32/8 heads: {slots} cluster slots, a CTA = {fixed:g} + items"
              + (", context tiles only" if a.context_only else ""))
        for w in a.window:
            for s in a.sequences:
                tiles = cluster_items(w, s)
                if a.context_only:
                    tiles = tiles[:(s * 4096 + 127) // 128]
                dur = [fixed + max(r) for r in tiles]  # a cluster ends with its longer CTA
                report(f"{'W' + str(w) if w else 'full'} S{s}",
                       {"head": [dur[t] for _ in range(heads) for t in range(len(dur))],
                        "tile": [dur[t] for t in range(len(dur)) for _ in range(heads)],
                        "tile4": [dur[t] for _ in range(heads // 4) for t in range(len(dur)) for _ in range(4)]},
                       slots)
    else:
        slots = a.slots or 132
        fixed = 1.0 if a.fixed is None else a.fixed
        print(f"causal attention, 8 x 4096 tokens: {slots} CTA slots, a CTA = {fixed:g} + key tiles")
        for hq in (24, 32):
            work = attention_jobs()
            by_head = [d for _ in range(8) for _ in range(hq) for d in work]
            by_tile = [d for _ in range(8) for d in work for _ in range(hq)]
            report(f"{hq} q heads", {"head": [fixed + d for d in by_head], "heads": [fixed + d for d in by_tile]},
                   slots, {"zigzag head": zigzag(by_head, slots), "zigzag heads": zigzag(by_tile, slots),
                           "dynamic head": makespan(by_head, slots), "dynamic heads": makespan(by_tile, slots),
                           "bound without fixed costs": max(sum(by_head) / slots, max(by_head))})


if __name__ == "__main__":
    main()
