#!/usr/bin/env python3
"""Checks the layer order of the library (see the crate docs, "Layers").

1. A top-level module uses only the layers below it (and `error`, a leaf
   every layer may name).
2. Sibling modules (children of one module) never import each other in a
   cycle: within a layer, the files form a DAG too.

Imports are read from `use` lines and `crate::`/`super::` paths in library
code; test modules (`src/tests/`, `tests.rs`, `testutil.rs`) are exempt, as
they exercise the whole stack. Prints each violation; exits 1 if any.
"""

import re
import sys
from pathlib import Path

LAYERS = ["sync", "platform", "counter", "page", "slab", "magazine", "cgroup", "heap", "handle", "global"]
LEAVES = {"error"}
REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "src"
# The kernel demos: no layer table, but no two sibling modules may import
# each other (directly or round a cycle) there either.
KERNEL_ROOTS = [
    REPO / "kernel-demo/src",
    REPO / "kernel-demo/common/src",
    REPO / "kernel-demo/aarch64/src",
    REPO / "kernel-demo/cortex-m/src",
]


def module_path(f: Path) -> list[str]:
    """`src/cgroup/tree/registry.rs` -> ["cgroup", "tree", "registry"]."""
    parts = list(f.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("main", "lib") and len(parts) == 1:
        return ["lib"]
    if parts[-1] == "mod":
        parts.pop()
    return parts


def is_test(f: Path) -> bool:
    rel = f.relative_to(ROOT).as_posix()
    return rel.startswith("tests/") or rel.endswith("tests.rs") or rel == "testutil.rs"


def strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


def imports(text: str, me: list[str]) -> set[tuple[str, ...]]:
    """Absolute module paths this file names (as far as the path goes)."""
    out = set()
    text = strip_comments(text)
    # `crate::a::b` and `super::super::a` paths, including inside `use` trees.
    for m in re.finditer(r"\b((?:crate|super)(?:::super)*)((?:::[a-z_][a-z0-9_]*)*)", text):
        head, tail = m.group(1), [p for p in m.group(2).split("::") if p]
        if head.startswith("crate"):
            base: list[str] = []
        else:
            ups = head.count("super")
            base = me[: len(me) - ups]
        out.add(tuple(base + tail))
    # `use super::{a, b::c}` / `use crate::{x, y}`: the first names of a tree.
    for m in re.finditer(r"\buse\s+((?:crate|super)(?:::super)*)::\{([^;]*)\};", text, re.S):
        head, body = m.group(1), m.group(2)
        base = [] if head.startswith("crate") else me[: len(me) - head.count("super")]
        for item in re.findall(r"(?:^|[,{])\s*([a-z_][a-z0-9_]*)", body):
            out.add(tuple(base + [item]))
    return out


def check(root: Path, layered: bool) -> list[str]:
    global ROOT
    ROOT = root
    files = [f for f in sorted(ROOT.rglob("*.rs")) if not is_test(f)]
    mods = {tuple(module_path(f)) for f in files}
    errors = []
    edges: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for f in files:
        me = module_path(f)
        if me in (["lib"],):
            continue
        for target in imports(f.read_text(), me):
            # Resolve to the longest known module prefix.
            t = list(target)
            while t and tuple(t) not in mods:
                t.pop()
            if not t or t == me:
                continue
            top_me, top_t = me[0], t[0]
            if top_me != top_t and layered:
                if top_t in LEAVES or top_me in LEAVES and top_t in LEAVES:
                    continue
                if top_me in LEAVES:
                    errors.append(f"{'/'.join(me)}: the leaf `{top_me}` uses `{top_t}`")
                elif top_t not in LAYERS or top_me not in LAYERS:
                    errors.append(f"{'/'.join(me)}: `{top_t}` is not in the layer table")
                elif LAYERS.index(top_t) > LAYERS.index(top_me):
                    errors.append(f"{'/'.join(me)}: uses `{'/'.join(t)}`, a layer above it")
                continue
            # Same layer: record an edge between the siblings under the
            # deepest common parent (a parent and its children may use each
            # other; siblings may not, both ways).
            k = 0
            while k < min(len(me), len(t)) and me[k] == t[k]:
                k += 1
            if k < len(me) and k < len(t):
                a, b = tuple(me[: k + 1]), tuple(t[: k + 1])
                edges.setdefault(a, set()).add(b)
    # Cycles among siblings.
    state: dict[tuple[str, ...], int] = {}

    def visit(n, stack):
        state[n] = 1
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                cyc = stack[stack.index(m):] + [m] if m in stack else [n, m]
                errors.append("modules import each other: " + " -> ".join("/".join(x) for x in cyc))
            elif m not in state:
                visit(m, stack + [m])
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n, [n])
    return [f"{root.relative_to(REPO)}: {e}" for e in errors]


def main() -> int:
    errors = check(REPO / "src", True)
    for root in KERNEL_ROOTS:
        errors += check(root, False)
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
