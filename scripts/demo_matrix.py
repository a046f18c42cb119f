"""The agent answering in a Matrix room, on this machine: a Synapse homeserver on loopback,
a person (alice) and the bot registered on it, `capstan serve` with the Matrix adapter and
the demo's scripted model, and alice asking in a room. Prints the room as alice sees it.

Run by scripts/demo-matrix, which builds everything and passes the paths:
    demo_matrix.py SYNAPSE_PYTHON CAPSTAN_BINARY ADAPTER PLUGINS_DIR DEMO_DIR
Uses the standard library only."""

import hashlib
import hmac
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

SECRET = "capstan-registration-secret"

HOMESERVER = """server_name: "localhost"
pid_file: {dir}/homeserver.pid
listeners:
  - port: {port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    resources:
      - names: [client]
database:
  name: sqlite3
  args:
    database: {dir}/homeserver.db
media_store_path: {dir}/media
registration_shared_secret: "{secret}"
report_stats: false
macaroon_secret_key: "capstan-macaroon"
form_secret: "capstan-form"
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
BOT = "@capstan:localhost"


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


def until(what, check, limit=120):
    """Waits for `check()` to be true (or to return a value), failing after `limit` s: a
    guard against a hang, never a pace."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not happen within {limit} s")


def demo_agent(work, demo, channels):
    """The demo's agent directory under `work`: the demo's notes in its workspace, and a
    config with the demo's scripted model and `channels` (TOML) after it."""
    agent = pathlib.Path(work) / "agent"
    (agent / "workspace" / "notes").mkdir(parents=True)
    for note in pathlib.Path(demo, "notes").iterdir():
        (agent / "workspace" / "notes" / note.name).write_bytes(note.read_bytes())
    (agent / "capstan.toml").write_text(
        f'[provider]\nkind = "scripted"\nscript = "{pathlib.Path(demo, "script.toml")}"\n\n'
        + channels)
    return agent


def start_serve(binary, agent, plugins, env, channel):
    """`capstan serve` in `agent` with `env` added, its log in serve.log; returns once
    channel `channel` has kept its first cursor (it reached its platform)."""
    print(f"==> capstan serve with [channels.{channel}] (in {agent})", file=sys.stderr)
    serve = subprocess.Popen(
        [binary, "serve", "--config", str(agent / "capstan.toml"), "--addr", "127.0.0.1:0",
         "--plugins-dir", plugins],
        cwd=agent, env={**os.environ, **env, "CAPSTAN_STATE_DIR": str(agent / "state")},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(agent / "serve.log", "w"),
        text=True)
    print("   " + serve.stdout.readline().strip(), file=sys.stderr)
    until(f"the channel {channel} reaching its platform",
          (agent / ".capstan" / "channels" / f"{channel}.cursor").is_file)
    return serve


class Synapse:
    """A Synapse homeserver on a free loopback port, in `work`, with registration by the
    shared secret; the tests use it too (tests/interop/test_matrix_synapse.py)."""

    def __init__(self, python, work):
        self.dir = pathlib.Path(work)
        self.dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = self.dir / "homeserver.yaml"
        config.write_text(HOMESERVER.format(dir=self.dir, port=port, secret=SECRET))
        subprocess.run([python, "-m", "synapse.app.homeserver", "-c", str(config),
                        "--generate-keys"], check=True, capture_output=True, cwd=self.dir)
        self.log = open(self.dir / "log", "w")
        self.process = subprocess.Popen(
            [python, "-m", "synapse.app.homeserver", "-c", str(config)], cwd=self.dir,
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def up():
            if self.process.poll() is not None:
                raise RuntimeError((self.dir / "log").read_text())
            try:
                return call(self.url, "GET", "/_matrix/client/versions")
            except (urllib.error.URLError, ConnectionError):
                return None
        until("Synapse answering", up)

    def register(self, user, password):
        """A user made with the shared secret (the admin API), then logged in: a token."""
        base = self.url
        nonce = call(base, "GET", "/_synapse/admin/v1/register")["nonce"]
        mac = hmac.new(SECRET.encode(), digestmod=hashlib.sha1)
        mac.update(f"{nonce}\0{user}\0{password}\0notadmin".encode())
        call(base, "POST", "/_synapse/admin/v1/register", {
            "nonce": nonce, "username": user, "password": password, "admin": False,
            "mac": mac.hexdigest()})
        return call(base, "POST", "/_matrix/client/v3/login", {
            "type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
            "password": password})["access_token"]

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()


def main():
    synapse_python, binary, adapter, plugins, demo = (
        os.path.abspath(arg) for arg in sys.argv[1:6])
    work = pathlib.Path(tempfile.mkdtemp(prefix="capstan-matrix-demo-"))
    print("==> starting Synapse", file=sys.stderr)
    synapse = Synapse(synapse_python, work / "synapse")
    hs = synapse.url
    print(f"    on {hs} (in {work}/synapse)", file=sys.stderr)
    serve = None
    try:
        bot = synapse.register("capstan", "demo-bot-password")
        alice = synapse.register("alice", "demo-alice-password")

        agent = demo_agent(work, demo, f"""[secrets.MATRIX_TOKEN]
env = "MATRIX_TOKEN"
hosts = ["{hs}"]
header = "Authorization: Bearer {{MATRIX_TOKEN}}"

[channels.matrix]
adapter = "{adapter}"
net = ["{hs}"]
secrets = ["MATRIX_TOKEN"]
allow = ["@alice:localhost"]
trusted = ["@alice:localhost"]
poll_wait_secs = 1

[channels.matrix.settings]
homeserver = "{hs}"
user_id = "{BOT}"
join_on_invite = true
""")
        serve = start_serve(binary, agent, plugins, {"MATRIX_TOKEN": bot}, "matrix")

        room = call(hs, "POST", "/_matrix/client/v3/createRoom",
                    {"name": "notes", "preset": "private_chat", "invite": [BOT]}, token=alice)["room_id"]
        quoted = urllib.parse.quote(room)
        until("the bot joining the room", lambda: BOT in call(
            hs, "GET", f"/_matrix/client/v3/rooms/{quoted}/joined_members", token=alice)["joined"])

        def say(text):
            call(hs, "PUT", f"/_matrix/client/v3/rooms/{quoted}/send/m.room.message/{time.time_ns()}",
                 {"msgtype": "m.text", "body": f"{BOT} {text}",
                  "m.mentions": {"user_ids": [BOT]}}, token=alice)

        def room_text():
            chunk = call(hs, "GET", f"/_matrix/client/v3/rooms/{quoted}/messages?dir=f&limit=100",
                         token=alice)["chunk"]
            return [(m["sender"], m["content"]["body"]) for m in chunk
                    if m["type"] == "m.room.message"]

        say("What are the open items in my notes?")
        until("the worker's report in the room",
              lambda: any("3 open items" in body for _, body in room_text()))
        print("\n==> the room, as alice sees it in her Matrix client:\n")
        for sender, body in room_text():
            print(f"{sender}:")
            for line in body.splitlines():
                print(f"    {line}")
    finally:
        if serve:
            serve.terminate()
            serve.wait(timeout=60)
        synapse.stop()


if __name__ == "__main__":
    main()
