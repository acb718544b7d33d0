#!/usr/bin/env python3
"""The C side's file graph, read from the source with patterns (nothing is compiled).

Usage: python3 scripts/c_graph.py [--edges] [--check] [--root DIR]

Reads runtime/**/*.c|.cu and kernels/**/*.c|.cu|.h|.cuh. A node is a file; file B has an
edge to file A when B names (calls, or takes the address of, as the ops tables do) a
function that A defines without `static` (definitions found by a pattern over the code with
comments, strings and preprocessor lines removed; inline and __device__ functions are a
file's own). Prints, per folder, its files, lines, the edges between its files and their
cycles (strongly connected groups of more than one file); then the edges between folders,
the kernels that include a runtime header or name a runtime function (the CUDA kernels'
stream and cuBLAS handle are their own, kernels/cuda/launch_context.cu, which the runtime
makes and destroys), memory allocation in the CPU kernels (they take
their workspace from the caller) and the uses of CLRT_HAVE_CUDA outside the files that may
know CUDA (DEVICE_FILES).
--edges also lists every edge. With --check the exit status is 1 when a folder has a cycle,
a kernel includes a runtime header or names a runtime function, a CPU kernel allocates or
frees memory, or CLRT_HAVE_CUDA appears outside DEVICE_FILES.
--root DIR reads another checkout (e.g. an older commit's `git archive`).
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = {"runtime": (".c", ".cu"), "kernels": (".c", ".cu", ".h", ".cuh")}
# The files that may know CUDA: the model's CUDA ops table and placement, device memory
# and the CUDA context, NCCL over device buffers, and the CUDA kernels themselves.
DEVICE_FILES = ("runtime/model/ops_cuda.c", "runtime/model/device.c", "runtime/core/cuda_tensor.c",
                "runtime/core/cuda_context.cu", "runtime/net/dist.c")
DEVICE_FOLDERS = ("kernels/cuda/",)
ALLOC = re.compile(r"\b(malloc|calloc|realloc|free|aligned_alloc|posix_memalign)\s*\(")
CUDA_MACRO = re.compile(r"\bCLRT_HAVE_CUDA\b")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
IDENT = re.compile(r"[A-Za-z_]\w*")
# the head of a function definition: a name, its parameter list (one level of nested
# parentheses, for function-pointer parameters), then the body's brace
DEF_HEAD = re.compile(r"(\w+)\s*\(((?:[^()]|\([^()]*\))*)\)\s*$")
NOT_FUNCTIONS = {"if", "for", "while", "switch", "return", "sizeof", "defined"}


def strip(text, keep_directives=False):
    """text with comments (and, unless keep_directives, preprocessor lines) blanked and string
    and character literals emptied (newlines kept, so line numbers stay). keep_directives is
    for finding CLRT_HAVE_CUDA, which only directives use."""
    out, i, n = [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#" and not keep_directives:   # a directive, with its continuation lines
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":   # a literal ends at its quote or, unterminated (#error don't), at the line's end
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            if c == "\n":
                line_start = True
            out.append(c)
            i += 1
    return "".join(out)


def definitions(code):
    """Names of the functions code defines at file level without static."""
    names, depth, head = [], 0, []
    for tok in re.finditer(r"[{};]|[^{};]+", code):
        t = tok.group(0)
        if t == "{":
            h = " ".join("".join(head).split())
            head = []
            if depth == 0 and re.fullmatch(r'extern\s*""', h):
                continue   # extern "C" { ... }: its contents stay at file level
            if depth == 0:
                m = DEF_HEAD.search(h)
                words = set(IDENT.findall(h[:m.start()])) if m else set()
                local = "static" in words or "inline" in words or "__forceinline__" in words or \
                    ("__device__" in words and "__global__" not in words)   # a .cu's own device function
                if m and m.group(1) not in NOT_FUNCTIONS and not local and "typedef" not in words \
                        and "=" not in h[:m.start()] and (words or h.startswith(m.group(1))):
                    names.append(m.group(1))
            depth += 1
        elif t == "}":
            depth = max(depth - 1, 0)
            head = []
        elif t == ";":
            head = []
        elif depth == 0:
            head.append(t)
    return names


def read_files(root):
    files = {}
    for top, exts in SOURCES.items():
        for dirpath, dirnames, names in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for n in sorted(names):
                if n.endswith(exts):
                    path = os.path.join(dirpath, n)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        text = f.read()
                    files[os.path.relpath(path, root).replace(os.sep, "/")] = text
    return files


def sccs(nodes, edges):
    """Strongly connected components (Tarjan), each a sorted list."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def folder(path):
    return os.path.dirname(path)


def is_device_file(path):
    return path in DEVICE_FILES or path.startswith(DEVICE_FOLDERS)


def main(argv):
    check, show_edges, root = "--check" in argv, "--edges" in argv, ROOT
    if "--root" in argv:
        root = argv[argv.index("--root") + 1]
    files = read_files(root)
    code = {p: strip(t) for p, t in files.items()}
    defined, own = {}, {p: set() for p in files}
    for p, c in code.items():
        if p.endswith((".c", ".cu")):
            for name in definitions(c):
                defined.setdefault(name, set()).add(p)
                own[p].add(name)
    edges = {p: set() for p in files}
    for p, c in code.items():
        # a name the file defines itself is its own (a CUDA build's function and the other
        # build's stub under the opposite #ifdef are no edge between their files)
        for name in set(IDENT.findall(c)) - own[p]:
            for q in defined.get(name, ()):
                if q != p:
                    edges[p].add(q)

    runtime_headers = {os.path.basename(p) for p in files if p.startswith("runtime/") and p.endswith(".h")}
    for dirpath, _, names in os.walk(os.path.join(root, "runtime")):
        runtime_headers.update(n for n in names if n.endswith(".h"))
    problems = []
    kernel_includes, kernel_calls, kernel_allocs, cuda_uses = [], [], [], []
    for p in sorted(files):
        if p.startswith("kernels/"):
            for inc in INCLUDE.findall(files[p]):
                if os.path.basename(inc) in runtime_headers or "runtime/" in inc:
                    kernel_includes.append((p, inc))
            for q in sorted(edges[p]):
                if q.startswith("runtime/"):
                    names = sorted(n for n in set(IDENT.findall(code[p])) - own[p] if q in defined.get(n, ()))
                    kernel_calls.append((p, q, names))
        if p.startswith("kernels/cpu/"):
            for m in ALLOC.finditer(code[p]):
                kernel_allocs.append((p, code[p].count("\n", 0, m.start()) + 1, m.group(1)))
        if not is_device_file(p):
            kept = strip(files[p], keep_directives=True)
            for m in CUDA_MACRO.finditer(kept):
                cuda_uses.append((p, kept.count("\n", 0, m.start()) + 1))

    folders = sorted({folder(p) for p in files})
    total_lines, all_cycles = 0, []
    for d in folders:
        members = [p for p in sorted(files) if folder(p) == d]
        lines = sum(files[p].count("\n") for p in members)
        total_lines += lines
        inner = {p: {q for q in edges[p] if folder(q) == d} for p in members}
        n_edges = sum(len(v) for v in inner.values())
        cycles = [c for c in sccs(members, inner) if len(c) > 1]
        all_cycles += cycles
        sizes = sorted((len(c) for c in cycles), reverse=True)
        print(f"{d}: {len(members)} files, {lines} lines, {n_edges} edges, "
              f"cycles {len(cycles)} (sizes {sizes or 0})")
        for c in cycles:
            print("  cycle: " + " ".join(os.path.basename(x) for x in c))
        if show_edges:
            for p in members:
                for q in sorted(inner[p]):
                    names = sorted(n for n in set(IDENT.findall(code[p])) - own[p] if q in defined.get(n, ()))
                    print(f"    {os.path.basename(p)} -> {os.path.basename(q)}: {', '.join(names)}")
    cross = {}
    for p in files:
        for q in edges[p]:
            if folder(p) != folder(q):
                cross[(folder(p), folder(q))] = cross.get((folder(p), folder(q)), 0) + 1
    print(f"all: {len(files)} files, {total_lines} lines, {sum(len(v) for v in edges.values())} edges")
    print("edges between folders:")
    for (a, b), k in sorted(cross.items()):
        print(f"  {a} -> {b}: {k}")
    print(f"kernels including a runtime header: {len(kernel_includes)}")
    for p, inc in kernel_includes:
        print(f"  {p}: #include \"{inc}\"")
    print(f"kernels naming a runtime function: {len(kernel_calls)}")
    for p, q, names in kernel_calls:
        print(f"  {p} -> {q}: {', '.join(names)}")
    print(f"allocations in kernels/cpu: {len(kernel_allocs)}")
    for p, line, fn in kernel_allocs:
        print(f"  {p}:{line}: {fn}")
    print(f"CLRT_HAVE_CUDA outside the device files: {len(cuda_uses)}")
    for p, line in cuda_uses:
        print(f"  {p}:{line}")
    if check and (all_cycles or kernel_includes or kernel_calls or kernel_allocs or cuda_uses):
        print("check failed: a folder's files are layered (no cycle), kernels are pure (no runtime "
              "header or function, no allocation in kernels/cpu) and CUDA lives only in " +
              ", ".join(DEVICE_FILES + DEVICE_FOLDERS))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
