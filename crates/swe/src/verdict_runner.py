# The in-process unittest runner (see `exec::run_verdict_tests`): the verifier's fallback for
# instances without call specs, used only under `allow_in_process_verdict`. Its verdict is made
# where the policy's code runs, so it can be forged (tests/swe_judge.rs shows routes that do).
#
# Usage: python3 -c <this file> sandboxed|unsandboxed <test id>...
# fd 0: keys from the verifier, one per id, sent only after that id's reporter wrote `done`.
# fd 1: the report channel: JSON lines, each naming its id.
# fd 2: output (the tests' prints and tracebacks); untrusted text.
#
# Three kinds of process, per id:
# - The runner (this process) never imports repository code. It forks one test process per id
#   and waits until it and everything holding the id's `alive` pipe have ended.
# - The test process loads and runs the id. It sends every outcome on the report channel the
#   moment unittest records it (rewriting a result object later changes nothing), and every
#   sign of tampering it finds: builtins, the unittest modules and classes, sys.exit and
#   os._exit, the runner's own functions, the recorder, or a test method defined outside the
#   test files. When the tests are done it forks the reporter and exits at once, which ends
#   every thread the repository's code started.
# - The reporter blocks all signals, clears trace and profile hooks, stops the garbage
#   collector, waits until the test process is gone, and checks that it is the only thread and
#   (in a sandbox, whose pid namespace holds only this run) that no process the tests started
#   is still alive, and the machinery once more. Then it writes `done` with the number of lines
#   sent for the id, reads the key the verifier sends only now, and seals the id's lines with it.
#
# Until `done`, the key exists nowhere in the sandbox: not in a frame, a closure, an object the
# garbage collector holds, /proc/self or a pipe. Code that knows this protocol can still write
# `done` itself and use the key it gets; the README says what else this cannot rule out.


def _verdict_runner():
    import sys

    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    import _json
    import builtins
    import gc
    import os
    import signal
    import time
    import traceback
    import unittest
    import unittest.case
    import unittest.loader
    import unittest.main
    import unittest.result
    import unittest.runner
    import unittest.signals
    import unittest.suite
    import unittest.util

    # Everything used after repository code has run, held here. The C functions among them
    # cannot be changed from Python; the Python ones are checked by `tampering`.
    _exit, _write, _read, _close, _dup, _dup2 = os._exit, os.write, os.read, os.close, os.dup, os.dup2
    _fork, _waitpid, _pipe, _open, _listdir = os.fork, os.waitpid, os.pipe, os.open, os.listdir
    _getpid, _getppid = os.getpid, os.getppid
    _enc = _json.encode_basestring_ascii
    _sigmask, _all_signals = signal.pthread_sigmask, signal.valid_signals
    _settrace, _setprofile, _frames = sys.settrace, sys.setprofile, sys._current_frames
    _gc_disable = gc.disable
    _monitoring = getattr(sys, "monitoring", None)
    _sleep, _monotonic = time.sleep, time.monotonic
    _format_exc = traceback.format_exc
    _TestLoader, _TestSuite, _TestResult = unittest.TestLoader, unittest.TestSuite, unittest.TestResult
    _isinstance, _issubclass, _sorted, _list, _vars = isinstance, issubclass, sorted, list, vars
    _len, _str, _int, _getattr, _hasattr, _callable, _type = len, str, int, getattr, hasattr, callable, type

    sandboxed = sys.argv[1] == "sandboxed"
    ids = sys.argv[2:]
    root = os.getcwd()
    runner_pid = _getpid()
    # The channels leave fds 0 and 1: stdin reads nothing, prints go to the output.
    key_fd, report_fd = _dup(0), _dup(1)
    null = _open(os.devnull, os.O_RDWR)
    _dup2(null, 0)
    _dup2(2, 1)
    _close(null)
    count = [0]

    def write_all(fd, data):
        while data:
            data = data[_write(fd, data):]

    def emit(test_id, body):
        # One report line, made with C functions only.
        write_all(report_fd, ('{"id": ' + _enc(test_id) + ", " + body + "}\n").encode())
        count[0] += 1

    def problem(test_id, text):
        emit(test_id, '"problem": ' + _enc(text))

    def outcome(test_id, test, status):
        emit(test_id, '"test": ' + _enc(test.id()) + ', "status": "' + status + '"')

    def is_test_path(rel):
        parts = rel.split("/")
        name = parts[-1]
        return (
            any(part in ("tests", "test") for part in parts[:-1])
            or (name.startswith("test_") and name.endswith(".py"))
            or name.endswith("_test.py")
            or name == "conftest.py"
        )

    def origin(test):
        # A test method must come from a test file of the repository (`tests/`, `test_*.py`,
        # ..., or the module that defines the test's class) or from outside it (the standard
        # library, installed packages); one defined in the repository's code replaced the test.
        cls = _type(test)
        module = sys.modules.get(_getattr(cls, "__module__", None))
        own = _getattr(module, "__file__", None)
        method = _getattr(cls, _getattr(test, "_testMethodName", "runTest"), None)
        depth = 0
        while _hasattr(method, "__wrapped__") and depth < 100:
            method = method.__wrapped__
            depth += 1
        code = _getattr(method, "__code__", None)
        if code is None:
            return "%s: the test method is not a Python function" % test.id()
        path = code.co_filename
        if path == own:
            return None
        if not path.startswith("/"):
            return "%s: the test method was made at run time (%s)" % (test.id(), path)
        if path.startswith(root + "/") and not is_test_path(path[_len(root) + 1 :]):
            return "%s: the test method is defined in %s, outside the test files" % (
                test.id(),
                path[_len(root) + 1 :],
            )
        return None

    def flatten(suite):
        for item in suite:
            if _isinstance(item, _TestSuite):
                yield from flatten(item)
            else:
                yield item

    def live_processes(allowed):
        found = []
        for name in _listdir("/proc"):
            if not name.isdigit() or _int(name) in allowed:
                continue
            try:
                fd = _open("/proc/%s/stat" % name, os.O_RDONLY)
                try:
                    stat = _read(fd, 1024)
                finally:
                    _close(fd)
            except OSError:
                continue
            state = stat.rsplit(b")", 1)[-1].split()[:1]
            if state and state[0] not in (b"Z", b"X"):
                found.append(name)
        return found

    class Recorder(_TestResult):
        def __init__(self, test_id):
            _TestResult.__init__(self)
            self.test_id = test_id

        def addSuccess(self, test):
            _TestResult.addSuccess(self, test)
            outcome(self.test_id, test, "pass")

        def addFailure(self, test, err):
            _TestResult.addFailure(self, test, err)
            outcome(self.test_id, test, "fail")

        def addError(self, test, err):
            _TestResult.addError(self, test, err)
            outcome(self.test_id, test, "error")

        def addSkip(self, test, reason):
            _TestResult.addSkip(self, test, reason)
            outcome(self.test_id, test, "skipped")

        def addExpectedFailure(self, test, err):
            _TestResult.addExpectedFailure(self, test, err)
            outcome(self.test_id, test, "pass")

        def addUnexpectedSuccess(self, test):
            _TestResult.addUnexpectedSuccess(self, test)
            outcome(self.test_id, test, "fail")

        def addSubTest(self, test, subtest, err):
            _TestResult.addSubTest(self, test, subtest, err)
            if err is not None:
                outcome(self.test_id, test, "fail" if _issubclass(err[0], test.failureException) else "error")

    modules = _sorted(
        ((name, module) for name, module in sys.modules.items() if name == "unittest" or name.startswith("unittest.")),
        key=lambda item: item[0],
    )
    classes = [("runner.Recorder", Recorder)]
    for module_name, module in modules:
        for name, value in _vars(module).items():
            if _isinstance(value, _type) and _str(_getattr(value, "__module__", "")).startswith("unittest"):
                classes.append(("%s.%s" % (module_name, name), value))
    functions = [write_all, emit, problem, outcome, is_test_path, origin, flatten, live_processes]

    def snapshot():
        state = {}
        for name, value in _list(_vars(builtins).items()):
            state["builtins." + name] = value
        for module_name, module in modules:
            state["sys.modules[%s]" % module_name] = sys.modules.get(module_name)
            for name, value in _list(_vars(module).items()):
                state[module_name + "." + name] = value
        for class_name, cls in classes:
            for attr, member in _list(_vars(cls).items()):
                state["%s.%s" % (class_name, attr)] = member
        for function in functions + [snapshot, tampering]:
            name = "runner." + function.__name__
            state[name + ".__code__"] = function.__code__
            state[name + ".__defaults__"] = function.__defaults__
            for i, cell in enumerate(function.__closure__ or ()):
                try:
                    state["%s.__closure__[%d]" % (name, i)] = cell.cell_contents
                except ValueError:
                    pass
        state["sys.exit"] = sys.exit
        state["os._exit"] = os._exit
        return state

    def tampering(when):
        # Changed or removed entries anywhere, and new behaviour on the classes (running a test
        # class sets data on it, `tearDown_exceptions`; a new method or property is tampering).
        # Additions to modules (importing unittest.mock adds `unittest.mock`) and to builtins
        # (gettext's `_`) are ordinary.
        now = snapshot()
        found = []
        for key, value in pristine.items():
            if key not in now:
                found.append("%s: `%s` was removed" % (when, key))
            elif now[key] is not value:
                found.append("%s: `%s` was replaced" % (when, key))
        for key, value in now.items():
            behaves = _callable(value) or _hasattr(_type(value), "__get__")
            if key not in pristine and key.startswith(class_prefixes) and behaves:
                found.append("%s: `%s` was added" % (when, key))
        return found[:20]

    class_prefixes = tuple(name + "." for name, _ in classes)
    pristine = snapshot()

    for test_id in ids:
        alive_r, alive_w = _pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = _fork()
        if pid == 0:
            # The test process.
            _close(alive_r)
            count[0] = 0
            try:
                sys.path.insert(0, root)
                suite = None
                try:
                    suite = _TestLoader().loadTestsFromName(test_id)
                except BaseException:
                    problem(test_id, "the test id could not be loaded")
                    print("ERROR %s\n%s" % (test_id, _format_exc(limit=3)))
                if suite is not None:
                    tests = _list(flatten(suite))
                    emit(test_id, '"loaded": [' + ", ".join([_enc(t.id()) for t in tests]) + "]")
                    for found in tampering("after loading the tests"):
                        problem(test_id, found)
                    for test in tests:
                        found = origin(test)
                        if found:
                            problem(test_id, "after loading the tests: " + found)
                    result = Recorder(test_id)
                    result.buffer = True
                    try:
                        suite.run(result)
                    except BaseException:
                        problem(test_id, "the run raised instead of reporting")
                        print("ERROR %s\n%s" % (test_id, _format_exc(limit=3)))
                    for found in tampering("after running the tests"):
                        problem(test_id, found)
                    for test in tests:
                        found = origin(test)
                        if found:
                            problem(test_id, "after running the tests: " + found)
                    for name, value in _list(_vars(result).items()):
                        # An instance attribute that hides one of the recorder's methods.
                        if _callable(_getattr(_type(result), name, None)):
                            problem(test_id, "the recorder's `%s` was replaced" % name)
                    for kind, items in (("FAIL", result.failures), ("ERROR", result.errors)):
                        for test, tb in items:
                            print("%s %s\n%s" % (kind, test.id(), tb))
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:
                try:
                    problem(test_id, "the runner failed: %s" % _format_exc(limit=2))
                except BaseException:
                    pass
            try:
                parent = _getpid()
                reporter = _fork()
            except BaseException:
                _exit(3)
            if reporter != 0:
                # Leave at once: every thread of the repository's code ends here.
                _exit(0)
            # The reporter.
            try:
                _sigmask(signal.SIG_BLOCK, _all_signals())
                _settrace(None)
                _setprofile(None)
                if _monitoring is not None:
                    for tool in range(6):
                        try:
                            _monitoring.set_events(tool, 0)
                        except BaseException:
                            pass
                _gc_disable()
                deadline = _monotonic() + 5
                while _getppid() == parent and _monotonic() < deadline:
                    _sleep(0.001)
                if _getppid() == parent:
                    problem(test_id, "the test process did not end")
                if _len(_frames()) != 1:
                    problem(test_id, "threads the tests started run on in the reporter")
                if sandboxed:
                    # The test process may still be tearing down (its threads are gone once
                    # this process has a new parent); anything else alive was started by the tests.
                    others = live_processes((1, runner_pid, parent, _getpid()))
                    # The reporter of the previous id may still be tearing down: give processes
                    # that are on their way out half a second to go.
                    waited = _monotonic() + 0.5
                    while others and _monotonic() < waited:
                        _sleep(0.01)
                        others = live_processes((1, runner_pid, parent, _getpid()))
                    if others:
                        problem(test_id, "processes the tests started are still running: " + " ".join(others[:10]))
                for found in tampering("before the verdict"):
                    problem(test_id, found)
                lines = count[0]
                emit(test_id, '"done": ' + _str(lines))
                key = b""
                while not key.endswith(b"\n") and _len(key) < 256:
                    chunk = _read(key_fd, 256 - _len(key))
                    if not chunk:
                        break
                    key += chunk
                seal = key.strip().decode("ascii", "replace")
                write_all(
                    report_fd,
                    ('{"id": ' + _enc(test_id) + ', "seal": ' + _enc(seal) + ', "lines": ' + _str(lines + 1) + "}\n").encode(),
                )
            finally:
                _exit(0)
        _close(alive_w)
        _, status = _waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            problem(test_id, "the test process was killed by signal %d" % os.WTERMSIG(status))
        elif status != 0:
            problem(test_id, "the test process ended with exit code %d" % os.WEXITSTATUS(status))
        while True:
            try:
                if not _read(alive_r, 4096):
                    break
            except InterruptedError:
                continue
        _close(alive_r)
    sys.stdout.flush()
    _exit(0)


_verdict_runner()
