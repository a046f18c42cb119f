"""The official `openai` Python SDK, unchanged, against `capstan serve`."""

import openai
import pytest
from openai import OpenAI

from conftest import TOKEN, WORKER_REPLY


def client(server, key="unused-on-loopback"):
    return OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def test_a_completion_is_the_reply_after_the_worker_ran(server):
    answer = client(server).chat.completions.create(
        model="capstan",
        messages=[{"role": "user", "content": "Please count the files."}],
    )
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.content == WORKER_REPLY
    assert answer.choices[0].finish_reason == "stop"
    tools = [e.get("tool") for e in answer.model_extra["capstan"]["events"]]
    assert "file_list" in tools


def test_a_streamed_completion_carries_the_reply_and_the_tool_activity(server):
    stream = client(server).chat.completions.create(
        model="capstan",
        stream=True,
        user="streamed",
        messages=[{"role": "user", "content": "Please count the files."}],
    )
    text, activity, finish = "", [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        if delta.content:
            text += delta.content
        event = (chunk.model_extra or {}).get("capstan_event")
        if event:
            activity.append(event["type"])
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert text == WORKER_REPLY
    assert finish == "stop"
    assert "worker_started" in activity and "tool_called" in activity


def test_models_are_listed_and_an_unknown_one_is_an_sdk_error(server):
    ids = [m.id for m in client(server).models.list()]
    assert "capstan" in ids
    with pytest.raises(openai.NotFoundError) as refused:
        client(server).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hello"}]
        )
    assert "no model `gpt-4o`" in str(refused.value)


def test_a_token_server_refuses_a_wrong_key_and_answers_the_right_one(server_with_token):
    with pytest.raises(openai.AuthenticationError):
        client(server_with_token, key="not-the-token-0000000000").models.list()
    answer = client(server_with_token, key=TOKEN).chat.completions.create(
        model="capstan", messages=[{"role": "user", "content": "hello"}]
    )
    assert answer.choices[0].message.content == "Hi there."


def test_a_retry_with_the_same_idempotency_key_is_answered_again_and_stored_once(server):
    import json
    import urllib.request

    def ask():
        return client(server).chat.completions.create(
            model="capstan",
            user="keyed",
            messages=[{"role": "user", "content": "Please count the files."}],
            extra_headers={"Idempotency-Key": "interop-retry-1"},
        )

    first = ask()
    assert first.choices[0].message.content == WORKER_REPLY
    assert first.model_extra["capstan"]["outcome"] == "stored"
    assert "repeated" not in first.model_extra["capstan"]
    # A client that never saw the answer retries, even across a restart of the server.
    server.restart()
    again = ask()
    assert again.choices[0].message.content == WORKER_REPLY
    assert again.model_extra["capstan"]["repeated"] is True
    with urllib.request.urlopen(server.url + "/v1/channels/keyed/history") as response:
        history = json.load(response)["messages"]
    asked = [m for m in history if m["role"] == "user" and m["content"] == "Please count the files."]
    assert len(asked) == 1, history
