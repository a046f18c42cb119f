"""`GET /metrics` of `capstan serve`, read by the Prometheus project's own parser
(`prometheus_client` from PyPI): refused without the token, then the counters of a worker's
call, a denial and the model's requests, each histogram's buckets in order, and no token
value anywhere in the text."""

import urllib.error
import urllib.request

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from conftest import TOKEN, Server


def get(url, token=None):
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers.get("Content-Type"), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type"), err.read().decode()


def say(server, text, conversation="main"):
    data = ('{"text": "%s", "wait": true}' % text).encode()
    request = urllib.request.Request(f"{server.url}/v1/channels/{conversation}/messages", data=data,
                                     method="POST", headers={"Content-Type": "application/json",
                                                             "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200


@pytest.fixture
def server():
    running = Server(tokens=True)
    yield running
    running.stop()


def samples(text):
    """Every sample, as (name, labels, value)."""
    return [(s.name, s.labels, s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]


def value(found, name, **labels):
    matching = [v for n, l, v in found if n == name and all(l.get(k) == w for k, w in labels.items())]
    assert matching, f"no sample {name}{labels}"
    return sum(matching)


def test_metrics_count_turns_calls_denials_and_model_requests(server):
    status, _, body = get(server.url + "/metrics")
    assert status == 401, body
    assert TOKEN not in body

    say(server, "Please count the files.")
    say(server, "Please read it yourself.", "denied")

    status, content_type, text = get(server.url + "/metrics", TOKEN)
    assert status == 200, text
    assert content_type.startswith("application/openmetrics-text"), content_type
    assert TOKEN not in text
    found = samples(text)
    # Two user turns on channels, and the worker's.
    assert value(found, "capstan_turns_total", kind="channel") >= 2
    assert value(found, "capstan_turns_total", kind="worker") >= 1
    assert value(found, "capstan_tool_calls_total", tool="file_list", outcome="ok") == 1
    assert value(found, "capstan_tool_calls_total", tool="file_read", outcome="denied") == 1
    assert value(found, "capstan_tool_denials_total", reason="policy") == 1
    assert value(found, "capstan_model_requests_total", outcome="ok") >= 4
    assert value(found, "capstan_model_request_seconds_count") == value(
        found, "capstan_model_requests_total", outcome="ok")
    # The worker's call is in its histogram: one observation, its buckets cumulative.
    buckets = [(float(l["le"]), v) for n, l, v in found
               if n == "capstan_tool_call_seconds_bucket" and l.get("tool") == "file_list"]
    assert buckets and buckets[-1] == (float("inf"), 1), buckets
    counts = [v for _, v in sorted(buckets)]
    assert counts == sorted(counts), buckets
    assert value(found, "capstan_live_workers") == 0
    assert value(found, "capstan_calls_waiting") == 0
