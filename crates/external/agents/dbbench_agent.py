#!/usr/bin/env python3
"""A DBBench agent in plain Python (standard library only): an external harness for harness-s.

It is what "bring your own harness" looks like from the program's side. The runner starts it
once per episode with these variables (see harness_external::program):

  HARNESS_ENV_URL, HARNESS_SESSION_ID   the environment server and this episode's session
  HARNESS_PROXY_URL, HARNESS_PROXY_KEY  the recording proxy (an OpenAI base URL) and the key
  HARNESS_MODEL, HARNESS_LIMITS         the model name to send, the limits as JSON

The agent reads the task and the tools from the session, asks the policy for the next step
through the proxy's /chat/completions (tools offered the OpenAI way), runs each tool call on
the session, and keeps its history exactly as it was answered (so every turn passes the
proxy's prefix check). With AGENT_HISTORY=text it instead keeps each reply as plain text
(the calls written out, the results as user messages), as many hand-written agents do: the
episode still works, and the proxy counts every later turn as a prefix break, because the
policy never produced that text. When a tool ends the episode (commit_final_answer) it finishes the
session, which runs the verifier on the server. With the OpenAI SDK the model calls would be
`OpenAI(base_url=..., api_key=...).chat.completions.create(...)`; urllib keeps this file free
of packages to install.
"""

import json
import os
import sys
import urllib.error
import urllib.request

SYSTEM = (
    "You are working with a MySQL database to answer a question about one of its tables, or "
    "to change that table. Run one SQL statement per step with execute_sql, then give the "
    "answer with commit_final_answer (an empty list after a change)."
)
NUDGE = "Call a tool: execute_sql to run SQL, or commit_final_answer to give the answer."


def call(method, url, body=None, key=None):
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")
        raise SystemExit("%s %s: HTTP %d: %s" % (method, url, e.code, detail))
    return json.loads(raw) if raw else None


def main():
    env_url = os.environ["HARNESS_ENV_URL"]
    session = "%s/v1/sessions/%s" % (env_url, os.environ["HARNESS_SESSION_ID"])
    proxy = os.environ["HARNESS_PROXY_URL"]
    key = os.environ["HARNESS_PROXY_KEY"]
    model = os.environ.get("HARNESS_MODEL", "policy")
    limits = json.loads(os.environ.get("HARNESS_LIMITS", "{}"))
    history = os.environ.get("AGENT_HISTORY", "exact")
    if history not in ("exact", "text"):
        raise SystemExit("AGENT_HISTORY: expected exact or text, got %r" % history)

    episode = call("GET", session + "/episode")
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["parameters"],
            },
        }
        for t in episode["tools"]
    ]
    task = episode["task"]["instruction"]
    if episode["initial_observation"]:
        task += "\n" + episode["initial_observation"]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]

    for _ in range(limits.get("max_model_calls", 15)):
        answer = call(
            "POST",
            proxy + "/chat/completions",
            {"model": model, "messages": messages, "tools": tools},
            key,
        )
        message = answer["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        if history == "exact":
            # The history keeps the reply as the proxy sent it.
            kept = {"role": "assistant", "content": message.get("content")}
            if calls:
                kept["tool_calls"] = calls
        else:
            written = ["%s(%s)" % (c["function"]["name"], c["function"]["arguments"]) for c in calls]
            text = " ".join(filter(None, [message.get("content") or "", "; ".join(written)]))
            kept = {"role": "assistant", "content": text}
        messages.append(kept)
        if not calls:
            messages.append({"role": "user", "content": NUDGE})
            continue
        for tool_call in calls:
            try:
                arguments = json.loads(tool_call["function"]["arguments"] or "{}")
            except ValueError:
                arguments = {}
            step = call(
                "POST",
                session + "/step",
                {"name": tool_call["function"]["name"], "arguments": arguments},
            )
            observation = step["observation"]
            if history == "exact":
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": tool_call["id"],
                        "content": observation["text"],
                    }
                )
            else:
                messages.append({"role": "user", "content": "Result: " + observation["text"]})
            if observation["done"]:
                result = call("POST", session + "/finish", {})
                print(json.dumps({"reward": result["outcome"]["reward"]}))
                return 0
    # Out of model calls: finish, so the verifier judges what was done.
    call("POST", session + "/finish", {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
