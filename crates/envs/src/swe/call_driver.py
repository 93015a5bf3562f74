# The policy-side driver of the call judge (see `judge.rs`).
#
# Usage: python3 -c <this file>   (the calls arrive as one JSON object on stdin)
# stdin:  {"tests": [{"id": ..., "steps": [...]}, ...]}
# fd 1:   one JSON line per test id: {"id": ..., "observations": [...]}
# fd 2:   output (the repository's prints and tracebacks)
#
# This process holds no expected value, no verdict and no key: it makes the calls a hidden test
# makes and reports what they returned or raised, as plain data. Whatever the repository's code
# does here (rewrite this file's functions, write lines of its own, exit early) can only change
# the observations, and the judge compares them with what the gold code produced, which never
# enters this process. The parent never imports repository code; each test id runs in a child
# forked from it, so every id starts from a fresh import of the repository.


def _call_driver():
    import sys

    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    import importlib
    import json
    import os

    spec = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    root = os.getcwd()
    report_fd = os.dup(1)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)

    # Bounds on snapshots: depth, items per container, characters, and values per test in all
    # (a list that holds one list a thousand times, eight levels deep, is small in memory but
    # not when written out).
    MAX_DEPTH, MAX_ITEMS, MAX_TEXT, MAX_NODES = 8, 1000, 100_000, 20_000
    nodes = [0]

    def qualname(cls):
        return "%s.%s" % (getattr(cls, "__module__", "?"), getattr(cls, "__qualname__", "?"))

    def snapshot(value, depth=0):
        # Plain data, tagged so that no object of the repository's can pass for a built-in
        # value: only the exact built-in types map to JSON scalars and arrays.
        kind = type(value)
        nodes[0] += 1
        if nodes[0] > MAX_NODES:
            return {"cut": "more than %d values" % MAX_NODES}
        if value is None or kind is bool:
            return value
        if kind is int:
            return value if -(2**53) < value < 2**53 else {"int": str(value)}
        if kind is float:
            return {"float": repr(value)}
        if kind is str:
            return value if len(value) <= MAX_TEXT else {"cut": value[:MAX_TEXT]}
        if depth >= MAX_DEPTH:
            return {"cut": qualname(kind)}
        if kind is list:
            return [snapshot(v, depth + 1) for v in value[:MAX_ITEMS]]
        if kind is tuple:
            return {"tuple": [snapshot(v, depth + 1) for v in value[:MAX_ITEMS]]}
        if kind is dict:
            return {"dict": [[snapshot(k, depth + 1), snapshot(v, depth + 1)] for k, v in list(value.items())[:MAX_ITEMS]]}
        if kind in (set, frozenset):
            items = [snapshot(v, depth + 1) for v in list(value)[:MAX_ITEMS]]
            return {"set": sorted(items, key=lambda v: json.dumps(v, sort_keys=True))}
        if kind is bytes:
            return {"bytes": value[:MAX_TEXT].hex()}
        if qualname(kind) in ("datetime.date", "datetime.datetime", "datetime.time", "datetime.timedelta"):
            return {qualname(kind): str(value)}
        attrs = {}
        try:
            data = object.__getattribute__(value, "__dict__")
            for name in sorted(data)[:MAX_ITEMS]:
                if type(name) is str and not name.startswith("_"):
                    attrs[name] = snapshot(data[name], depth + 1)
        except BaseException:
            pass
        return {"object": qualname(kind), "attrs": attrs}

    def raised(exc):
        try:
            message = str(exc)[:2000]
        except BaseException:
            message = "<unprintable>"
        return {
            "type": qualname(type(exc)),
            "mro": [qualname(c) for c in type(exc).__mro__],
            "message": message,
        }

    class Unbound(Exception):
        pass

    def helper(kind, log):
        # Callables the tests pass in (a memoised function's body), recording their calls.
        record = logs.setdefault(log, [])
        if kind == "square":
            def square(x):
                record.append(x)
                return x * x
            return square
        if kind == "power":
            def power(x, exponent=2):
                record.append([x, exponent])
                return x ** exponent
            return power
        if kind == "none":
            def nothing(x):
                record.append(x)
                return None
            return nothing
        raise ValueError("unknown helper %r" % kind)

    def ref(path):
        module, _, attrs = path.partition(":")
        value = importlib.import_module(module)
        for name in attrs.split(".") if attrs else []:
            value = getattr(value, name)
        return value

    def args_of(expr):
        return (
            [evaluate(a) for a in expr.get("args", [])],
            {k: evaluate(v) for k, v in expr.get("kwargs", {}).items()},
        )

    OPS = {
        "+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "@": lambda a, b: a @ b,
        "==": lambda a, b: a == b,
    }

    def evaluate(expr):
        if expr is None or type(expr) in (bool, int, float, str):
            return expr
        if type(expr) is list:
            return [evaluate(e) for e in expr]
        if "var" in expr:
            if expr["var"] not in scope:
                raise Unbound(expr["var"])
            return scope[expr["var"]]
        if "ref" in expr:
            return ref(expr["ref"])
        if "call" in expr:
            target = expr["call"]
            function = ref(target) if type(target) is str else evaluate(target)
            args, kwargs = args_of(expr)
            return function(*args, **kwargs)
        if "method" in expr:
            obj, name = expr["method"]
            args, kwargs = args_of(expr)
            return getattr(evaluate(obj), name)(*args, **kwargs)
        if "attr" in expr:
            obj, name = expr["attr"]
            return getattr(evaluate(obj), name)
        if "len" in expr:
            return len(evaluate(expr["len"]))
        if "truth" in expr:
            return bool(evaluate(expr["truth"]))
        if "list" in expr:
            return list(evaluate(expr["list"]))
        if "in" in expr:
            item, container = expr["in"]
            return evaluate(item) in evaluate(container)
        if "tuple" in expr:
            return tuple(evaluate(e) for e in expr["tuple"])
        if "dict" in expr:
            return {evaluate(k): evaluate(v) for k, v in expr["dict"]}
        if "op" in expr:
            a, b = expr["args"]
            return OPS[expr["op"]](evaluate(a), evaluate(b))
        if "fn" in expr:
            return helper(expr["fn"], expr.get("log", "calls"))
        if "log" in expr:
            return list(logs.get(expr["log"], []))
        raise ValueError("unknown expression %r" % (expr,))

    def write_all(data):
        while data:
            data = data[os.write(report_fd, data):]

    for test in spec["tests"]:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            observations = []
            try:
                sys.path.insert(0, root)
                scope, logs = {}, {}
                nodes[0] = 0
                for step in test["steps"]:
                    seen = "see" in step
                    try:
                        value = evaluate(step["see"] if seen else step["do"])
                    except Unbound as exc:
                        observations.append({"unbound": str(exc)})
                        continue
                    except BaseException as exc:
                        observations.append({"raised": raised(exc)})
                        value = exc
                    else:
                        observations.append({"value": snapshot(value)} if seen else {"ok": True})
                    if "let" in step:
                        scope[step["let"]] = value
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException as exc:
                observations.append({"driver_error": repr(exc)[:500]})
            try:
                write_all((json.dumps({"id": test["id"], "observations": observations}) + "\n").encode())
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    os._exit(0)


_call_driver()
