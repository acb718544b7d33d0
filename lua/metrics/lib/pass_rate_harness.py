"""pass_rate's harness: runs the policy's code and the task's tests inside the sandbox and
reports the verdict of the test framework itself (metrics/pass_rate.lua).

    python3 -I pass_rate_harness.py SOLUTION.py TESTS.py    (fd 0: the nonce, fd 3: the report)

Before any untrusted line runs, it reads the run's nonce from descriptor 0 (then closes
it), counts the tests the test source defines (from its syntax tree, so the code cannot
remove tests), keeps its own references to unittest's suite, loader and result classes
and to the os functions it reports with, and takes a snapshot of the attributes of
unittest's modules and classes, of builtins and of numpy's and pandas' testing modules.

The code and then the tests run in one namespace (module __test__, as BigCodeBench's
evaluation names it, so `if __name__ == "__main__": unittest.main()` stays off). Every test
runs under a result object of this file that records each outcome itself. The verdict is
PASS when every expected test ran and succeeded (a failure, error, skip, failed subtest,
unexpected success or missing test is a FAIL) and no snapshot changed; without TestCase
classes, the test source is one test that passes when it runs to its end. The verdict goes
to descriptor 3 as one line `CLRT-PASS-RATE <nonce> <verdict> <counts>`, written only by
this process (a forked child never reports), after which the process ends at once
(os._exit: no atexit handler, no late thread, no __del__ runs). The trainer accepts the
report only when descriptor 3 holds exactly that one line with its nonce.

docs/sandbox.md lists what this resists and what it cannot: in-process Python can always
reach this file's own objects (frames, gc, ctypes), so the harness raises the cost of a
forged pass; it does not make one impossible.
"""
import ast
import builtins
import os
import sys
import types
import unittest

REPORT_FD = 3
MACHINERY = ("unittest", "unittest.case", "unittest.result", "unittest.suite", "unittest.loader",
             "unittest.runner", "unittest.main", "unittest.util", "unittest.signals", "unittest.async_case")
ASSERTION_MODULES = {"numpy": ("numpy.testing",), "pandas": ("pandas.testing",)}


def make_reporter():
    """The one function that can write a report; the nonce lives only in its closure."""
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
    streams = [(type(s).flush, s) for s in (sys.stdout, sys.stderr) if s is not None]

    def report(verdict, counts):
        for flush, stream in streams:   # the program's own output, for the log
            try:
                flush(stream)
            except BaseException:
                pass
        if getpid() == me:
            line = b"CLRT-PASS-RATE " + nonce + b" " + verdict.encode() + b" " + counts.encode() + b"\n"
            try:
                write(REPORT_FD, line)
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


def dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return base + "." + node.attr if base else node.attr
    return ""


def expected_tests(tree):
    """{class name: [test method names]} from the test source's top-level classes: those
    deriving (within the file or directly) from a *TestCase class; only TestCases when the
    source defines it, as BigCodeBench runs that class alone."""
    classes = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            methods = [n.name for n in node.body
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")]
            classes[node.name] = ([dotted(b) for b in node.bases], methods)

    def is_test(name, depth=0):
        if depth > 50:
            return False
        for base in classes[name][0]:
            if base.split(".")[-1].endswith("TestCase"):
                return True
            if base in classes and base != name and is_test(base, depth + 1):
                return True
        return False

    def tests_of(name, depth=0):
        out = set(classes[name][1])
        if depth < 50:
            for base in classes[name][0]:
                if base in classes and base != name:
                    out |= tests_of(base, depth + 1)
        return out

    found = {name: sorted(tests_of(name)) for name in classes if is_test(name)}
    if "TestCases" in found:
        return {"TestCases": found["TestCases"]}
    return found


def imported_roots(tree):
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def module_state(names, packages=()):
    """(module name, module object, its attributes) for the loaded modules among names and
    the packages with their submodules (unittest.mock, whose globals change as it is used,
    is not among them)."""
    out = []
    for name, mod in list(sys.modules.items()):
        if isinstance(mod, types.ModuleType) and (
                name in names or any(name == n or name.startswith(n + ".") for n in packages)):
            out.append((name, mod, dict(vars(mod))))
    return out


def class_state(modules):
    """The attribute dicts of the classes these modules define."""
    out = []
    for name, mod, attrs in modules:
        for value in attrs.values():
            if isinstance(value, type) and getattr(value, "__module__", "") == name:
                out.append((value, dict(vars(value))))
    return out


def module_changes(state):
    """Rebound or removed attributes, and new ones shadowing a builtin (a new global a
    module's functions would find before the builtin); lazily added submodules are fine."""
    for name, mod, attrs in state:
        if sys.modules.get(name) is not mod:
            return "sys.modules[%r] was replaced" % name
        now = vars(mod)
        for k, v in attrs.items():
            if k not in now or now[k] is not v:
                return "%s.%s was changed" % (name, k)
        for k in now:
            if k not in attrs and k in BUILTIN_NAMES:
                return "%s.%s shadows a builtin" % (name, k)
    return None


def class_changes(state):
    for cls, attrs in state:
        now = vars(cls)
        if now.keys() != attrs.keys():
            return "%s gained or lost attributes" % cls.__qualname__
        for k, v in attrs.items():
            if now[k] is not v:
                return "%s.%s was changed" % (cls.__qualname__, k)
    return None


def builtin_changes(attrs):
    now = vars(builtins)
    for k, v in attrs.items():
        if k not in now or now[k] is not v:
            return "builtins.%s was changed" % k
    return None


BUILTIN_NAMES = frozenset(vars(builtins))


def main():
    report = make_reporter()
    exit_now = os._exit
    solution_path, tests_path = sys.argv[1], sys.argv[2]
    with open(solution_path, encoding="utf-8") as f:
        code = f.read()
    with open(tests_path, encoding="utf-8") as f:
        tests = f.read()
    try:
        tree = ast.parse(tests, tests_path)
    except SyntaxError as e:
        say("the test source does not parse: %s" % e)
        report("ERROR", "tests-unparsable")
    expected = expected_tests(tree)
    n_expected = sum(len(v) for v in expected.values()) if expected else 1

    # The verdict's machinery, bound before the code can touch it.
    TestCase, TestSuite, TestLoader, TestResult = (unittest.TestCase, unittest.TestSuite,
                                                   unittest.TestLoader, unittest.TestResult)
    for root, mods in ASSERTION_MODULES.items():
        if root in imported_roots(tree):
            for m in mods:
                try:
                    __import__(m)
                except Exception:
                    pass
    assertion_packages = [m for mods in ASSERTION_MODULES.values() for m in mods]

    def watched():
        return module_state(MACHINERY, assertion_packages)

    modules = watched()
    machinery_modules = module_state(MACHINERY)
    machinery_classes = class_state(machinery_modules)
    builtins_before = dict(vars(builtins))

    def machinery_changed():
        """unittest itself: no test has a reason to patch it, so it is checked at any time."""
        return module_changes(machinery_modules) or class_changes(machinery_classes)

    def tampered():
        """Everything watched, against the state before the code ran: true between the code
        and the tests and after the last test (a test's own patches are undone by then)."""
        return machinery_changed() or module_changes(modules) or builtin_changes(builtins_before)

    ns = {"__name__": "__test__", "__file__": "__test__.py", "__builtins__": builtins,
          "__package__": None, "__doc__": None}
    module = types.ModuleType("__test__")
    module.__dict__.update(ns)
    ns = module.__dict__
    sys.modules["__test__"] = module

    def fail(why, counts):
        say(why)
        report("FAIL", counts)

    try:
        exec(compile(code, "solution.py", "exec"), ns)
    except BaseException as e:   # SystemExit at import included: the tests never ran
        fail("the solution raised %s: %s" % (type(e).__name__, e), "ran=0 expected=%d" % n_expected)
    why = tampered()
    if why:
        fail("the solution changed the test machinery: " + why, "ran=0 expected=%d" % n_expected)

    if not expected:
        try:
            exec(compile(tests, "tests.py", "exec"), ns)
        except BaseException as e:
            fail("the tests raised %s: %s" % (type(e).__name__, e), "ran=1 expected=1 ok=0")
        why = tampered()
        if why:
            fail("the test machinery was changed: " + why, "ran=1 expected=1 ok=0")
        report("PASS", "ran=1 expected=1 ok=1")

    try:
        exec(compile(tests, "tests.py", "exec"), ns)
    except BaseException as e:
        fail("the test source raised %s: %s" % (type(e).__name__, e), "ran=0 expected=%d" % n_expected)
    why = tampered()
    if why:
        fail("the test machinery was changed: " + why, "ran=0 expected=%d" % n_expected)

    names, cases = {}, []
    loader = TestLoader()
    for cname, methods in expected.items():
        cls = ns.get(cname)
        if not (isinstance(cls, type) and issubclass(cls, TestCase)):
            fail("%s is not a unittest.TestCase class after the code ran" % cname, "ran=0 expected=%d" % n_expected)
        wanted = list(methods)
        for extra in loader.getTestCaseNames(cls):   # tests made at run time count as well
            if extra not in wanted:
                wanted.append(extra)
        for m in wanted:
            try:
                case = cls(m)
            except BaseException as e:
                fail("test %s.%s is missing (%s)" % (cname, m, e), "ran=0 expected=%d" % n_expected)
            names[id(case)] = "%s.%s" % (cname, m)
            cases.append(case)

    ok, bad, problems, changed = set(), set(), [], []

    def key(test):
        return names.get(id(test))

    def mark_bad(test, what, err=None):
        k = key(test)
        bad.add(k if k else "<%s>" % what)
        detail = ""
        if err is not None:
            try:
                detail = ": " + "".join(__import__("traceback").format_exception(*err))[-1500:]
            except Exception:
                detail = ""
        problems.append("%s %s%s" % (k or test, what, detail))

    def class_dicts(test):
        return [(c, dict(vars(c))) for c in type(test).__mro__ if c not in (object,) and c.__module__ == "__test__"]

    class Recorder(TestResult):
        def startTest(self, test):
            TestResult.startTest(self, test)
            self._before = (class_dicts(test), dict(vars(builtins)), watched())

        def stopTest(self, test):
            classes, bi, mods = self._before
            # builtins and the assertion modules against the test's start: patches a
            # setUpClass made stay out of it, what the test left behind does not
            why = class_changes(classes) or builtin_changes(bi) or module_changes(mods) or machinery_changed()
            if why:
                changed.append("%s: %s" % (key(test), why))
            TestResult.stopTest(self, test)

        def addSuccess(self, test):
            k = key(test)
            if k:
                ok.add(k)

        def addExpectedFailure(self, test, err):
            k = key(test)   # the test source's own decision
            if k:
                ok.add(k)

        def addFailure(self, test, err):
            mark_bad(test, "failed", err)

        def addError(self, test, err):
            mark_bad(test, "raised an error", err)

        def addSkip(self, test, reason):
            mark_bad(test, "was skipped (%s)" % reason)

        def addUnexpectedSuccess(self, test):
            mark_bad(test, "succeeded unexpectedly")

        def addSubTest(self, test, subtest, err):
            if err is not None:
                mark_bad(test, "had a failing subtest", err)

    result = Recorder()
    try:
        TestSuite(cases).run(result)
    except BaseException as e:
        fail("the test run raised %s: %s" % (type(e).__name__, e),
             "ran=%d expected=%d" % (len(ok | bad), n_expected))
    why = tampered()
    if why:
        changed.append(why)
    passed = [n for n in names.values() if n in ok and n not in bad]
    counts = "ran=%d expected=%d ok=%d" % (len(ok | bad), len(names), len(passed))
    for p in problems[:20]:
        say(p)
    for c in changed[:5]:
        say("the test machinery was changed during " + c)
    if changed or bad or len(passed) != len(names) or len(names) < n_expected:
        report("FAIL", counts)
    report("PASS", counts)
    exit_now(0)


if __name__ == "__main__":
    main()
