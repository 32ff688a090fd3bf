#!/usr/bin/env python3
# A model, not a measurement: how long the DFlash attention's dk/dv pass (kernels/dflash_attention_kv.cu) takes
# on bench_kernels dflash's problem if each CTA's time were a fixed cost plus one unit per item, for the grid
# orders the kernel can run in. It rebuilds the kernel's work lists from the same anchors as
# bench_dflash_attention (one every ~8 tokens, 512 per 4096-token sequence): a cluster per (128-key tile, kv
# head), whose two CTAs take the contiguous halves of the list of blocks that see the tile (an item is a block's
# 64 query rows of the kv head's group against the tile's 128 keys). Clusters start in launch order on the
# first free cluster slot (one CTA per SM, two SMs a cluster) and run to their end: list scheduling, no
# preemption. Orders: `head` (the default grid, blockIdx.x the tile: each kv head's tiles in a row),
# `tile` (DFLASH_DFA_KV_ORDER=tile: each tile's kv heads in a row) and `lpt` (longest first, the best a static
# order does). `bound` is the larger of the total work over the slots and the longest cluster.
#
# It says where to look, not what the GPU does: the real item time varies with the mask, the L2 hit rate and
# the clock, and the block scheduler's order is the launch order only roughly. bench_kernels dflash measures.
#   python3 benchmarks/kv_schedule_model.py [--slots 66] [--fixed 2] [--window 2048 0] [--sequences 1 8]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--slots", type=int, default=66, help="clusters that run at once (132 SMs / 2)")
    ap.add_argument("--fixed", type=float, default=2.0, help="a CTA's fixed cost in item units")
    ap.add_argument("--heads", type=int, default=8, help="kv heads")
    ap.add_argument("--window", type=int, nargs="+", default=[2048, 0])
    ap.add_argument("--sequences", type=int, nargs="+", default=[1, 8])
    a = ap.parse_args()
    print(f"dk/dv pass schedule model: {a.slots} cluster slots, a CTA = {a.fixed:g} + items (units of one item)")
    for w in a.window:
        for s in a.sequences:
            tiles = cluster_items(w, s)
            dur = [a.fixed + max(r) for r in tiles]  # a cluster holds its slot until its longer CTA ends
            head = [dur[t] for _ in range(a.heads) for t in range(len(dur))]
            tile = [dur[t] for t in range(len(dur)) for _ in range(a.heads)]
            lpt = sorted(head, reverse=True)
            bound = max(sum(head) / a.slots, max(head))
            m = {k: makespan(v, a.slots) for k, v in (("head", head), ("tile", tile), ("lpt", lpt))}
            print(f"{'W' + str(w) if w else 'full'} S{s}: head {m['head']:.0f}, tile {m['tile']:.0f} "
                  f"({m['tile'] / m['head'] - 1:+.1%}), lpt {m['lpt']:.0f}, bound {bound:.0f}")


if __name__ == "__main__":
    main()
