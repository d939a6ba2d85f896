#!/usr/bin/env python3
"""Print criterion results as a markdown table with ratios to kmemcg.

Usage: python3 scripts/bench_table.py [target/criterion]
Reads each benchmark's median from new/estimates.json; rows are
group[/parameter], columns the allocators, then kmemcg over each and over
the best of jemalloc, mimalloc and System (the issue-20 targets). After
the table: thread scaling (aggregate pairs per second of N threads over
one thread's, and of 100 threads over 8) per allocator.
"""
import json, os, sys

root = sys.argv[1] if len(sys.argv) > 1 else "target/criterion"
rows = {}
for dirpath, dirnames, filenames in os.walk(root):
    if os.path.basename(dirpath) == "new" and "estimates.json" in filenames:
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            b = json.load(f)
        with open(os.path.join(dirpath, "estimates.json")) as f:
            med = json.load(f)["median"]["point_estimate"]
        group, func, param = b["group_id"], b.get("function_id"), b.get("value_str")
        key = group + (f"/{param}" if param else "")
        rows.setdefault(key, {})[func] = med
allocs = sorted({a for r in rows.values() for a in r}, key=lambda a: (a != "kmemcg", a))

def fmt(ns):
    return f"{ns/1e6:.2f} ms" if ns >= 1e6 else f"{ns:.2f} ns"

PEERS = ("jemalloc", "mimalloc", "system")
print("| workload | " + " | ".join(allocs) + " | " + " | ".join(f"kmemcg/{a}" for a in allocs if a != "kmemcg") + " | kmemcg/best peer |")
print("|---" * (2 * len(allocs) + 1) + "|")
for key in sorted(rows):
    r = rows[key]
    cells = [fmt(r[a]) if a in r else "-" for a in allocs]
    ratios = [f"{r['kmemcg']/r[a]:.2f}x" if a in r and "kmemcg" in r else "-" for a in allocs if a != "kmemcg"]
    peers = [(r[a], a) for a in PEERS if a in r]
    best = f"{r['kmemcg']/min(peers)[0]:.2f}x ({min(peers)[1]})" if peers and "kmemcg" in r else "-"
    print(f"| {key} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {best} |")

# Time per pair per thread t_N: aggregate throughput of N threads over M
# threads' is (N / t_N) / (M / t_M).
pairs = [("threads2-pair", 2, "threads1-pair", 1), ("threads100-pair", 100, "threads8-pair", 8)]
if any(n in rows and m in rows for n, _, m, _ in pairs):
    print()
    print("| aggregate throughput | " + " | ".join(allocs) + " |")
    print("|---" * (len(allocs) + 1) + "|")
    for n, tn, m, tm in pairs:
        if n in rows and m in rows:
            cells = [f"{(tn / rows[n][a]) / (tm / rows[m][a]):.2f}x" if a in rows[n] and a in rows[m] else "-" for a in allocs]
            print(f"| {tn} threads over {tm} | " + " | ".join(cells) + " |")
