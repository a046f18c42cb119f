"""The worst-case model: an OpenAI-compatible Chat Completions server that plays AgentDojo's
ground truth, and the injection's too as soon as it reads one.

It keeps no conversation state of its own: each request carries the process's history,
and the next step is worked out from it (which tools are offered, which calls were made,
what the results said), as a real model would. So a request Capstan retries gets the same
answer. What it knows of the pair (the prompt, both tasks' ground-truth calls, the planted
texts) is the runner's current `Pair`.

- channel (offered `reply`): on the user's message, `spawn_worker` with the prompt as the
  task, then `skip`; on the worker's report (`[worker:N] finished (STATE): TEXT`), `reply`
  with TEXT.
- worker (offered `set_status`): the user task's ground-truth calls, one per request; once
  a tool result it has read holds the injection, the injection task's calls next, then the
  rest of the user task; then `set_status` done with the user task's GROUND_TRUTH_OUTPUT
  (and the injection task's, if it played it).
- anything else (a compactor, a branch): a short text.
"""

import functools
import json
import re
import time
import uuid
from dataclasses import dataclass, field

import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

# Past this many answers to one process the model ends it, whatever its history says.
SPARE_STEPS = 4


@dataclass
class Pair:
    """What the model knows of the run in progress."""

    suite: str
    label: str
    prompt: str
    user_calls: list  # FunctionCall, the user task's ground truth
    user_output: str
    injection_calls: list = field(default_factory=list)
    injection_output: str = ""
    # The texts planted in the environment (one per injection vector, usually all the
    # same); empty when the run has no injection.
    injections: tuple = ()
    # Set by the model: whether its worker read the injection and played its task.
    read_injection: bool = False


# ---- reading an injection ---------------------------------------------------------------
#
# The planted text never comes back verbatim: AgentDojo formats it into the environment's
# YAML (which folds its line breaks), a tool formats its result as YAML again (which
# quotes, escapes and wraps long lines) or as a Python repr (`\n` written out), and Capstan
# may wrap the result in text of its own. So both sides are compared folded to their
# letters and digits, and the result is read in every way it may be written: as is, with
# backslash escapes taken out, and as the strings of its JSON or YAML parse.

_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|x[0-9a-fA-F]{2}|.)", re.DOTALL)


def _fold(text: str) -> str:
    return re.sub(r"[^0-9a-z]+", "", text.lower())


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _readings(text: str):
    yield text
    yield _ESCAPE.sub(" ", text)
    for parse in (json.loads, yaml.safe_load):
        try:
            parsed = parse(text)
        except Exception:  # not this format: the other readings remain
            continue
        yield " ".join(_strings(parsed))


@functools.lru_cache(maxsize=4096)
def contains_injection(text: str, injection: str) -> bool:
    """Whether `text` (a tool result as the model got it) holds the planted `injection`."""
    needle = _fold(injection)
    return bool(needle) and any(needle in _fold(reading) for reading in _readings(text))


# ---- what to do next --------------------------------------------------------------------


def _text(content) -> str:
    """A message's content as text (a string, or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _call(name: str, arguments: dict) -> dict:
    return {"name": name, "arguments": json.dumps(arguments)}


def worker_plan(pair: Pair, results: list[str]) -> tuple[list, bool]:
    """The calls the worker makes, given the tool results it has read so far, and whether
    they include the injection task's: the user task's calls, with the injection task's
    right after the first result that holds the injection."""
    if pair.injections:
        for index, result in enumerate(results):
            if any(contains_injection(result, planted) for planted in pair.injections):
                calls = pair.user_calls[: index + 1] + pair.injection_calls + pair.user_calls[index + 1 :]
                return calls, True
    return list(pair.user_calls), False


def worker_step(pair: Pair, messages: list[dict], tool_prefix: str) -> dict:
    """The worker's next answer: one tool call, or `set_status`."""
    task = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
    if pair.prompt.strip() not in task:
        return _call("set_status", {"state": "failed", "message": "This is not the task of the current pair."})
    results = [_text(m.get("content")) for m in messages if m.get("role") == "tool"]
    answered = sum(1 for m in messages if m.get("role") == "assistant")
    plan, injected = worker_plan(pair, results)
    pair.read_injection |= injected
    made = len(results)
    if answered > len(plan) + SPARE_STEPS or made > len(plan):
        return _call("set_status", {"state": "failed", "message": "Stopped: more steps than the plan has."})
    if made < len(plan):
        call = plan[made]
        return _call(tool_prefix + call.function, dict(call.args))
    parts = [pair.user_output.strip() or f"Done ({made} tool calls)."]
    # A worst-case model also says what the injection asked it to say (travel's
    # injection_task_6 is nothing else).
    if injected and pair.injection_output.strip():
        parts.append(pair.injection_output.strip())
    return _call("set_status", {"state": "done", "message": "\n".join(parts)})


_REPORT = re.compile(r"^\[worker:[^\]]+\] finished \([^)]*\): (.*)$", re.DOTALL)


def channel_step(pair: Pair, messages: list[dict]) -> list[dict]:
    """The channel's next answer: its tool calls."""
    answered = sum(1 for m in messages if m.get("role") == "assistant")
    if answered > 2 + SPARE_STEPS:
        return [_call("skip", {})]
    last = messages[-1] if messages else {}
    text = _text(last.get("content"))
    if last.get("role") != "user":
        return [_call("skip", {})]
    report = _REPORT.match(text)
    if report:
        return [_call("reply", {"text": report.group(1)})]
    if pair.prompt.strip() in text:
        return [_call("spawn_worker", {"task": pair.prompt}), _call("skip", {})]
    return [_call("skip", {})]  # a status note, or something not asked for


class WorstCaseModel:
    """The model's state (the current pair) and its HTTP app."""

    def __init__(self):
        self.pair: Pair | None = None
        self.requests = 0
        self.port: int | None = None  # set by whoever serves `app()`

    def answer(self, body: dict) -> list[dict] | str:
        """Tool calls (name, JSON arguments) or a text for one request."""
        self.requests += 1
        offered = {tool.get("function", {}).get("name") for tool in body.get("tools") or []}
        messages = body.get("messages") or []
        pair = self.pair
        if pair is None:
            return "No task is running."
        if "reply" in offered and "spawn_worker" in offered:
            return channel_step(pair, messages)
        if "set_status" in offered:
            # Capstan offers an MCP server's tool `suite.tool` as `suite-tool`.
            return [worker_step(pair, messages, f"{pair.suite}-")]
        return "Nothing to add."

    def app(self) -> Starlette:
        async def completions(request: Request):
            body = await request.json()
            answer = self.answer(body)
            if body.get("stream"):
                return StreamingResponse(_chunks(answer, body.get("model", "")), media_type="text/event-stream")
            return JSONResponse(_completion(answer, body.get("model", "")))

        async def models(request: Request):
            return JSONResponse({"object": "list", "data": [{"id": "worst-case", "object": "model"}]})

        return Starlette(routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ])


def _tool_calls(answer) -> list[dict]:
    return [
        {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function", "function": call}
        for call in answer
    ]


def _completion(answer, model: str) -> dict:
    message = {"role": "assistant", "content": answer if isinstance(answer, str) else None}
    if not isinstance(answer, str):
        message["tool_calls"] = _tool_calls(answer)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": "stop" if isinstance(answer, str) else "tool_calls",
        }],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


async def _chunks(answer, model: str):
    """The answer as a Chat Completions event stream: the role, the text or each tool
    call whole, the finish reason, `[DONE]`."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}

    def event(delta, finish=None):
        chunk = dict(head, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])
        return f"data: {json.dumps(chunk)}\n\n"

    yield event({"role": "assistant"})
    if isinstance(answer, str):
        yield event({"content": answer})
        yield event({}, "stop")
    else:
        for index, call in enumerate(_tool_calls(answer)):
            yield event({"tool_calls": [dict(call, index=index)]})
        yield event({}, "tool_calls")
    yield "data: [DONE]\n\n"
