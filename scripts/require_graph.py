#!/usr/bin/env python3
"""The Lua module graph, read from the source with a pattern (no Lua is run).

Usage: python3 scripts/require_graph.py [--edges] [--check] [--root DIR]

Nodes are the modules under lua/ (clrt.*, recipes.*, metrics.*, interactions.*) and
examples/ (collab_world.*); an edge is a require("name") with a literal name that is one of
those modules. Prints files, lines, edges, the require cycles (strongly connected groups of
more than one module) and the upward edges: a library
module (clrt.*) that requires a recipe, metric, simulated user or example. Also counted in
library modules: uses of the global `clrt` (a `clrt.x` outside strings and comments in a
file that has no `local clrt`; lua/clrt/init.lua, which defines it, left out) and requires of
lua-cjson. With --check the exit status is 1 when there is a cycle, an upward edge, a use of
the global or a require of lua-cjson in the library.
--root DIR reads another checkout (e.g. an older commit's `git archive`).
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOBAL_USE = re.compile(r"(?<![\w.:])clrt\.[A-Za-z_]+")
CJSON = re.compile(r"""require\s*\(?\s*["']cjson""")
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


LONG_OPEN = re.compile(r"\[(=*)\[")


def lex(text):
    """text with comments removed and every string's contents emptied (newlines kept), by a
    small scan of Lua's comment and string syntax; and the strings' contents, in order."""
    out, strings, i, n = [], [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            m = LONG_OPEN.match(text, i + 2)
            if m:
                end = text.find("]" + m.group(1) + "]", m.end())
                end = n if end < 0 else end + len(m.group(1)) + 2
                out.append("\n" * text.count("\n", i, end))
            else:
                end = text.find("\n", i)
                end = n if end < 0 else end
            i = end
        elif c == "[" and LONG_OPEN.match(text, i):
            m = LONG_OPEN.match(text, i)
            end = text.find("]" + m.group(1) + "]", m.end())
            end = n if end < 0 else end
            strings.append(text[m.end():end])
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end + len(m.group(1)) + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            strings.append(text[i + 1:j])
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out), strings


def strip_comments(text):
    """text without comments; strings kept (require names are strings)."""
    code, strings = lex(text)
    it = iter(strings)
    return re.sub(r"\"\"|''", lambda m: m.group(0)[0] + next(it, "") + m.group(0)[0], code)


def strip_strings(text):
    return lex(text)[0]


def global_uses(modules):
    """(module, count) of uses of the global clrt in library modules."""
    out = []
    for name, (_, text) in sorted(modules.items()):
        if not is_library(name) or name == LIBRARY_PREFIX:
            continue
        code = strip_strings(text)
        if re.search(r"\blocal\s+clrt\b", code):
            continue
        n = len(GLOBAL_USE.findall(code))
        if n:
            out.append((name, n))
    return out


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
    global ROOT
    if "--root" in argv:
        ROOT = os.path.abspath(argv[argv.index("--root") + 1])
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
    uses = global_uses(modules)
    print(f"global clrt uses in library modules {sum(n for _, n in uses)} in {len(uses)} modules")
    for name, n in uses:
        print(f"  {name}: {n}")
    cjson = [m for m in sorted(lib) if CJSON.search(strip_comments(modules[m][1]))]
    print(f"library modules requiring lua-cjson {len(cjson)}" + (": " + ", ".join(cjson) if cjson else ""))
    if "--edges" in argv:
        for a in sorted(edges):
            for b in edges[a]:
                print(f"edge {a} -> {b}")
    if "--check" in argv and (found or upward or uses or cjson):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
