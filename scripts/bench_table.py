#!/usr/bin/env python3
"""Print criterion results as a markdown table with ratios to kmemcg.

Usage: python3 scripts/bench_table.py [target/criterion]
Reads each benchmark's median from new/estimates.json; rows are
group[/parameter], columns the allocators.
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

print("| workload | " + " | ".join(allocs) + " | " + " | ".join(f"kmemcg/{a}" for a in allocs if a != "kmemcg") + " |")
print("|---" * (2 * len(allocs)) + "|")
for key in sorted(rows):
    r = rows[key]
    cells = [fmt(r[a]) if a in r else "-" for a in allocs]
    ratios = [f"{r['kmemcg']/r[a]:.2f}x" if a in r and "kmemcg" in r else "-" for a in allocs if a != "kmemcg"]
    print(f"| {key} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
