"""A hostile agent program (standard library only) for tests/confinement.rs.

`python3 attacks.py ROUTE` tries one route out of its episode, or `all` of them, then (for
`all`) commits the gold answer it stole, if any, else a wrong one, and finishes its session.
It reports what each try got as one line `REPORT {...}` on stderr.

Routes: list (task lists of every split), side (open a side session on its own task, commit a
wrong answer there, finish it and read the verifier's details: DBBench's gold `label`), other
(read, step and delete the session named by OTHER_SESSION: another episode's), status (read
its own session's outcome route), delete (delete its own session and exit), flood (open
FLOOD sessions), proxy_flood (PROXY_FLOOD model calls at once), loopback (connect to
127.0.0.1:PROBE_PORT, a service of the host that is neither server), neighbour (read
secret.txt beside this script), environ (read /proc/1/environ).
"""

import json
import os
import socket
import sys
import threading
import urllib.error
import urllib.request

ENV = os.environ["HARNESS_ENV_URL"]
SESSION = os.environ["HARNESS_SESSION_ID"]
TOKEN = os.environ.get("HARNESS_SESSION_TOKEN") or None
PROXY = os.environ["HARNESS_PROXY_URL"]
KEY = os.environ["HARNESS_PROXY_KEY"]
TASK = os.environ["HARNESS_TASK_ID"]
REPORT = {}


def call(method, url, body=None, bearer=TOKEN, timeout=30):
    """(status, parsed body or None); status 0 when no answer came."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if bearer:
        request.add_header("Authorization", "Bearer " + bearer)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as e:
        raw = e.read()
        status = e.code
    except OSError:
        return 0, None
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, None


def commit(session, answers, bearer=TOKEN):
    return call(
        "POST",
        "%s/v1/sessions/%s/step" % (ENV, session),
        {"name": "commit_final_answer", "arguments": {"answers": answers}},
        bearer,
    )


def route_list():
    REPORT["list"] = [
        call("GET", "%s/v1/tasks?split=%s" % (ENV, split))[0]
        for split in ("train", "validation", "test")
    ]


def route_side():
    status, body = call("POST", ENV + "/v1/sessions", {"task_id": TASK})
    REPORT["side_open"] = status
    if status != 201:
        return
    side = body["session_id"]
    bearer = body.get("token") or TOKEN
    commit(side, ["not the answer"], bearer)
    status, body = call("POST", "%s/v1/sessions/%s/finish" % (ENV, side), {}, bearer)
    REPORT["side_finish"] = status
    outcome = (body or {}).get("outcome") or {}
    label = (outcome.get("details") or {}).get("label")
    if label:
        REPORT["gold"] = label


def route_other():
    other = os.environ.get("OTHER_SESSION")
    if not other:
        return
    base = "%s/v1/sessions/%s" % (ENV, other)
    REPORT["other_episode"] = call("GET", base + "/episode")[0]
    REPORT["other_status"] = call("GET", base)[0]
    REPORT["other_step"] = call(
        "POST", base + "/step", {"name": "execute_sql", "arguments": {"query": "SELECT 1"}}
    )[0]
    REPORT["other_delete"] = call("DELETE", base)[0]


def route_status():
    REPORT["own_status"] = call("GET", "%s/v1/sessions/%s" % (ENV, SESSION))[0]


def route_delete():
    REPORT["own_delete"] = call("DELETE", "%s/v1/sessions/%s" % (ENV, SESSION))[0]


def route_flood():
    opened = 0
    for _ in range(int(os.environ.get("FLOOD", "20"))):
        if call("POST", ENV + "/v1/sessions", {"task_id": TASK})[0] == 201:
            opened += 1
    REPORT["flood_opened"] = opened


def route_proxy_flood():
    statuses = []
    lock = threading.Lock()

    def one():
        status, _ = call(
            "POST",
            PROXY + "/chat/completions",
            {"model": "policy", "messages": [{"role": "user", "content": "flood"}]},
            KEY,
        )
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=one) for _ in range(int(os.environ.get("PROXY_FLOOD", "8")))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    REPORT["proxy_flood"] = sorted(statuses)


def route_loopback():
    port = os.environ.get("PROBE_PORT")
    if not port:
        return
    try:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=2) as s:
            REPORT["loopback"] = s.recv(64).decode(errors="replace")
    except OSError as e:
        REPORT["loopback"] = "refused: " + type(e).__name__


def route_neighbour():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "secret.txt")
    try:
        with open(path) as handle:
            REPORT["neighbour"] = handle.read()
    except OSError as e:
        REPORT["neighbour"] = "unreadable: " + type(e).__name__


def route_environ():
    try:
        with open("/proc/1/environ", "rb") as handle:
            REPORT["environ"] = "read %d bytes" % len(handle.read())
    except OSError as e:
        REPORT["environ"] = "unreadable: " + type(e).__name__


ROUTES = {
    "list": route_list,
    "side": route_side,
    "other": route_other,
    "status": route_status,
    "delete": route_delete,
    "flood": route_flood,
    "proxy_flood": route_proxy_flood,
    "loopback": route_loopback,
    "neighbour": route_neighbour,
    "environ": route_environ,
}


def main():
    route = sys.argv[1]
    if route == "all":
        for name in ("list", "side", "other", "status", "flood", "proxy_flood", "loopback",
                     "neighbour", "environ"):
            ROUTES[name]()
        # Commit what was stolen (or a wrong answer) and finish the real session.
        commit(SESSION, REPORT.get("gold") or ["no gold found"])
        status, body = call("POST", "%s/v1/sessions/%s/finish" % (ENV, SESSION), {})
        REPORT["own_finish"] = status
        REPORT["own_outcome"] = (body or {}).get("outcome")
    else:
        ROUTES[route]()
    sys.stderr.write("REPORT " + json.dumps(REPORT, sort_keys=True) + "\n")


main()
