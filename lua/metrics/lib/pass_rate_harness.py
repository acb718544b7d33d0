"""pass_rate's harness: runs the policy's code and the task's tests inside the sandbox and
reports the verdict of the test framework itself (metrics/pass_rate.lua, docs/sandbox.md).

    python3 -I pass_rate_harness.py SOLUTION.py TESTS.py [SEMANTICS [DISABLED]]
    (fd 0: the nonce, fd 3: the report)

SEMANTICS is `bigcodebench` (default) or `strict`. DISABLED is a comma list of defenses to
turn off (tests only: each red-team attack is shown to pass without the defense it meets).

bigcodebench reproduces BigCodeBench 0.2.5 untrusted_check's verdict: the code and the
tests run as one program `code + "\\n" + tests` in a module `__test__` with sys, os and
environ pre-bound and builtins.exit/quit set to None; the class TestCases (required) is
loaded with unittest's loader and run; PASS when there is no failure and no error (skips
the tests declare, expected failures, unexpected successes and zero tests pass). strict
also fails skips, unexpected successes and a missing expected test; without TestCase
classes it runs the source as one test that passes when it ends.

Beyond BigCodeBench, a verdict the code cannot forge (each defense has a name, see
DEFENSES): a test passes only when its body returned (a token set by a wrapper after the
real body, kept in a closure); a skip, stop or interrupt raised from the solution's code
is tampering; the test machinery (unittest, unittest.mock, numpy/pandas comparison
helpers, builtins, sys.path, the test functions and their code objects, the modules the
tests import) is compared around every test; an audit hook (which no code can remove)
refuses introspection from the solution's code (frames, gc, tracing, ctypes memory,
code objects of the tests, opening /task); a syntax-tree screen is a second means. The
report is one line `CLRT-PASS-RATE <nonce> <PASS|FAIL> ran=.. expected=.. ok=.. kind=..`
on descriptor 3, kind one of pass, wrong, tamper, env (a module missing: missing=a,b),
written only by this process, which then ends at once (os._exit).
"""
import ast
import builtins
import os
import sys
import types
import unittest
import unittest.mock
import inspect
import opcode
import traceback
import gc

REPORT_FD = 3
DEFENSES = ("token", "skip", "audit", "screen", "machinery", "testfuncs", "imports", "eq", "signals", "isolation",
            "dumpable", "depth", "givers")
# BigCodeBench's namespace, switchable only to show its tests catch the loss (planted faults)
FAULTS = ("prebind", "exitnone")
MACHINERY = ("unittest", "unittest.case", "unittest.result", "unittest.suite", "unittest.loader",
             "unittest.runner", "unittest.main", "unittest.util", "unittest.signals", "unittest.async_case")
# helpers the tests' verdicts rest on: module attributes and class dicts compared around each test
HELPERS = {"numpy": ("numpy", "numpy.testing", "numpy.core.numeric"),
           "pandas": ("pandas", "pandas.testing", "pandas._testing")}
HELPER_CLASSES = {"pandas": ("DataFrame", "Series", "Index")}
MOCK_CLASSES = ("NonCallableMock", "CallableMixin", "Mock", "MagicMixin", "MagicMock", "NonCallableMagicMock",
                "AsyncMockMixin", "AsyncMock", "_Call", "_CallList", "_patch", "_ANY")
# names an honest solution has no reason to use: introspection that reaches the harness or
# the tests, the unittest control flow, and the test class itself
SCREENED = frozenset(("_getframe", "_current_frames", "f_back", "f_globals", "f_locals", "f_builtins", "tb_frame",
                      "gi_frame", "cr_frame", "ag_frame", "__code__", "__closure__", "cell_contents",
                      "settrace", "setprofile", "currentframe", "__globals__",
                      "addaudithook", "_ShouldStop", "SkipTest", "skipTest", "TestCases", "co_consts",
                      "__unittest_skip__", "_outcome", "PyObj_FromPtr", "string_at", "from_address", "memmove"))
PROC_PEEK = __import__("re").compile(r"/proc/[^\s'\"]*/(mem|maps|fd/|environ|syscall)\b")
GC_NAMES = frozenset(("get_referrers", "get_referents", "get_objects"))   # only as gc's: a common method name
LIB_PREFIXES = tuple(p + "/" for p in sys.path if p.startswith("/usr/")) + ("<frozen ",)


def not_dumpable():
    """PR_SET_DUMPABLE 0: no other process of the sandbox's uid may read this one's memory
    (/proc/PID/mem) or its descriptors (/proc/PID/fd): a program the code starts would
    find the nonce there. Forked children inherit it; what they exec starts afresh."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:   # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def make_reporter(dumpable):
    """The one function that can write a report; the nonce lives only in its closure."""
    if not dumpable:
        not_dumpable()
    os.set_inheritable(REPORT_FD, False)   # programs the code starts do not get it by accident
    read, write, exit_now, getpid = os.read, os.write, os._exit, os.getpid
    chunks = []
    while True:
        b = read(0, 4096)
        if not b:
            break
        chunks.append(b)
    nonce = b"".join(chunks).strip()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    chunks = None
    me = getpid()
    # the real streams' flush, bound now: nothing the code put in sys runs at report time
    streams = [(type(s).flush, s) for s in (sys.stdout, sys.stderr) if s is not None]

    def report(verdict, counts):
        for flush, stream in streams:   # the program's own output, for the log
            try:
                flush(stream)
            except BaseException:
                pass
        if getpid() == me:
            try:
                write(REPORT_FD, b"CLRT-PASS-RATE " + nonce + b" " + verdict.encode() + b" " + counts.encode() + b"\n")
            except OSError:
                pass
        exit_now(0)
    return report


def say(text, write=os.write):
    """A line for the log (descriptor 2), which the code may also write: never a verdict."""
    try:
        write(2, ("pass_rate harness: " + text + "\n").encode("utf-8", "replace"))
    except Exception:
        pass


def code_objects(code, out):
    """Every code object inside code (functions, classes, lambdas, comprehensions)."""
    out.add(code)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            code_objects(c, out)
    return out


def harness_codes():
    out = set()
    for v in list(globals().values()):
        if isinstance(v, types.FunctionType):
            code_objects(v.__code__, out)
    f = sys._getframe()
    while f is not None:   # the frames below main (the module's own code)
        out.add(f.f_code)
        f = f.f_back
    return out


def imported_roots(tree):
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return base + "." + node.attr if base else node.attr
    return ""


def expected_tests(tree):
    """{class name: {test names}} the test source's syntax declares: the test* methods of its
    top-level classes (inherited ones within the file included). Tests are found by the
    real classes after the source runs; this only guards against tests disappearing."""
    classes = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            methods = {n.name for n in node.body
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")}
            classes[node.name] = ([dotted(b) for b in node.bases], methods)

    def tests_of(name, depth=0):
        out = set(classes[name][1])
        if depth < 50:
            for base in classes[name][0]:
                if base in classes and base != name:
                    out |= tests_of(base, depth + 1)
        return out
    return {name: tests_of(name) for name in classes}


def screen(tree):
    """The syntax-tree screen (second means beside the audit hook): the first use of a
    screened name, or an __eq__/__ne__ that answers without looking at its operands."""
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
        elif isinstance(node, ast.alias):
            name = node.name.split(".")[-1]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and PROC_PEEK.search(node.value):
            return "reads another process's memory or descriptors (%r, line %d)" % (node.value[:40], node.lineno)
        if name in SCREENED or (name in GC_NAMES and (
                isinstance(node, ast.Attribute) and dotted(node.value) == "gc" or isinstance(node, ast.alias))):
            return "uses %s (line %d)" % (name, getattr(node, "lineno", 0))
        if isinstance(node, (ast.FunctionDef, ast.Lambda)) and getattr(node, "name", "") in ("__eq__", "__ne__"):
            if trivial_compare(node):
                return "defines an %s that ignores its operands (line %d)" % (node.name, node.lineno)
        if isinstance(node, (ast.Dict, ast.Call, ast.Assign)):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Lambda) and trivial_compare(sub) and any(
                        isinstance(c, ast.Constant) and c.value in ("__eq__", "__ne__") or
                        isinstance(c, ast.Attribute) and c.attr in ("__eq__", "__ne__") for c in ast.walk(node)):
                    return "sets an __eq__/__ne__ that ignores its operands (line %d)" % node.lineno
    return None


def trivial_compare(fn):
    """An __eq__ (__ne__) that never reads its operand and answers a constant True (False)
    somewhere; one returning NotImplemented is honest."""
    args = [a.arg for a in fn.args.args] + ([fn.args.vararg.arg] if fn.args.vararg else [])
    used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    if len(args) >= 2 and set(args[1:]) & used:
        return False
    answers = [fn.body] if isinstance(fn, ast.Lambda) else [n.value for n in ast.walk(fn) if isinstance(n, ast.Return)]
    return any(isinstance(a, ast.Constant) and a.value not in (None, NotImplemented) for a in answers)


def module_state(names):
    """(name, module, a copy of its dict) for each loaded module among names."""
    return [(n, sys.modules[n], dict(vars(sys.modules[n]))) for n in names
            if isinstance(sys.modules.get(n), types.ModuleType)]


def class_state(classes):
    return [(c, dict(vars(c))) for c in classes if isinstance(c, type)]


def module_changes(state, strict_new=True):
    for name, mod, attrs in state:
        if sys.modules.get(name) is not mod:
            return "sys.modules[%r] was replaced" % name
        now = vars(mod)
        for k, v in attrs.items():
            if k not in now or now[k] is not v:
                return "%s.%s was changed" % (name, k)
        if strict_new:
            for k in now:
                if k not in attrs and k in BUILTIN_NAMES:
                    return "%s.%s shadows a builtin" % (name, k)
    return None


CODE_TYPES = (types.FunctionType, classmethod, staticmethod, property)


def class_changes(state, code_only=False):
    """Rebound, removed or added attributes; code_only (the tests' own classes, whose data
    attributes setUpClass and unittest's suite set): only methods and properties count."""
    for cls, attrs in state:
        now = vars(cls)
        for k, v in attrs.items():
            if (k not in now or now[k] is not v) and (not code_only or isinstance(v, CODE_TYPES)):
                return "%s.%s was changed" % (cls.__qualname__, k)
        for k, v in now.items():
            if k not in attrs and not k.startswith("_abc_") and (not code_only or isinstance(v, CODE_TYPES)):
                return "%s.%s was added" % (cls.__qualname__, k)
    return None


def dict_changes(label, before, now):
    for k, v in before.items():
        if k not in now or now[k] is not v:
            return "%s.%s was changed" % (label, k)
    return None


BUILTIN_NAMES = frozenset(vars(builtins))


# Objects the code can reach (sys.stdout, signal.signal, a test class's setUpClass) are
# made in namespaces of their own: a function's __globals__ and __closure__ are open to any
# code (no audit event), so none of them may lead to this file's globals or to main's state.
ISOLATED = {
    "out": '''
class BoundedOut:
    """stdout/stderr while the program runs: to the log, at most `left` bytes (BigCodeBench
    swallows the output; a flood must not end the program at the file-size limit)."""
    def __init__(self, fd, left=1 << 20):
        self._fd, self._left = fd, left
        self.encoding, self.errors = "utf-8", "replace"

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if self._left > 0:
            b = s.encode("utf-8", "replace")[:self._left]
            self._left -= len(b)
            try:
                os_write(self._fd, b)
            except OSError:
                self._left = 0
        return len(s)

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True

    def fileno(self):
        return self._fd
''',
    # a skip raised in setUpClass is traced like a test's: the exception is kept for the recorder
    "setupclass": '''
def make(original, seen):
    def setUpClass(cls):
        try:
            return original()
        except BaseException as e:
            seen.append(e)
            raise
    return classmethod(setUpClass)
''',
    # a handler of code outside the system's libraries gets None for the frame it interrupted
    "signal": '''
def make(real_signal, lib_prefixes):
    # defaults, not a closure: reading __defaults__ raises an audit event, __closure__ none
    def signal(signalnum, handler, _real=real_signal, _lib=lib_prefixes):
        fn = getattr(handler, "__func__", handler)
        code = getattr(fn, "__code__", None)
        if callable(handler) and (code is None or not code.co_filename.startswith(_lib)):
            inner = handler

            def handler(signum, frame):
                return inner(signum, None)
        return _real(signalnum, handler)
    return signal
''',
}


def isolated(name, trusted, **names):
    """ISOLATED[name] run in a namespace of its own; its code objects join trusted (the
    harness's own code, which the audit hook lets through)."""
    ns = dict(names, __builtins__=builtins, __name__="pass_rate_sandbox")
    code = compile(ISOLATED[name], "<pass_rate %s>" % name, "exec")
    trusted.update(code_objects(code, set()))
    exec(code, ns)
    return ns


def main():
    semantics = sys.argv[3] if len(sys.argv) > 3 else "bigcodebench"
    disabled = set(filter(None, (sys.argv[4] if len(sys.argv) > 4 else "").split(",")))
    on = {d: d not in disabled for d in DEFENSES}
    report = make_reporter(dumpable=not on["dumpable"])
    exit_now = os._exit
    solution_path, tests_path = sys.argv[1], sys.argv[2]
    with open(solution_path, encoding="utf-8") as f:
        code = f.read()
    with open(tests_path, encoding="utf-8") as f:
        tests = f.read()
    kinds = {"tamper": [], "env": set()}

    def finish(verdict, ran, expected, ok, kind, why=None):
        if why:
            say(why)
        counts = "ran=%d expected=%d ok=%d kind=%s" % (ran, expected, ok, kind)
        if kind == "env" and kinds["env"]:
            counts += " missing=" + ",".join(sorted(kinds["env"]))
        report(verdict, counts)

    def tamper(why):
        kinds["tamper"].append(why)

    # --- the program, as BigCodeBench builds it: code + "\n" + tests, compiled as
    # __test__.py; its top-level statements split at the solution's last line so that
    # the machinery can be checked between the two (the same statements, the same order)
    n_code = (code + "\n").count("\n")
    full = code + "\n" + tests
    try:
        tree = ast.parse(full, "__test__.py")
    except SyntaxError as e:
        finish("FAIL", 0, 0, 0, "wrong", "the program does not parse: %s" % e)
    try:
        tests_tree = ast.parse(tests, "tests.py")
    except SyntaxError:
        tests_tree = ast.Module(body=[], type_ignores=[])
    sol_body = [s for s in tree.body if s.lineno <= n_code]
    test_body = [s for s in tree.body if s.lineno > n_code]
    if sol_body and sol_body[-1].end_lineno > n_code:
        finish("FAIL", 0, 0, 0, "tamper", "the solution's last statement swallows the tests")
    sol_tree = ast.Module(body=sol_body, type_ignores=[])
    flags = 0
    for s in sol_body:
        if isinstance(s, ast.ImportFrom) and s.module == "__future__":
            for a in s.names:
                feature = getattr(__import__("__future__"), a.name, None)
                flags |= getattr(feature, "compiler_flag", 0)
    sol_code = compile(sol_tree, "__test__.py", "exec", dont_inherit=True)
    test_code = compile(ast.Module(body=test_body, type_ignores=[]), "__test__.py", "exec", flags=flags,
                        dont_inherit=True)
    test_codes = code_objects(test_code, set())
    sol_codes = code_objects(sol_code, set())
    declared = expected_tests(tests_tree)
    n_declared = sum(len(v) for k, v in declared.items() if "TestCases" not in declared or k == "TestCases")

    if on["screen"]:
        why = screen(sol_tree)
        if why:
            finish("FAIL", 0, n_declared, 0, "tamper", "the solution " + why)

    # --- what the tests import is imported before the code runs (so the code cannot plant
    # its own numpy) and must stay the same object; a module missing is an environment error
    # (an import the source makes unconditionally at its top level: one inside a try or a
    # function may be allowed to fail, and then fails, if at all, where the tests say)
    test_roots = sorted(imported_roots(tests_tree))
    required = imported_roots(ast.Module(body=[n for n in tests_tree.body if isinstance(n, (ast.Import, ast.ImportFrom))],
                                         type_ignores=[]))
    for root in test_roots:
        try:
            __import__(root)
        except ImportError as e:
            if root in required:
                kinds["env"].add(getattr(e, "name", None) or root)
        except BaseException:
            pass
        for sub in HELPERS.get(root, ()):
            try:
                __import__(sub)
            except BaseException:
                pass
    if kinds["env"]:
        finish("FAIL", 0, n_declared, 0, "env", "modules the tests import are missing: " + ",".join(sorted(kinds["env"])))
    imported = {r: sys.modules[r] for r in test_roots if r in sys.modules}
    path_before = (list(sys.path), list(sys.meta_path), list(sys.path_hooks))

    helper_mods = [m for r in test_roots for m in HELPERS.get(r, ())]
    helper_classes = [getattr(sys.modules[r], c, None) for r in test_roots for c in HELPER_CLASSES.get(r, ())
                      if r in sys.modules]
    mock_classes = [getattr(unittest.mock, c, None) for c in MOCK_CLASSES]
    machinery_mods = module_state(MACHINERY)
    machinery_classes = class_state([v for _, m, attrs in machinery_mods for v in attrs.values()
                                     if isinstance(v, type) and getattr(v, "__module__", "") == m.__name__])
    # its functions and classes (mock_open rebinds data globals such as file_spec as it works)
    mock_attrs = {k: v for k, v in vars(unittest.mock).items()
                  if (not k.startswith("_") or k in MOCK_CLASSES) and isinstance(v, (type, types.FunctionType))}
    mock_state = class_state(mock_classes)

    # BigCodeBench's reliability_guard: builtins.exit and quit are None
    if semantics == "bigcodebench" and "exitnone" not in disabled:
        builtins.exit = None
        builtins.quit = None

    def watched_state():
        return (module_state(helper_mods), class_state(helper_classes), dict(vars(builtins)))

    helpers_first = watched_state()

    def machinery_changed():
        if not on["machinery"]:
            return None
        return (module_changes(machinery_mods) or class_changes(machinery_classes) or class_changes(mock_state)
                or dict_changes("unittest.mock", mock_attrs, vars(unittest.mock)))

    def imports_changed():
        if not on["imports"]:
            return None
        # libraries add finders as they import (six's); anything else is the code's own
        for p in sys.path:
            if p not in path_before[0] and not (isinstance(p, str) and p.startswith(LIB_PREFIXES)):
                return "sys.path gained %r" % (p,)
        for i, hooks in ((1, sys.meta_path), (2, sys.path_hooks)):
            for h in hooks:
                if h not in path_before[i] and not from_library(h):
                    return "an import hook of the code's own was added: %r" % (h,)
        for r, m in imported.items():
            if sys.modules.get(r) is not m:
                return "sys.modules[%r] was replaced" % r
        return None

    def from_library(obj):
        owner = obj if isinstance(obj, (type, types.FunctionType)) else type(obj)
        mod = sys.modules.get(getattr(owner, "__module__", None) or "")
        f = getattr(mod, "__file__", None) or ""
        return f.startswith(LIB_PREFIXES) or (mod is not None and not f and getattr(mod, "__spec__", None) is not None
                                              and getattr(mod.__spec__, "origin", "") in ("frozen", "built-in"))

    def everything_changed(state):
        mods, classes, bi = state
        if not on["machinery"]:
            return imports_changed()
        return (machinery_changed() or module_changes(mods) or class_changes(classes)
                or dict_changes("builtins", bi, vars(builtins)) or imports_changed())

    # --- the audit hook: refuses introspection from code that is neither the tests', this
    # harness's nor the system's libraries (read-only in the sandbox); installed last
    mine = harness_codes()
    TestCase, TestSuite, TestLoader, TestResult = (unittest.TestCase, unittest.TestSuite,
                                                   unittest.TestLoader, unittest.TestResult)
    SkipTest, ShouldStop = unittest.SkipTest, unittest.case._ShouldStop
    skip_code = TestCase.skipTest.__code__
    unittest_files = {os.path.dirname(unittest.__file__) + "/"}
    frame_givers = set()
    # library functions that hand their caller a frame: the caller is who asked for it
    import logging
    import asyncio.base_tasks
    import bdb
    for fn in (inspect.currentframe, inspect.stack, inspect.trace, inspect.getouterframes, inspect.getinnerframes,
               traceback.walk_stack, traceback.walk_tb, logging.currentframe, asyncio.base_tasks._task_get_stack,
               bdb.Bdb.get_stack):   # get_stack(None, tb): the traceback's frames in a list
        frame_givers.add(fn.__code__)
    test_funcs = {}   # id -> function, filled once the tests have run
    getframe, isinstance_, id_ = sys._getframe, isinstance, id
    state = {"armed": False}
    busy = set()
    from _thread import get_ident
    realpath, startswith = os.path.realpath, str.startswith

    def untrusted(c):
        return c not in test_codes and c not in mine and not startswith(c.co_filename, LIB_PREFIXES)

    # a library function that returns the frame it asked for hands it to its caller, listed
    # above or not: the instruction after the call (f_lasti) returns it, at once or from the
    # local it was stored in. Read from the deoptimised bytecode, once per call site.
    RETURN_VALUE, STORE_FAST, LOAD_FAST, CACHE = (opcode.opmap[n] for n in
                                                  ("RETURN_VALUE", "STORE_FAST", "LOAD_FAST", "CACHE"))
    returns_it = {}

    def hands_out(f):
        key = (f.f_code, f.f_lasti)
        known = returns_it.get(key)
        if known is None:
            b = f.f_code.co_code
            i = f.f_lasti + 2
            while i < len(b) and b[i] == CACHE:
                i += 2
            known = False
            if i < len(b) and b[i] == RETURN_VALUE:
                known = True
            elif i < len(b) and b[i] == STORE_FAST:
                slot = b[i + 1]
                known = any(b[j] == LOAD_FAST and b[j + 1] == slot and b[j + 2] == RETURN_VALUE
                            for j in range(0, len(b) - 2, 2))
            returns_it[key] = known
        return known

    def caller_untrusted(f):
        while f is not None and (f.f_code in frame_givers or (on["givers"] and hands_out(f))):
            f = f.f_back
        return f is not None and untrusted(f.f_code)

    def reaches_below_solution(f, target):
        """A library's sys._getframe(n) whose frame lies below a frame of the solution's:
        the frame's locals are the tests' or the harness's (ply.lex.get_caller_module_dict,
        pandas.eval(level=n) hand them back). Honest uses (typing's and namedtuple's module
        name, pandas' query scope) read their caller's frame, the solution's at most."""
        while f is not None and f is not target:
            if untrusted(f.f_code):
                return True
            f = f.f_back
        return False

    def untrusted_on_stack(f):
        while f is not None:
            if untrusted(f.f_code):
                return True
            f = f.f_back
        return False

    FRAME_ATTRS = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame"))
    # refused with the solution anywhere on the stack: no library calls these for honest code
    STACK_EVENTS = frozenset(("sys.settrace", "sys.setprofile", "sys._current_frames", "sys._current_exceptions",
                              "sys.addaudithook"))
    # refused when the solution calls them itself: libraries do (threadpoolctl's ctypes, a
    # library's gc walk), and what they return is theirs
    CALLER_EVENTS = frozenset(("gc.get_objects", "gc.get_referrers", "gc.get_referents", "ctypes.cdata",
                               "ctypes.string_at", "ctypes.wstring_at", "ctypes.PyObj_FromPtr", "ctypes.call_function",
                               "ctypes.dlsym", "code.__new__"))

    def refuse(what):
        tamper("the solution's code tried " + what)
        raise RuntimeError("pass_rate sandbox: %s is not allowed" % what)

    def hook(event, args):
        # busy per thread: the hook's own calls raise events, and a thread the code keeps
        # busy in the hook must not open a gap for another
        tid = get_ident()
        if not state["armed"] or tid in busy:
            return
        busy.add(tid)
        try:
            if event == "sys._getframe" or (event == "object.__getattr__" and args[1] in FRAME_ATTRS):
                if caller_untrusted(getframe(1)):
                    refuse(event if event == "sys._getframe" else "frame access (%s)" % args[1])
                if event == "sys._getframe" and on["depth"] and reaches_below_solution(getframe(1), args[0]):
                    refuse("a library's sys._getframe below the solution's frames (%s)" % getframe(1).f_code.co_name)
            elif event in ("object.__getattr__", "object.__setattr__", "object.__delattr__"):
                obj, name = args[0], args[1]
                if id_(obj) in test_funcs and name.startswith("__"):
                    if event != "object.__getattr__" or untrusted_on_stack(getframe(1)):
                        refuse("%s of a test function's %s" % (event.split(".")[1], name))
            elif event in STACK_EVENTS:
                if untrusted_on_stack(getframe(1)):
                    refuse(event)
            elif event in CALLER_EVENTS:
                if caller_untrusted(getframe(1)):
                    refuse(event)
            elif event == "import" and args[0] in ("_signal", "signal") and on["signals"]:
                if untrusted_on_stack(getframe(1)):
                    refuse("importing %s afresh" % args[0])
            elif event == "compile":
                filename = args[1]
                if isinstance_(filename, str) and (startswith(filename, LIB_PREFIXES) or filename.startswith("/task")):
                    src = args[0]
                    try:
                        with open(filename, "rb") as fh:
                            same = isinstance_(src, bytes) and fh.read() == src
                    except OSError:
                        same = False
                    if not same:
                        refuse("compiling code as %s" % filename)
            elif event == "open":
                path = args[0]
                if isinstance_(path, (str, bytes)):
                    p = realpath(os.fsdecode(path))
                    if ("/fd/3" in os.fsdecode(path) or p.startswith("/task") or (p.startswith("/proc/") and (
                            p.endswith("/mem") or "/fd/3" in p))) and untrusted_on_stack(getframe(1)):
                        if caller_untrusted(getframe(1)):
                            refuse("opening %s" % p)
                        # a library's open on the solution's behalf: linecache showing the
                        # harness's or the tests' lines in a traceback the code prints is
                        # honest; the library sees an unreadable file and carries on
                        raise PermissionError(13, "pass_rate sandbox: not readable", p)
        finally:
            busy.discard(tid)

    if on["audit"]:
        sys.addaudithook(hook)

    # a signal handler gets the frame it interrupted (no audit event marks it): the code's
    # own handlers get None instead; _signal may not be imported afresh (see the hook)
    if on["signals"]:
        import _signal
        import signal as signal_module
        guarded_signal = isolated("signal", mine)["make"](_signal.signal, LIB_PREFIXES)
        _signal.signal = signal_module.signal = guarded_signal
        test_funcs[id(guarded_signal)] = guarded_signal   # its dunders guarded as the tests' functions are

    module = types.ModuleType("__test__")
    module.__dict__.update({"__builtins__": builtins, "__file__": "__test__.py", "__package__": None,
                            "__doc__": None})
    if "prebind" not in disabled:   # as BigCodeBench's unsafe_execute pre-binds them
        module.__dict__.update({"sys": sys, "os": os, "environ": os.environ})
    ns = module.__dict__
    sys.modules["__test__"] = module
    if on["isolation"]:
        sys.modules["__main__"] = module   # not this file: its globals stay out of reach
    BoundedOut = isolated("out", mine, os_write=os.write)["BoundedOut"]
    sys.stdout, sys.stderr = BoundedOut(1), BoundedOut(2)

    def error_kind(e):
        if isinstance(e, ImportError):   # ModuleNotFoundError included
            kinds["env"].add(getattr(e, "name", None) or str(e))
            return "env"
        return "wrong"

    def verdict_of_tamper(ran, ok):
        why = kinds["tamper"][0]
        finish("FAIL", ran, n_declared, ok, "tamper", "tampering: " + why)

    state["armed"] = True
    try:
        exec(sol_code, ns)
    except BaseException as e:   # SystemExit at import included: the tests never ran
        if kinds["tamper"]:
            verdict_of_tamper(0, 0)
        finish("FAIL", 0, n_declared, 0, error_kind(e), "the solution raised %s: %s" % (type(e).__name__, e))
    why = everything_changed(helpers_first)
    if why:
        tamper("the solution changed the test machinery: " + why)
    if on["eq"]:
        for v in list(ns.values()):
            if isinstance(v, type) and v.__module__ == "__test__" and "__eq__" in vars(v):
                try:
                    if object.__new__(v) == object():
                        tamper("%s compares equal to anything" % v.__name__)
                except BaseException:
                    pass
    if kinds["tamper"]:
        verdict_of_tamper(0, 0)
    try:
        exec(test_code, ns)
    except BaseException as e:
        if kinds["tamper"]:
            verdict_of_tamper(0, 0)
        finish("FAIL", 0, n_declared, 0, error_kind(e), "the test source raised %s: %s" % (type(e).__name__, e))
    why = everything_changed(helpers_first)
    if why:
        tamper("the test machinery was changed: " + why)
    if kinds["tamper"]:
        verdict_of_tamper(0, 0)

    # --- the tests: the real classes the source made (TestCases alone, as BigCodeBench)
    binds_testcases = any(isinstance(n, ast.ClassDef) and n.name == "TestCases" or
                          isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TestCases"
                                                            for t in n.targets)
                          for n in tests_tree.body)

    def made_by_tests(cls):
        """The class the test source bound (a solution's own TestCases is never run), with
        no function of the solution's in it."""
        if cls.__name__ == "TestCases" and ns.get("TestCases") is cls and not binds_testcases:
            return False
        return not any(isinstance(f, types.FunctionType) and f.__code__ in sol_codes for f in vars(cls).values())

    found = [v for k, v in ns.items() if isinstance(v, type) and issubclass(v, TestCase) and v.__module__ == "__test__"]
    if semantics == "bigcodebench" or "TestCases" in ns:
        cls = ns.get("TestCases")
        if not (isinstance(cls, type) and issubclass(cls, TestCase)):
            finish("FAIL", 0, n_declared, 0, "wrong", "the tests define no unittest.TestCase class TestCases")
        classes = [cls]
    else:
        classes = found
    for cls in classes:
        if on["testfuncs"] and not made_by_tests(cls):
            tamper("%s was not made by the test source" % cls.__name__)
    if kinds["tamper"]:
        verdict_of_tamper(0, 0)
    if not classes and semantics == "strict":
        # strict, no TestCase at all: the source is one test that passed by running to its end
        why = everything_changed(helpers_first)
        if why or kinds["tamper"]:
            finish("FAIL", 1, 1, 0, "tamper", "tampering: " + (why or kinds["tamper"][0]))
        finish("PASS", 1, 1, 1, "pass")

    loader = TestLoader()
    cases, names = [], {}
    for cls in classes:
        wanted = list(loader.getTestCaseNames(cls))
        missing = declared.get(cls.__name__, set()) - set(wanted)
        if missing and on["testfuncs"]:
            tamper("tests disappeared: %s" % ",".join(sorted(missing)))
        for m in wanted:
            case = cls(m)
            names[id(case)] = "%s.%s" % (cls.__name__, m)
            cases.append(case)
    if kinds["tamper"]:
        verdict_of_tamper(0, 0)

    # every function of the test classes (and what it wraps): their code must not change
    funcs = []
    for cls in classes:
        for c in cls.__mro__:
            if c.__module__ == "__test__":
                for v in vars(c).values():
                    v = getattr(v, "__func__", v)
                    while v is not None:
                        if isinstance(v, types.FunctionType):
                            funcs.append(v)
                        v = getattr(v, "__wrapped__", None) if not isinstance(v, type) else None
    if on["testfuncs"]:
        for f in funcs:
            test_funcs[id(f)] = f
    codes_before = [(f, f.__code__, f.__defaults__, f.__kwdefaults__, dict(f.__dict__)) for f in funcs]

    def tests_changed():
        if not on["testfuncs"]:
            return None
        for f, c, d, kd, fd in codes_before:
            if f.__code__ is not c or f.__defaults__ is not d or f.__kwdefaults__ is not kd:
                return "%s's code was replaced" % f.__qualname__
            now = f.__dict__   # by identity: an __eq__ of the code's must not decide
            if now.keys() != fd.keys() or any(now[k] is not v for k, v in fd.items()):
                return "%s's attributes were changed" % f.__qualname__
        return class_changes(class_dicts, code_only=True)

    # --- per test: a wrapper on the instance (the class stays as it is) runs the real body
    # and sets the test's token after it returns; skips, stops and interrupts are traced
    # back to where they were raised
    done = set()
    declared_skip = set()
    forged = []

    def from_solution(tb):
        """Whether code that is neither the tests' nor the libraries' is on the way from the
        test to where the exception was raised."""
        while tb is not None:
            if untrusted(tb.tb_frame.f_code):
                return True
            tb = tb.tb_next
        return False

    def check(e, key):
        if isinstance(e, (SkipTest, ShouldStop, KeyboardInterrupt)) and on["skip"] and from_solution(e.__traceback__):
            forged.append("%s: %s raised from the solution's code" % (key, type(e).__name__))
        elif isinstance(e, SkipTest):
            declared_skip.add(key)

    def wrapped(original, key, token):
        if inspect.iscoroutinefunction(original):
            async def body(*a, **k):
                try:
                    r = await original(*a, **k)
                except BaseException as e:
                    check(e, key)
                    raise
                if token:
                    done.add(key)
                return r
        else:
            def body(*a, **k):
                try:
                    r = original(*a, **k)
                except BaseException as e:
                    check(e, key)
                    raise
                if token:
                    done.add(key)
                return r
        for attr in ("__unittest_skip__", "__unittest_skip_why__", "__unittest_expecting_failure__"):
            if hasattr(original, attr):
                setattr(body, attr, getattr(original, attr))
        return body

    def wrap(case, name):
        original = getattr(case, case._testMethodName)
        if getattr(original, "__unittest_skip__", False) or getattr(case, "__unittest_skip__", False):
            declared_skip.add(name)
        object.__setattr__(case, case._testMethodName, wrapped(original, name, True))
        for part in ("setUp", "tearDown", "asyncSetUp", "asyncTearDown"):
            if hasattr(case, part):
                object.__setattr__(case, part, wrapped(getattr(case, part), name, False))

    class_raised = {}   # class name -> what its setUpClass raised
    make_setup = isolated("setupclass", mine)["make"]
    for cls in classes:
        if "setUpClass" in vars(cls) and isinstance(vars(cls)["setUpClass"], classmethod):
            class_raised[cls.__name__] = []
            cls.setUpClass = make_setup(cls.setUpClass, class_raised[cls.__name__])
    class_dicts = [(c, dict(vars(c))) for cls in classes for c in cls.__mro__ if c.__module__ == "__test__"]

    for case in cases:
        wrap(case, names[id(case)])

    outcome = {}   # test -> "ok" | "fail" | "skip" | "xfail" | "xpass"
    problems, changed = [], []

    def key(test):
        return names.get(id(test))

    def mark(test, what, err=None):
        record(test, what, err)

    def record(test, what, err=None):
        k = key(test) or "<%s>" % type(test).__name__
        if what in ("fail", "error") or outcome.get(k) not in ("fail", "error"):
            outcome[k] = what
        if err is not None:
            try:
                if issubclass(err[0], ImportError):
                    kinds["env"].add(getattr(err[1], "name", None) or str(err[1]))
                detail = "".join(traceback.format_exception(*err))[-1500:]
            except Exception:
                detail = ""
            problems.append("%s %s: %s" % (k, what, detail))

    # the result: a plain TestResult whose methods are set on the instance (a subclass would
    # be found by TestResult.__subclasses__(), and its methods' closures with it)
    result = TestResult()
    before = {}

    def startTest(test):
        TestResult.startTest(result, test)
        before["state"] = watched_state()

    def stopTest(test):
        why = everything_changed(before["state"]) or tests_changed()
        if why:
            changed.append("%s: %s" % (key(test), why))
        TestResult.stopTest(result, test)

    def addSuccess(test):
        k = key(test)
        if k not in done and on["token"]:
            forged.append("%s reported success but its body never returned" % k)
        if k not in outcome:
            outcome[k] = "ok"

    def addSkip(test, reason):
        k = key(test)
        if k is None:   # setUpClass's skip: "setUpClass (__test__.TestCases)"
            k = next((c.__name__ for c in classes if ("." + c.__name__ + ")") in str(test)), None)
            for e in class_raised.get(k, [])[-1:]:
                check(e, k)
        if k not in declared_skip and on["skip"]:
            forged.append("%s skipped from outside the test's code (%s)" % (k, reason))
        mark(test, "skip")

    def addSubTest(test, subtest, err):
        if err is not None:
            mark(test, "fail" if issubclass(err[0], test.failureException) else "error", err)

    result.startTest, result.stopTest, result.addSuccess, result.addSkip, result.addSubTest = (
        startTest, stopTest, addSuccess, addSkip, addSubTest)
    result.addExpectedFailure = lambda test, err: mark(test, "xfail")
    result.addFailure = lambda test, err: mark(test, "fail", err)
    result.addError = lambda test, err: mark(test, "error", err)
    result.addUnexpectedSuccess = lambda test: mark(test, "xpass")
    try:
        TestSuite(cases).run(result)
    except BaseException as e:   # an interrupt out of the run: BigCodeBench fails it too
        forged.append("the test run raised %s" % type(e).__name__)
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    why = everything_changed(helpers_first) or tests_changed()
    if why:
        changed.append("after the tests: " + why)
    for p in problems[:20]:
        say(p)
    ran = len(outcome)
    good = {"ok", "xfail"} if semantics == "strict" else {"ok", "xfail", "skip", "xpass"}
    passed = [k for k in names.values() if outcome.get(k) in good and (k in done or outcome[k] != "ok" or not on["token"])]
    for t in kinds["tamper"] + forged + changed:
        tamper(t) if t not in kinds["tamper"] else None
    if kinds["tamper"]:
        verdict_of_tamper(ran, len(passed))
    bad = [k for k, v in outcome.items() if v in ("fail", "error")]   # setUpClass's errors included
    if bad and kinds["env"]:
        finish("FAIL", ran, len(names), len(passed), "env", "modules missing at run time: " + ",".join(sorted(kinds["env"])))
    ok = not bad and len(passed) == len(names)
    if semantics == "strict":
        ok = ok and all(len(declared.get(c.__name__, ())) <= len([n for n in names.values()
                                                                   if n.startswith(c.__name__ + ".")]) for c in classes)
    finish("PASS" if ok else "FAIL", ran, len(names), len(passed), "pass" if ok else "wrong")
    exit_now(0)


if __name__ == "__main__":
    main()
