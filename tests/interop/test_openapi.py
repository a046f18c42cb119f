"""The service's OpenAPI document, checked by validators nobody here wrote: the document
against the OpenAPI 3.1 specification (openapi-spec-validator), and what every JSON route
really answers against the schema the document gives it (jsonschema, JSON Schema 2020-12)."""

import json
import urllib.error
import urllib.request

import jsonschema
from openapi_spec_validator import validate as validate_spec

import pytest

from conftest import TOKEN, WORKER_REPLY, Server


def fetch(url, method="GET", body=None, token=None):
    """(status, JSON body) of one request."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def conforms(document, schema, instance):
    """Raises if `instance` does not match `schema`, a schema of `document`."""
    rooted = dict(schema, components=document["components"])
    jsonschema.Draft202012Validator(rooted).validate(instance)


def json_schema(document, path, method, status):
    content = document["paths"][path][method]["responses"][str(status)].get("content", {})
    return content.get("application/json", {}).get("schema")


def say(server, text, conversation="main"):
    status, body = fetch(f"{server.url}/v1/channels/{conversation}/messages", "POST",
                         {"text": text, "wait": True})
    assert status == 200, body
    return body


def test_the_served_document_is_valid_openapi_3_1(server):
    status, document = fetch(server.url + "/v1/openapi.json")
    assert status == 200
    assert document["openapi"].startswith("3.1")
    validate_spec(document)


# A worker that may post, and waits a second for an approval no one gives: its parked
# calls are withdrawn and it goes on.
PATIENT_WORKER = """
[limits]
approval_wait_secs = 1

[profiles.worker]
tools = ["file_read", "file_list", "task_create", "http_request", "set_status"]
capabilities = ["fs.read", "tasks.write"]
net = ["http://127.0.0.1:9"]
"""


@pytest.fixture
def stateful_server():
    running = Server(tokens=False, extra=PATIENT_WORKER)
    yield running
    running.stop()


def test_every_json_route_answers_as_its_schema_says(stateful_server):
    server = stateful_server
    _, document = fetch(server.url + "/v1/openapi.json")
    # State for every list to hold rows: a worker that ran a tool, a task it put on the
    # board, a denial in the audit log, calls parked for approval.
    assert say(server, "Please count the files.")["reply"] == WORKER_REPLY
    assert say(server, "Please put a task on the board.")["reply"] == "A task is on the board."
    assert say(server, "Please read it yourself.", "denied")["reply"] == "I may not read files."
    say(server, "Please read the page and post its summary.", "page")
    _, listed = fetch(server.url + "/v1/approvals?all=true")
    assert listed["approvals"], "no approval row was checked"
    approval = str(listed["approvals"][0]["id"])

    answers = {}
    for path, item in document["paths"].items():
        schema = json_schema(document, path, "get", 200) if "get" in item else None
        if schema is None:
            continue  # the event stream is not JSON
        status, body = fetch(server.url + path.replace("{name}", "main").replace("{id}", approval))
        assert status == 200, (path, body)
        conforms(document, schema, body)
        answers[path] = body

    assert answers["/v1/workers"]["workers"], "no worker row was checked"
    assert answers["/v1/tasks"]["tasks"], "no task row was checked"
    assert [e for e in answers["/v1/audit"]["entries"] if e["outcome"] == "denied"]
    assert answers["/v1/channels/{name}/history"]["messages"]
    # The worker's calls are the conversation's cost; the total is its rows'.
    costs = answers["/v1/audit/costs"]
    assert "channel:main" in [row["key"] for row in costs["rows"]], costs
    assert costs["total"]["calls"] == sum(row["calls"] for row in costs["rows"]) > 0
    for path in ["/v1/channels", "/v1/channels/{name}/history", "/v1/workers", "/v1/tasks",
                 "/v1/policy", "/v1/audit", "/v1/audit/costs", "/v1/plugins", "/v1/tools", "/v1/models",
                 "/v1/approvals", "/v1/approvals/{id}"]:
        assert path in answers, f"{path} is not in the document as a JSON GET"

    # The answers of POST routes, and refusals: a decision on a withdrawn call.
    status, body = fetch(server.url + f"/v1/approvals/{approval}/deny", "POST", {})
    assert status == 409, body
    conforms(document, json_schema(document, "/v1/approvals/{id}/deny", "post", 409), body)
    status, body = fetch(server.url + "/v1/channels/main/messages", "POST",
                         {"text": "hello", "wait": True})
    conforms(document, json_schema(document, "/v1/channels/{name}/messages", "post", 200), body)
    status, body = fetch(server.url + "/v1/chat/completions", "POST",
                         {"model": "capstan", "messages": [{"role": "user", "content": "hello"}]})
    assert status == 200
    conforms(document, json_schema(document, "/v1/chat/completions", "post", 200), body)
    status, body = fetch(server.url + "/v1/chat/completions", "POST",
                         {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]})
    assert status == 404
    conforms(document, json_schema(document, "/v1/chat/completions", "post", 404), body)


def test_a_refused_token_answers_as_the_document_says(server_with_token):
    _, document = fetch(server_with_token.url + "/v1/openapi.json", token=TOKEN)
    status, body = fetch(server_with_token.url + "/v1/workers")
    assert status == 401
    conforms(document, json_schema(document, "/v1/workers", "get", 401), body)
    assert TOKEN not in json.dumps(body)
