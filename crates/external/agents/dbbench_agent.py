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

These variables make it a sibling of a harness-s harness (the main job builds them from
its H0 and a sibling's hooks), so that a policy trained under harness-s's agent loop meets the
prompts it knows:

  AGENT_SYSTEM   the system message (default: this file's own)
  AGENT_USER     the first user message, `{instruction}` standing for the task's instruction;
                 when set, the initial observation follows as a user message of its own and a
                 reply without a tool call finishes the episode with that reply as the answer,
                 as harness-s's loop does (unset: instruction and observation in one message,
                 and a reply without a tool call gets a nudge)
  AGENT_NO_CALL  with AGENT_USER: the user message a reply without a tool call gets instead of
                 ending the episode (the loop's answer under an action format that needs a
                 call in every turn), followed by the on_error hooks
  AGENT_HOOKS    a JSON list of hooks in harness-s's form, {"name", "event", "condition",
                 "parameters", "message"}: events after_tool and on_error, conditions always,
                 tool_error, remaining_steps_lte {threshold} and observation_matches {pattern}; a
                 hook that fires adds its message as a user message (warn hooks only), marked
                 as the hook's with the OpenAI message name "hook:<name>" when the hook has a
                 name, so that the proxy records it as a harness hook message (not shown to the
                 policy)
"""

import json
import os
import re
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
        if e.code == 400 and "context_length_exceeded" in detail:
            raise ContextFull(detail)
        raise SystemExit("%s %s: HTTP %d: %s" % (method, url, e.code, detail))
    return json.loads(raw) if raw else None


class ContextFull(Exception):
    """The proxy refused a call: the prompt is longer than the episode's context limit."""


def load_hooks(text):
    """Parse AGENT_HOOKS; exit with the field that is wrong."""
    try:
        hooks = json.loads(text)
    except ValueError as e:
        raise SystemExit("AGENT_HOOKS: expected a JSON list of hooks: %s" % e)
    if not isinstance(hooks, list):
        raise SystemExit("AGENT_HOOKS: expected a JSON list of hooks")
    for i, hook in enumerate(hooks):
        where = "AGENT_HOOKS[%d]" % i
        if not isinstance(hook, dict):
            raise SystemExit("%s: expected an object" % where)
        if hook.get("event") not in ("after_tool", "on_error"):
            raise SystemExit("%s.event: expected after_tool or on_error" % where)
        if hook.get("action", "warn") != "warn":
            raise SystemExit("%s.action: only warn hooks are supported" % where)
        condition = hook.get("condition")
        parameters = hook.get("parameters") or {}
        if condition == "remaining_steps_lte":
            if not isinstance(parameters.get("threshold"), int):
                raise SystemExit("%s.parameters.threshold: expected an integer" % where)
        elif condition == "observation_matches":
            try:
                hook["regex"] = re.compile(parameters["pattern"])
            except (KeyError, TypeError, re.error) as e:
                raise SystemExit("%s.parameters.pattern: expected a regular expression: %s" % (where, e))
        elif condition not in ("always", "tool_error"):
            raise SystemExit(
                "%s.condition: expected always, tool_error, remaining_steps_lte or observation_matches" % where
            )
        if not isinstance(hook.get("message"), str):
            raise SystemExit("%s.message: expected a string" % where)
        if not isinstance(hook.get("name", ""), str):
            raise SystemExit("%s.name: expected a string" % where)
    return hooks


def hook_message(hook):
    """A fired hook's user message, marked with the hook's name for the recording proxy."""
    message = {"role": "user", "content": hook["message"]}
    if hook.get("name"):
        message["name"] = "hook:" + hook["name"]
    return message


def fired(hooks, event, observation, remaining_steps):
    """The hooks of `event` whose condition holds, in order."""
    out = []
    for hook in hooks:
        if hook["event"] != event:
            continue
        condition = hook["condition"]
        parameters = hook.get("parameters") or {}
        if (
            condition == "always"
            or (condition == "tool_error" and observation["error"])
            or (condition == "remaining_steps_lte" and remaining_steps <= parameters["threshold"])
            or (condition == "observation_matches" and hook["regex"].search(observation["text"]))
        ):
            out.append(hook)
    return out


def main():
    env_url = os.environ["HARNESS_ENV_URL"]
    session = "%s/v1/sessions/%s" % (env_url, os.environ["HARNESS_SESSION_ID"])
    # The session's token authorises this session's episode, step and finish, nothing else.
    token = os.environ.get("HARNESS_SESSION_TOKEN") or None
    proxy = os.environ["HARNESS_PROXY_URL"]
    key = os.environ["HARNESS_PROXY_KEY"]
    model = os.environ.get("HARNESS_MODEL", "policy")
    limits = json.loads(os.environ.get("HARNESS_LIMITS", "{}"))
    history = os.environ.get("AGENT_HISTORY", "exact")
    if history not in ("exact", "text"):
        raise SystemExit("AGENT_HISTORY: expected exact or text, got %r" % history)

    episode = call("GET", session + "/episode", key=token)
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
    instruction = episode["task"]["instruction"]
    observation0 = episode["initial_observation"]
    user = os.environ.get("AGENT_USER")
    hooks = load_hooks(os.environ.get("AGENT_HOOKS", "[]"))
    no_call = os.environ.get("AGENT_NO_CALL")
    messages = [{"role": "system", "content": os.environ.get("AGENT_SYSTEM", SYSTEM)}]
    if user is None:
        task = instruction + ("\n" + observation0 if observation0 else "")
        messages.append({"role": "user", "content": task})
    else:
        # harness-s's layout: the rendered user prompt, then the observation on its own.
        messages.append({"role": "user", "content": user.replace("{instruction}", instruction)})
        if observation0.strip():
            messages.append({"role": "user", "content": observation0})
    max_steps = limits.get("max_env_actions", 15)
    steps = 0

    def finish(final_answer=None):
        result = call("POST", session + "/finish", {"final_answer": final_answer}, key=token)
        # The verdict is the runner's: a program is told only that the session is finished.
        print(json.dumps({"finished": True, "steps": result["steps"]}))
        return 0

    for _ in range(limits.get("max_model_calls", 15)):
        try:
            answer = call(
                "POST",
                proxy + "/chat/completions",
                {"model": model, "messages": messages, "tools": tools},
                key,
            )
        except ContextFull:
            return finish()
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
            if user is None:
                messages.append({"role": "user", "content": NUDGE})
            elif no_call is None:
                return finish((message.get("content") or "").strip())
            else:
                # The loop's answer to a turn it cannot read as an action, then its error hooks.
                messages.append({"role": "user", "content": no_call})
                failed = {"text": no_call, "error": True}
                for hook in fired(hooks, "on_error", failed, max(max_steps - steps, 0)):
                    messages.append(hook_message(hook))
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
                key=token,
            )
            steps += 1
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
            remaining = max(max_steps - steps, 0)
            for event in (["on_error"] if observation["error"] else []) + ["after_tool"]:
                for hook in fired(hooks, event, observation, remaining):
                    messages.append(hook_message(hook))
            if observation["done"] or steps >= max_steps:
                return finish()
    # Out of model calls: finish, so the verifier judges what was done.
    return finish()


if __name__ == "__main__":
    sys.exit(main())
