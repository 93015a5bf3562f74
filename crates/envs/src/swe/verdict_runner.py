# The verifier's test runner (see `exec::run_verdict_tests`).
#
# Usage: python3 -c <this file> <output cap> <test id>...
#
# This process never imports repository code. For each test id it forks a child that is a
# fresh copy of this pristine interpreter; only the child puts the repository on sys.path,
# loads the id and runs it. The child's stdout and stderr go to a pipe this process reads, so
# the child has no handle on the stream the verifier reads. The child reports its verdict once,
# on a second pipe, tagged with a key made for it, and leaves with os._exit (no atexit hooks,
# no finalizers). This process accepts the verdict only when exactly one tagged verdict arrived
# and the child exited with status 0 after sending it; anything else is an error for that id.
# It then writes one `@@verdict {json}` line per id to its stdout, child output indented by
# "| " so that it never reads as a verdict, and `@@done <count>` at the end.
#
# The child also checks that the test machinery is as the runner found it: every builtin, the
# attributes of the unittest modules and of their classes, sys.exit and os._exit, after loading
# the tests and after running them; and that every test it loaded reported an outcome. A skip
# is not a pass.
#
# What this does not stop is written in the module docs of `swe` and in the README.


def _verdict_runner():
    import sys

    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    import builtins
    import json
    import os
    import select
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

    # Everything the runner relies on after repository code has run, held in locals.
    _exit, _write, _fork, _dup2, _close = os._exit, os.write, os.fork, os.dup2, os.close
    _dumps, _loads = json.dumps, json.loads
    _TestLoader, _TestSuite, _TestResult = unittest.TestLoader, unittest.TestSuite, unittest.TestResult
    _SkipTest = unittest.SkipTest
    _format_exc = traceback.format_exc
    _isinstance, _issubclass, _sorted, _list, _vars = isinstance, issubclass, sorted, list, vars

    cap = int(sys.argv[1])
    ids = sys.argv[2:]
    root = os.getcwd()
    modules = _sorted(
        ((name, module) for name, module in sys.modules.items()
         if name == "unittest" or name.startswith("unittest.")),
        key=lambda item: item[0],
    )

    def snapshot():
        state = {}
        for name, value in _list(_vars(builtins).items()):
            state["builtins." + name] = value
        for module_name, module in modules:
            state["sys.modules[%s]" % module_name] = sys.modules.get(module_name)
            for name, value in _list(_vars(module).items()):
                state[module_name + "." + name] = value
                if _isinstance(value, type) and str(getattr(value, "__module__", "")).startswith("unittest"):
                    for attr, member in _list(_vars(value).items()):
                        state["%s.%s.%s" % (module_name, name, attr)] = member
        state["sys.exit"] = sys.exit
        state["os._exit"] = os._exit
        return state

    pristine = snapshot()
    class_prefixes = tuple(
        "%s.%s." % (module_name, name)
        for module_name, module in modules
        for name, value in _vars(module).items()
        if _isinstance(value, type) and str(getattr(value, "__module__", "")).startswith("unittest")
    )

    def tampering(when):
        # Changed or removed entries anywhere, added entries on unittest's classes. Additions to
        # modules (importing unittest.mock adds `unittest.mock`) and to builtins (gettext's `_`)
        # are ordinary.
        now = snapshot()
        found = []
        for key, value in pristine.items():
            if key not in now:
                found.append("%s: `%s` was removed" % (when, key))
            elif now[key] is not value:
                found.append("%s: `%s` was replaced" % (when, key))
        for key, value in now.items():
            # Running a test class sets data on it (`tearDown_exceptions`); new behaviour on
            # unittest's classes (a method, a property) is tampering.
            behaves = callable(value) or hasattr(type(value), "__get__")
            if key not in pristine and key.startswith(class_prefixes) and behaves:
                found.append("%s: `%s` was added" % (when, key))
        return found[:20]

    class Recorder(_TestResult):
        def __init__(self):
            _TestResult.__init__(self)
            self.outcomes = {}

        def note(self, test, status):
            if self.outcomes.get(test.id()) in (None, "pass", "skipped"):
                self.outcomes[test.id()] = status

        def addSuccess(self, test):
            _TestResult.addSuccess(self, test)
            self.note(test, "pass")

        def addFailure(self, test, err):
            _TestResult.addFailure(self, test, err)
            self.note(test, "fail")

        def addError(self, test, err):
            _TestResult.addError(self, test, err)
            self.note(test, "error")

        def addSkip(self, test, reason):
            _TestResult.addSkip(self, test, reason)
            self.note(test, "skipped")

        def addExpectedFailure(self, test, err):
            _TestResult.addExpectedFailure(self, test, err)
            self.note(test, "pass")

        def addUnexpectedSuccess(self, test):
            _TestResult.addUnexpectedSuccess(self, test)
            self.note(test, "fail")

        def addSubTest(self, test, subtest, err):
            _TestResult.addSubTest(self, test, subtest, err)
            if err is not None:
                self.note(test, "fail" if _issubclass(err[0], test.failureException) else "error")

    def flatten(suite):
        for item in suite:
            if _isinstance(item, _TestSuite):
                yield from flatten(item)
            else:
                yield item

    def child(test_id, key, verdict_fd):
        status, outcomes, problems = "error", {}, []
        try:
            sys.path.insert(0, root)
            suite = None
            try:
                suite = _TestLoader().loadTestsFromName(test_id)
            except BaseException:
                problems.append("the test id could not be loaded")
                print("ERROR %s\n%s" % (test_id, _format_exc(limit=3)))
            if suite is not None:
                problems += tampering("after loading the tests")
                expected = [t.id() for t in flatten(suite)]
                result = Recorder()
                result.buffer = True
                try:
                    suite.run(result)
                except BaseException:
                    problems.append("the run raised instead of reporting")
                    print("ERROR %s\n%s" % (test_id, _format_exc(limit=3)))
                problems += tampering("after running the tests")
                outcomes = dict(result.outcomes)
                missing = [t for t in expected if t not in outcomes]
                if not expected or result.testsRun == 0:
                    problems.append("no test found under this id")
                if missing:
                    problems.append("no outcome for %s" % ", ".join(missing[:10]))
                values = _list(outcomes.values())
                if "error" in values:
                    status = "error"
                elif "fail" in values:
                    status = "fail"
                elif "skipped" in values:
                    status = "skipped"
                elif values:
                    status = "pass"
                for kind, items in (("FAIL", result.failures), ("ERROR", result.errors)):
                    for test, tb in items:
                        print("%s %s\n%s" % (kind, test.id(), tb))
            if problems:
                status = "error"
                print("ERROR %s: %s" % (test_id, "; ".join(problems)))
            sys.stdout.flush()
        except BaseException:
            status, problems = "error", problems + ["the runner failed: %s" % _format_exc(limit=2)]
        message = _dumps({"key": key, "status": status, "tests": outcomes, "problems": problems})
        try:
            _write(verdict_fd, (message + "\n").encode())
        finally:
            _exit(0)

    out = sys.stdout
    forwarded = 0
    for test_id in ids:
        key = os.urandom(16).hex()
        verdict_r, verdict_w = os.pipe()
        output_r, output_w = os.pipe()
        out.flush()
        pid = _fork()
        if pid == 0:
            try:
                _close(verdict_r)
                _close(output_r)
                _dup2(output_w, 1)
                _dup2(output_w, 2)
                _close(output_w)
                child(test_id, key, verdict_w)
            finally:
                _exit(3)
        _close(verdict_w)
        _close(output_w)
        verdict, output, overflow = b"", bytearray(), False
        fds = {verdict_r: "verdict", output_r: "output"}
        exit_status, exited_at = None, None
        while fds:
            wait = 0.05
            if exited_at is not None:
                # A process the child left behind may hold the pipes open; stop soon after.
                left = exited_at + 0.5 - time.monotonic()
                if left <= 0:
                    break
                wait = min(wait, left)
            ready, _, _ = select.select(_list(fds), [], [], wait)
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    _close(fd)
                    del fds[fd]
                elif fds[fd] == "verdict":
                    if len(verdict) < 65536:
                        verdict += data
                    else:
                        overflow = True
                else:
                    output += data[: max(0, cap - forwarded - len(output))]
            if exit_status is None:
                done, status_word = os.waitpid(pid, os.WNOHANG)
                if done:
                    exit_status, exited_at = status_word, time.monotonic()
        for fd in fds:
            _close(fd)
        if exit_status is None:
            _, exit_status = os.waitpid(pid, 0)
        problems = []
        record = None
        lines = [line for line in verdict.split(b"\n") if line.strip()]
        if overflow or len(lines) > 1:
            problems.append("the test process sent more than one verdict")
        elif not lines:
            problems.append("no verdict: the test process ended before reporting one")
        else:
            try:
                record = _loads(lines[0].decode("utf-8", "replace"))
            except ValueError:
                record = None
            if not _isinstance(record, dict) or record.get("key") != key:
                problems.append("a verdict without this run's key")
                record = None
        if not (os.WIFEXITED(exit_status) and os.WEXITSTATUS(exit_status) == 0):
            problems.append("the test process ended with status %d" % exit_status)
        if problems or record is None:
            line = {"id": test_id, "status": "error", "tests": {}, "problems": problems}
        else:
            line = {
                "id": test_id,
                "status": record.get("status", "error"),
                "tests": record.get("tests", {}),
                "problems": record.get("problems", []),
            }
        forwarded += len(output)
        text = output.decode("utf-8", "replace")
        for row in text.splitlines():
            out.write("| " + row + "\n")
        out.write("%s %s\n" % (line["status"].upper(), test_id))
        out.write("@@verdict " + _dumps(line) + "\n")
        out.flush()
    out.write("@@done %d\n" % len(ids))
    out.flush()


_verdict_runner()
