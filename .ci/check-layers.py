#!/usr/bin/env python3
"""Fails when a `crate::` path in src/ runs against the layer order, or when modules
within one layer depend on each other in a cycle; and, inside the store, when the neutral
part names a backend, a backend names the other, or a file outside a backend uses that
backend's crates.

The order is the one src/lib.rs states. Test code (files named tests.rs or *_tests.rs,
`tests/` directories, and a trailing `#[cfg(test)] mod tests`) is left out: tests may reach
anywhere.
"""
import os
import re
import sys

# The simulator is a test double, not part of the appliance: its shared state holds every
# dialect's records and each dialect works on that state, a cycle by design. It still may
# not reach up out of its layer.
CYCLES_ALLOWED_IN = {"simulator"}

RANK = {
    "domain": 0,
    "store": 1,
    "providers": 2,
    "simulator": 2,
    "engine": 3,
    "service": 4,
    "http": 5,
    "app": 6,
    "cli": 7,
    "fuzzing": 8,
}
# Inside `store`: the neutral part (seam, rules, records, codec, ...) is below both
# backends, and a backend's crates are used by its own files only. `migrate-store` copies a
# redb file into PostgreSQL, the one place where a backend reaches the other.
BACKENDS = {"redb": ("redb",), "postgres": ("tokio_postgres", "deadpool_postgres", "postgres_types", "refinery")}
BACKEND_CROSSING_ALLOWED = {("redb", "migrate")}

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def expand(text, i):
    """Paths named by the `use`-tree starting at text[i]; returns (paths, end)."""
    paths = []
    m = re.compile(r"\s*((?:\w+\s*::\s*)*)").match(text, i)
    prefix = [p.strip() for p in m.group(1).split("::") if p.strip()]
    j = m.end()
    if j < len(text) and text[j] == "{":
        j += 1
        while True:
            while j < len(text) and text[j] in " \t\n,":
                j += 1
            if j >= len(text) or text[j] == "}":
                return [prefix + p for p in paths] or [prefix], j + 1
            sub, j = expand(text, j)
            paths.extend(sub)
    m2 = re.compile(r"\w+").match(text, j)
    if m2:
        return [prefix + [m2.group(0)]], m2.end()
    return [prefix], j


def references(text, module):
    """Absolute module paths the text names through `crate::` or `super::`."""
    for m in re.finditer(r"\b(crate|(?:super::)+)", text):
        head = m.group(1)
        if head == "crate":
            if not text.startswith("::", m.end()):
                continue
            base, start = [], m.end() + 2
        else:
            ups = head.count("super")
            if ups > len(module) - 1:
                continue
            base, start = module[: len(module) - ups], m.end()
        for path in expand(text, start)[0]:
            if base + path:
                yield base + path


def module_of(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


def is_test_file(rel):
    parts = rel.split(os.sep)
    name = parts[-1]
    return "tests" in parts[:-1] or name == "tests.rs" or name.endswith("_tests.rs") or name.startswith("tests_")


def main():
    problems = []
    edges = {}
    for dirpath, _, files in os.walk(SRC):
        for name in sorted(files):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, SRC)
            if rel in ("lib.rs", "main.rs") or is_test_file(rel):
                continue
            text = open(path, encoding="utf-8").read()
            cut = re.search(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)
            if cut:
                text = text[: cut.start()]
            text = re.sub(r"//[^\n]*", "", text)
            module = module_of(rel)
            layer = module[0]
            if layer not in RANK:
                problems.append(f"src/{rel}: layer {layer!r} is not in the order (add it to .ci/check-layers.py and lib.rs)")
                continue
            problems.extend(store_boundaries(rel, module, text))
            for target in references(text, module):
                other = target[0]
                if other not in RANK:
                    continue
                if other != layer and RANK[other] >= RANK[layer]:
                    problems.append(f"src/{rel}: {layer} uses crate::{'::'.join(target)}, which is not below it")
                if other == layer and layer not in CYCLES_ALLOWED_IN and len(module) > 1 and len(target) > 1 and target[1] != module[1]:
                    edges.setdefault(f"{layer}::{module[1]}", set()).add(f"{layer}::{target[1]}")
    problems.extend(cycles(edges))
    for p in problems:
        print(p)
    if problems:
        print(f"layer check: {len(problems)} problem(s)")
        return 1
    print(f"layer check: {len(RANK)} layers, arrows run one way, no cycle within a layer")
    return 0


def store_boundaries(rel, module, text):
    """The store's own arrows: neutral part <- each backend, and no backend crate elsewhere."""
    backend = module[1] if module[0] == "store" and len(module) > 1 and module[1] in BACKENDS else None
    for name, crates in BACKENDS.items():
        if name == backend:
            continue
        for crate in crates:
            if re.search(rf"(?<![\w:])(?:::)?{crate}::|\buse {crate}\b", text):
                yield f"src/{rel}: uses the {crate} crate, which only src/store/{name}/ may use"
                break
    if module[0] != "store":
        return
    for target in references(text, module):
        if target[0] != "store" or len(target) < 2 or target[1] not in BACKENDS:
            continue
        if backend is None:
            yield f"src/{rel}: the neutral store uses crate::{'::'.join(target)}, a backend"
        elif target[1] != backend and (backend, module[2] if len(module) > 2 else "") not in BACKEND_CROSSING_ALLOWED:
            yield f"src/{rel}: the {backend} backend uses crate::{'::'.join(target)}, the other backend"


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append("cycle: " + " <-> ".join(sorted(comp)))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    sys.exit(main())
