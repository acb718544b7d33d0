#!/usr/bin/env python3
"""The Lua module graph, read from the source with a pattern (no Lua is run).

Usage: python3 scripts/require_graph.py [--edges] [--check]

Nodes are the modules under lua/ (clrt.*, recipes.*, metrics.*, interactions.*) and
examples/ (collab_world.*); an edge is a require("name") with a literal name that is one of
those modules. Prints files, lines, edges, the require cycles (strongly connected groups of
more than one module, or a module that requires itself) and the upward edges: a library
module (clrt.*) that requires a recipe, metric, simulated user or example. With --check the
exit status is 1 when there is a cycle or an upward edge.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [("lua", ""), ("examples", "")]
REQUIRE = re.compile(r"""require\s*\(?\s*["']([\w.]+)["']""")
LIBRARY_PREFIX = "clrt"


def module_name(rel):
    name = rel[:-len(".lua")].replace(os.sep, ".")
    return name[:-len(".init")] if name.endswith(".init") else name


def read_modules():
    modules = {}
    for top, _ in SOURCES:
        base = os.path.join(ROOT, top)
        for dirpath, _, names in os.walk(base):
            for n in sorted(names):
                if n.endswith(".lua"):
                    path = os.path.join(dirpath, n)
                    with open(path, encoding="utf-8") as f:
                        modules[module_name(os.path.relpath(path, base))] = (path, f.read())
    return modules


def strip_comments(text):
    # Long comments first, then line comments; strings holding "--" are rare in requires.
    text = re.sub(r"--\[(=*)\[.*?\]\1\]", "", text, flags=re.S)
    return re.sub(r"--[^\n]*", "", text)


def edges_of(modules):
    edges = {}
    for name, (_, text) in modules.items():
        targets = {t for t in REQUIRE.findall(strip_comments(text)) if t in modules and t != name}
        edges[name] = sorted(targets)
    return edges


def cycles(edges):
    """Tarjan's strongly connected components with more than one member."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def is_library(name):
    return name == LIBRARY_PREFIX or name.startswith(LIBRARY_PREFIX + ".")


def main(argv):
    modules = read_modules()
    edges = edges_of(modules)
    lib = [m for m in modules if is_library(m)]
    lines = sum(modules[m][1].count("\n") for m in modules)
    lib_lines = sum(modules[m][1].count("\n") for m in lib)
    n_edges = sum(len(t) for t in edges.values())
    upward = [(a, b) for a in sorted(lib) for b in edges[a] if not is_library(b)]
    found = cycles(edges)
    print(f"modules {len(modules)} (library {len(lib)}), lines {lines} (library {lib_lines})")
    print(f"require edges {n_edges} (from library modules {sum(len(edges[m]) for m in lib)})")
    print(f"cycles {len(found)}")
    for group in found:
        print("  cycle: " + " <-> ".join(group))
    print(f"upward edges (library -> recipe/metric/user/example) {len(upward)}")
    for a, b in upward:
        print(f"  {a} -> {b}")
    if "--edges" in argv:
        for a in sorted(edges):
            for b in edges[a]:
                print(f"edge {a} -> {b}")
    if "--check" in argv and (found or upward):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
