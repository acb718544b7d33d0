"""A re-implementation of BigCodeBench 0.2.5's verdict rule (bigcodebench/eval/__init__.py
untrusted_check / unsafe_execute, utils.py reliability_guard / swallow_io / time_limit),
written from their documented behaviour, to check that pass_rate's semantics=bigcodebench
agrees with it (tests/lua/test_pass_rate_bigcodebench.lua). No sandbox: run it only on
honest programs.

    python3 bigcodebench_untrusted_check.py CODE.py TESTS.py [TIMEOUT]   -> prints pass|fail

TIMEOUT is the limit untrusted_check hands unsafe_execute (default 241 = max(240, 60) + 1).
"""
import contextlib
import faulthandler
import io
import multiprocessing
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import types
import unittest

PASS, FAIL, TIMEOUT = "pass", "fail", "timeout"
_SUCCESS, _FAILED, _UNKNOWN = 0, 1, 2


class TimeoutException(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds):
    def handler(signum, frame):
        raise TimeoutException("Timed out!")
    signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.signal(signal.SIGALRM, handler)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


class WriteOnlyStringIO(io.StringIO):
    """stdin that cannot be read, as swallow_io's."""
    def read(self, *a, **k):
        raise IOError

    def readline(self, *a, **k):
        raise IOError

    def readlines(self, *a, **k):
        raise IOError

    def readable(self, *a, **k):
        return False


class redirect_stdin(contextlib._RedirectStream):
    _stream = "stdin"


@contextlib.contextmanager
def swallow_io():
    stream = WriteOnlyStringIO()
    with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream), redirect_stdin(stream):
        yield


def reliability_guard(max_as_limit=30 * 1024, max_data_limit=30 * 1024, max_stack_limit=10):
    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (max_as_limit * mb, max_as_limit * mb))
    resource.setrlimit(resource.RLIMIT_DATA, (max_data_limit * mb, max_data_limit * mb))
    resource.setrlimit(resource.RLIMIT_STACK, (max_stack_limit * mb, max_stack_limit * mb))
    faulthandler.disable()
    import builtins
    builtins.exit = None
    builtins.quit = None
    try:
        import matplotlib.pyplot as plt
        plt.close("all")
    except ImportError:
        pass


def unsafe_execute(code, test_code, timeout, stat, details):
    with tempfile.TemporaryDirectory() as d:
        os.chdir(d)
        import builtins
        reliability_guard()
        module_name = "__test__"
        new_module = types.ModuleType(module_name)
        new_module.__dict__.update({"__builtins__": builtins, "__file__": f"{module_name}.py",
                                    "__package__": None, "__doc__": None, "sys": sys, "os": os,
                                    "environ": os.environ})
        try:
            full_code = code + "\n" + test_code
            with swallow_io():
                exec(compile(full_code, f"{module_name}.py", "exec"), new_module.__dict__)
                sys.modules[module_name] = new_module
                TestCases = getattr(new_module, "TestCases")
                loader = unittest.TestLoader()
                suite = loader.loadTestsFromTestCase(TestCases)
                test_result = unittest.TestResult()
                with time_limit(timeout):
                    suite.run(test_result)
            issues = test_result.failures + test_result.errors
            for test, trace in issues:
                details[test.id().split(".")[-1]] = trace
            stat.value = _SUCCESS
        except BaseException as e:
            details["ALL"] = str(e)
            stat.value = _FAILED


def untrusted_check(code, test_code, timeout):
    manager = multiprocessing.Manager()
    details = manager.dict()
    stat = multiprocessing.Value("i", _UNKNOWN)
    p = multiprocessing.Process(target=unsafe_execute, args=(code, test_code, timeout, stat, details))
    p.start()
    p.join(timeout=timeout + 1)
    if p.is_alive():
        p.terminate()
        time.sleep(0.1)
    if p.is_alive():
        p.kill()
        time.sleep(0.1)
    s = {_SUCCESS: PASS, _FAILED: FAIL, _UNKNOWN: None}[stat.value]
    details = dict(details)
    manager.shutdown()
    if not s:
        s = TIMEOUT
    if s == PASS and details:
        s = FAIL
    return s, details


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        code = f.read()
    with open(sys.argv[2]) as f:
        tests = f.read()
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 241.0
    s, _ = untrusted_check(code, tests, timeout)
    print("pass" if s == PASS else "fail")
