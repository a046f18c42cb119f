"""The Matrix adapter against a real homeserver: Synapse from PyPI (its own venv, made by
scripts/interop), on loopback, with two people talking to the agent in a room through the
real `capstan serve`. The bot is invited and joins by itself; a trusted and an untrusted
person write; each is answered in their thread; the bot's access token is in no byte the
host writes."""

import hashlib
import os
import sys
import tempfile
import urllib.parse

import pytest

from conftest import ROOT, Server

# The homeserver and the client calls the demo uses (scripts/demo-matrix): one copy.
sys.path.insert(0, str(ROOT / "scripts"))
from demo_matrix import Synapse, call, until  # noqa: E402

SYNAPSE_PYTHON = os.environ.get("CAPSTAN_SYNAPSE_PYTHON")
ADAPTER = ROOT / "target" / "adapters" / "matrix.wasm"

SCRIPT = '''
[[step]]
process = "channel"
when = "hello from alice"
repeat = true
reply = "Hi alice, noted."

[[step]]
process = "channel"
when = "what time"
repeat = true
reply = "Bob, it is time."
'''


@pytest.fixture
def synapse():
    if not SYNAPSE_PYTHON:
        pytest.fail("CAPSTAN_SYNAPSE_PYTHON is not set: run the interop tests with scripts/interop")
    work = tempfile.TemporaryDirectory(prefix="capstan-synapse-")
    server = Synapse(SYNAPSE_PYTHON, work.name)
    yield server
    server.stop()
    work.cleanup()


def test_two_people_talk_to_the_agent_in_a_synapse_room(synapse):
    assert ADAPTER.is_file(), f"{ADAPTER} is missing: run scripts/setup"
    bot = synapse.register("capstan", "bot-password-1")
    alice = synapse.register("alice", "alice-password-1")
    bob = synapse.register("bob", "bob-password-1")
    hs = synapse.url
    extra = f'''
[secrets.MX]
env = "MATRIX_TOKEN"
hosts = ["{hs}"]
header = "Authorization: Bearer {{MX}}"

[channels.mx]
adapter = "{ADAPTER}"
net = ["{hs}"]
secrets = ["MX"]
conversation = "thread"
allow = ["@alice:localhost", "@bob:localhost"]
trusted = ["@alice:localhost"]
poll_wait_secs = 1

[channels.mx.settings]
homeserver = "{hs}"
user_id = "@capstan:localhost"
join_on_invite = true
'''
    os.environ["MATRIX_TOKEN"] = bot
    try:
        server = Server(tokens=False, extra=extra, script=SCRIPT)
    finally:
        del os.environ["MATRIX_TOKEN"]
    try:
        # The channel has found where "now" is once its cursor is kept.
        cursor = server.base / ".capstan" / "channels" / "mx.cursor"
        until("the first sync", cursor.is_file)

        room = call(hs, "POST", "/_matrix/client/v3/createRoom",
                    {"preset": "private_chat", "invite": ["@bob:localhost", "@capstan:localhost"]},
                    token=alice)["room_id"]
        quoted = urllib.parse.quote(room)
        call(hs, "POST", f"/_matrix/client/v3/rooms/{quoted}/join", {}, token=bob)

        def bot_joined():
            members = call(hs, "GET", f"/_matrix/client/v3/rooms/{quoted}/joined_members",
                           token=alice)["joined"]
            return "@capstan:localhost" in members
        until("the bot joining", bot_joined)

        def say(token, text, thread=None):
            content = {"msgtype": "m.text", "body": text,
                       "m.mentions": {"user_ids": ["@capstan:localhost"]}}
            if thread:
                content["m.relates_to"] = {"rel_type": "m.thread", "event_id": thread}
            txn = hashlib.sha256(f"{token}{text}".encode()).hexdigest()[:16]
            return call(hs, "PUT", f"/_matrix/client/v3/rooms/{quoted}/send/m.room.message/{txn}",
                        content, token=token)["event_id"]

        def bot_said(body):
            messages = call(hs, "GET", f"/_matrix/client/v3/rooms/{quoted}/messages?dir=b&limit=50",
                            token=alice)["chunk"]
            return next((m for m in messages if m["sender"] == "@capstan:localhost"
                         and m["content"].get("body") == body), None)

        root = say(alice, "@capstan:localhost hello from alice")
        answer = until("the answer to alice", lambda: bot_said("Hi alice, noted."))
        assert answer["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == root

        say(bob, "@capstan:localhost what time is it?", thread=root)
        threaded = until("the answer to bob, in the thread", lambda: bot_said("Bob, it is time."))
        assert threaded["content"]["m.relates_to"]["rel_type"] == "m.thread"
        assert threaded["content"]["m.relates_to"]["event_id"] == root

        # Each answered once.
        messages = call(hs, "GET", f"/_matrix/client/v3/rooms/{quoted}/messages?dir=b&limit=50",
                        token=alice)["chunk"]
        from_bot = [m["content"].get("body") for m in messages
                    if m["sender"] == "@capstan:localhost" and m["type"] == "m.room.message"]
        assert sorted(from_bot) == ["Bob, it is time.", "Hi alice, noted."], from_bot
    finally:
        server.process.terminate()
        _, err = server.process.communicate(timeout=60)
        server.dir.cleanup()
    assert bot not in err, "the access token is in the server's standard error"
