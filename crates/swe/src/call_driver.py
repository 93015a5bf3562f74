# The policy-side driver of the call judge (see `judge.rs`).
#
# Usage: python3 -c <this file>   (the calls arrive as one JSON object on stdin)
# stdin:  {"tests": [{"id": ..., "steps": [...]}, ...]}
# fd 1:   one JSON line per test id: {"id": ..., "observations": [...]}; each observation of a
#         result cut short has "cut" with the reason (the judge never compares it)
# fd 2:   output (the repository's prints and tracebacks)
#
# This process holds no expected value, no verdict and no key: it makes the calls a hidden test
# makes and reports what they returned or raised, as plain data. Whatever the repository's code
# does here (rewrite this file's functions, write lines of its own, exit early) can only change
# the observations, and the judge compares them with what the gold code produced, which never
# enters this process. The parent never imports repository code; each test id runs in a child
# forked from it, so every id starts from a fresh import of the repository. The child reports
# through a pipe of its own (never the report descriptor), and the parent writes its id's line.


def _call_driver():
    import sys

    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    import builtins
    import datetime
    import importlib
    import json
    import os

    spec = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    root = os.getcwd()
    report_fd = os.dup(1)
    try:
        # Not dumpable: a child (same user, no capabilities) cannot open this process's
        # descriptors through /proc/<pid>/fd and so cannot reach the report.
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except BaseException:
        pass
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)

    # Bounds on snapshots: depth, items per container, characters, and values per test in all
    # (a list that holds one list a thousand times, eight levels deep, is small in memory but
    # not when written out).
    MAX_DEPTH, MAX_ITEMS, MAX_TEXT, MAX_NODES = 8, 1000, 100_000, 20_000
    nodes = [0]
    # Why the current step's snapshot was cut short, if it was: the observation carries it, and
    # the judge never compares a cut value (equal prefixes are not equal values).
    cuts = []

    def cut(marker, why):
        if not cuts:
            cuts.append(why)
        return {"cut": marker}

    # Classes are named by identity, never by what they say of themselves: `__module__`,
    # `__qualname__` and `mro()` are the class's own to set, and a metaclass can answer any
    # attribute. The slots are read through `type`'s own descriptors, and the built-in classes
    # are taken now, before the repository is imported (it may rebind `builtins.ValueError`).
    type_slot = {name: type.__dict__[name].__get__ for name in ("__module__", "__qualname__", "__mro__", "__bases__")}
    builtin_classes = {id(v): (v, k) for k, v in vars(builtins).items() if type(v) is type}
    date_tags = {id(c): (c, "datetime." + n) for n, c in (("date", datetime.date), ("datetime", datetime.datetime), ("time", datetime.time), ("timedelta", datetime.timedelta))}

    def qualname(cls):
        known = builtin_classes.get(id(cls))
        if known is not None and known[0] is cls:
            return "builtins." + known[1]
        try:
            module, name = type_slot["__module__"](cls), type_slot["__qualname__"](cls)
        except BaseException:
            return "?"
        if type(module) is not str or type(name) is not str:
            return "?"
        if module == "builtins":
            # Only the real built-in classes (above) are named so.
            return "?builtins." + name
        return "%s.%s" % (module, name)

    def ancestors(cls):
        # The classes `cls` really inherits from, through `__bases__`: a metaclass's `mro()`
        # can list classes the class does not derive from.
        seen, todo = {}, [cls]
        while todo:
            c = todo.pop()
            if id(c) not in seen:
                seen[id(c)] = c
                todo.extend(type_slot["__bases__"](c))
        return seen

    def snapshot(value, depth=0):
        # Plain data, tagged so that no object of the repository's can pass for a built-in
        # value: only the exact built-in types map to JSON scalars and arrays.
        kind = type(value)
        nodes[0] += 1
        if nodes[0] > MAX_NODES:
            return cut("more than %d values" % MAX_NODES, "more than %d values" % MAX_NODES)
        if value is None or kind is bool:
            return value
        if kind is int:
            return value if -(2**53) < value < 2**53 else {"int": str(value)}
        if kind is float:
            return {"float": repr(value)}
        if kind is str:
            return value if len(value) <= MAX_TEXT else cut(value[:MAX_TEXT], "a string of more than %d characters" % MAX_TEXT)
        if depth >= MAX_DEPTH:
            return cut(qualname(kind), "nested more than %d levels" % MAX_DEPTH)

        def items(values):
            # At most MAX_ITEMS, then a marker that more were left out.
            out = [snapshot(v, depth + 1) for v in values[:MAX_ITEMS]]
            if len(values) > MAX_ITEMS:
                out.append(cut("%d items" % len(values), "more than %d items in a container" % MAX_ITEMS))
            return out

        if kind is list:
            return items(value)
        if kind is tuple:
            return {"tuple": items(value)}
        if kind is dict:
            pairs = list(value.items())
            out = [[snapshot(k, depth + 1), snapshot(v, depth + 1)] for k, v in pairs[:MAX_ITEMS]]
            if len(pairs) > MAX_ITEMS:
                out.append(cut("%d items" % len(pairs), "more than %d items in a container" % MAX_ITEMS))
            return {"dict": out}
        if kind in (set, frozenset):
            return {"set": sorted(items(list(value)), key=lambda v: json.dumps(v, sort_keys=True))}
        if kind is bytes:
            if len(value) > MAX_TEXT:
                return cut(value[:MAX_TEXT].hex(), "more than %d bytes" % MAX_TEXT)
            return {"bytes": value.hex()}
        tag = date_tags.get(id(kind))
        if tag is not None and tag[0] is kind:
            return {tag[1]: str(value)}
        attrs = {}
        try:
            data = object.__getattribute__(value, "__dict__")
            names = sorted(data)
            if len(names) > MAX_ITEMS:
                attrs["_cut"] = cut("%d attributes" % len(names), "more than %d attributes" % MAX_ITEMS)
            for name in names[:MAX_ITEMS]:
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
        kind = type(exc)
        real = ancestors(kind)
        return {
            "type": qualname(kind),
            "mro": [qualname(c) for c in type_slot["__mro__"](kind) if real.get(id(c)) is c],
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

    def line_of(read_fd):
        # The child's one line (it writes one and exits); read up to its newline only, so that
        # a process the child left behind holding the pipe open cannot stall the parent.
        data = b""
        while b"\n" not in data and len(data) < (64 << 20):
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            data += chunk
        return data.split(b"\n", 1)[0]

    for test in spec["tests"]:
        sys.stdout.flush()
        sys.stderr.flush()
        # Each child reports through a pipe of its own and never holds the report descriptor:
        # a line it writes can only be its own id's, whatever id it names.
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            os.close(report_fd)
            report_fd = write_fd
            observations = []
            try:
                sys.path.insert(0, root)
                scope, logs = {}, {}
                nodes[0] = 0
                for step in test["steps"]:
                    seen = "see" in step
                    del cuts[:]
                    try:
                        value = evaluate(step["see"] if seen else step["do"])
                    except Unbound as exc:
                        observations.append({"unbound": str(exc)})
                        continue
                    except BaseException as exc:
                        observations.append({"raised": raised(exc)})
                        value = exc
                    else:
                        if seen:
                            shot = snapshot(value)
                            observations.append({"value": shot, "cut": cuts[0]} if cuts else {"value": shot})
                        else:
                            observations.append({"ok": True})
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
        os.close(write_fd)
        line = line_of(read_fd)
        os.close(read_fd)
        os.waitpid(pid, 0)
        try:
            observations = json.loads(line.decode("utf-8"))["observations"]
        except BaseException:
            continue
        if type(observations) is list:
            write_all((json.dumps({"id": test["id"], "observations": observations}) + "\n").encode())
    os._exit(0)


_call_driver()
