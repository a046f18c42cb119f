"""The Matrix adapter against a real homeserver: Synapse from PyPI (its own venv, made by
scripts/interop), on loopback, with two people talking to the agent in a room through the
real `capstan serve`. The bot is invited and joins by itself; a trusted and an untrusted
person write; each is answered in their thread; the bot's access token is in no byte the
host writes."""

import hashlib
import hmac
import json
import os
import pathlib
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conftest import ROOT, Server

SYNAPSE_PYTHON = os.environ.get("CAPSTAN_SYNAPSE_PYTHON")
ADAPTER = ROOT / "target" / "adapters" / "matrix.wasm"
SHARED_SECRET = "interop-registration-secret"
# A guard against a hang, never a pace: every wait below is for a condition.
GUARD = 120

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

HOMESERVER = """
server_name: "localhost"
pid_file: {dir}/homeserver.pid
listeners:
  - port: {port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: {dir}/homeserver.db
media_store_path: {dir}/media_store
registration_shared_secret: "{secret}"
report_stats: false
macaroon_secret_key: "interop-macaroon-secret"
form_secret: "interop-form-secret"
signing_key_path: "{dir}/localhost.signing.key"
trusted_key_servers: []
suppress_key_server_warning: true
rc_message: {{per_second: 1000, burst_count: 1000}}
rc_login:
  address: {{per_second: 1000, burst_count: 1000}}
  account: {{per_second: 1000, burst_count: 1000}}
  failed_attempts: {{per_second: 1000, burst_count: 1000}}
rc_joins:
  local: {{per_second: 1000, burst_count: 1000}}
rc_invites:
  per_room: {{per_second: 1000, burst_count: 1000}}
  per_user: {{per_second: 1000, burst_count: 1000}}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None, token=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


def until(what, check):
    """Waits for `check()` to be true (or to return a value), failing after GUARD."""
    deadline = time.monotonic() + GUARD
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {GUARD} s")


class Synapse:
    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="capstan-synapse-")
        base = pathlib.Path(self.dir.name)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = base / "homeserver.yaml"
        config.write_text(HOMESERVER.format(dir=base, port=self.port, secret=SHARED_SECRET))
        subprocess.run([SYNAPSE_PYTHON, "-m", "synapse.app.homeserver", "-c", str(config),
                        "--generate-keys"], check=True, capture_output=True, cwd=base)
        self.log = open(base / "synapse.log", "w")
        self.process = subprocess.Popen(
            [SYNAPSE_PYTHON, "-m", "synapse.app.homeserver", "-c", str(config)],
            cwd=base, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def up():
            if self.process.poll() is not None:
                raise AssertionError((base / "synapse.log").read_text())
            try:
                return call(self.url, "GET", "/_matrix/client/versions")
            except (urllib.error.URLError, ConnectionError):
                return None
        until("Synapse answering", up)

    def register(self, user, password):
        """A user made with the shared secret (the admin API), then logged in: a token."""
        nonce = call(self.url, "GET", "/_synapse/admin/v1/register")["nonce"]
        mac = hmac.new(SHARED_SECRET.encode(), digestmod=hashlib.sha1)
        mac.update(f"{nonce}\0{user}\0{password}\0notadmin".encode())
        call(self.url, "POST", "/_synapse/admin/v1/register", {
            "nonce": nonce, "username": user, "password": password, "admin": False,
            "mac": mac.hexdigest()})
        login = call(self.url, "POST", "/_matrix/client/v3/login", {
            "type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
            "password": password})
        return login["access_token"]

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()
        self.dir.cleanup()


@pytest.fixture
def synapse():
    if not SYNAPSE_PYTHON:
        pytest.fail("CAPSTAN_SYNAPSE_PYTHON is not set: run the interop tests with scripts/interop")
    server = Synapse()
    yield server
    server.stop()


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
