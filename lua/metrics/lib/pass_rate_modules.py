"""The top-level modules each code task needs, for pass_rate's check before a run
(metrics/lib/pass_rate_env.lua). Reads a JSON list of rows {libs, tests, solution} on
stdin; writes a JSON list of module lists. A row's published library list (BigCodeBench's
`libs`, a list or its Python repr) wins; else the imports of its tests and its reference
solution, read from their syntax trees (nothing is run; the tests' unconditional
top-level imports, every import of the solution). Standard-library modules are
left out: the interpreter always has them.
"""
import ast
import json
import sys

# BigCodeBench's `libs` names a few libraries by their distribution, not their module
DIST_TO_MODULE = {"sklearn": "sklearn", "scikit-learn": "sklearn", "scikit-image": "skimage", "Pillow": "PIL",
                  "PIL": "PIL", "opencv-python": "cv2", "beautifulsoup4": "bs4", "python-dateutil": "dateutil",
                  "pyyaml": "yaml", "PyYAML": "yaml", "pycryptodome": "Crypto", "python-docx": "docx",
                  "python-Levenshtein": "Levenshtein"}


def imports(src, top_level_only=False):
    """The top-level modules src imports; top_level_only: only its unconditional imports at
    module level (a test source may guard an optional one with try)."""
    try:
        tree = ast.parse(src or "")
    except SyntaxError:
        return set()
    out = set()
    for node in (tree.body if top_level_only else ast.walk(tree)):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def libs_of(v):
    if isinstance(v, str):
        try:
            v = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            v = [s.strip() for s in v.split(",")]
    if not isinstance(v, (list, tuple)):
        return None
    return {DIST_TO_MODULE.get(x, x).split(".")[0] for x in v if isinstance(x, str) and x}


def main():
    stdlib = set(sys.stdlib_module_names)
    out = []
    for row in json.load(sys.stdin):
        mods = libs_of(row.get("libs")) if row.get("libs") is not None else None
        if mods is None:
            mods = imports(row.get("tests"), True) | imports(row.get("solution"))
        out.append(sorted(m for m in mods if m not in stdlib and m != "__future__"))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
