"""The real `capstan serve` for one (suite, mode): its config in a temporary directory, the
process, and the one door the runner uses, `POST /v1/channels/NAME/messages` with `wait`."""

import os
import pathlib
import signal
import subprocess
import tempfile
import threading

import httpx

# The provider reads its key from this variable: a real model's key (--model-key-env), or
# nothing the worst-case model reads.
KEY_VARIABLE = "CAPSTAN_AGENTDOJO_MODEL_KEY"


class CapstanError(RuntimeError):
    """`capstan serve` failed: did not start, exited, or answered with an error."""


# Mode off: every flow rule of every kind allows, so labels are kept but nothing is checked.
FLOW_OFF = """
[profiles.channel.flow]
untrusted_write = "allow"
untrusted_send = "allow"
leak = "allow"

[profiles.worker.flow]
untrusted_write = "allow"
untrusted_send = "allow"
leak = "allow"
"""


def config_text(suite: str, model_url: str, mcp_url: str, max_turns: int, conversations: int,
                deadline_secs: int, flow: str = "on", extra: str = "",
                model_name: str = "worst-case", handles: bool = False) -> str:
    """The config of one run. Every key not set here keeps its default (see `capstan init`
    or host/src/config/default.toml): with `flow` "on" the host's default flow rules, with
    "off" rules that allow everything; with `handles`, the worker holds every untrusted
    result back as a handle and may ask about it. `extra` is appended as is, so it may add
    tables and keys, but not set again one of those below (TOML refuses a key defined
    twice)."""
    text = f'''# Written by bench/agentdojo/run.py for the AgentDojo suite `{suite}`.
[agent]
name = "capstan"
workspace = "workspace"
data_dir = "data"
# No plugin: the suite's tools come from its MCP server.
plugins_dir = "plugins"

[limits]
# A worker plays the longest ground truth (user task plus injection task) one call per
# model turn, then set_status.
max_turns = {max_turns}
# A fresh conversation per pair, each kept open for the life of the host.
max_open_conversations = {conversations}
# The MCP server runs in the runner's Python process, beside the model and the checks:
# on a busy machine a call may wait a moment, which must not fail it.
tool_deadline_secs = {deadline_secs}

[serve]
# The runner and its person (approver.py, polling /v1/approvals) are one loopback client.
requests_per_minute = 1000000

[provider]
kind = "openai"
base_url = "{model_url}"
api_key_env = "{KEY_VARIABLE}"
model = "{model_name}"

[mcp.{suite}]
url = "{mcp_url}"

[profiles.channel]
tools = ["reply", "branch", "spawn_worker", "route", "cancel", "skip"]
capabilities = []

[profiles.worker]
tools = ["{suite}.*", "set_status"{', "ask_about"' if handles else ''}]
capabilities = []
'''
    if handles:
        text += "\n[profiles.worker.handles]\nuntrusted = true\n"
    if flow == "off":
        text += FLOW_OFF
    if extra.strip():
        text += "\n# --extra-config\n" + extra.rstrip() + "\n"
    return text


class CapstanServe:
    """A running `capstan serve` on a loopback port the system picks."""

    def __init__(self, binary: pathlib.Path, config: str, label: str, model_key: str = "unused"):
        self.label = label
        self.dir = tempfile.TemporaryDirectory(prefix="capstan-agentdojo-")
        base = pathlib.Path(self.dir.name)
        for sub in ("workspace", "data", "plugins", "state", "cache"):
            (base / sub).mkdir()
        (base / "capstan.toml").write_text(config)
        self.config_path = base / "capstan.toml"
        self.log_path = base / "serve.log"
        env = dict(os.environ)
        env.pop("RUST_BACKTRACE", None)
        env[KEY_VARIABLE] = model_key
        env["CAPSTAN_STATE_DIR"] = str(base / "state")
        env["CAPSTAN_CACHE_DIR"] = str(base / "cache")
        self.log = open(self.log_path, "w")
        try:
            self.process = subprocess.Popen(
                [str(binary), "serve", "--config", str(self.config_path), "--addr", "127.0.0.1:0"],
                cwd=base, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=self.log, text=True,
            )
        except OSError as err:
            raise CapstanError(f"cannot start {binary}: {err}") from err
        first = self.process.stdout.readline()
        prefix = "capstan serve: listening on "
        if not first.startswith(prefix):
            self.process.kill()
            self.process.wait()
            raise CapstanError(f"capstan serve ({label}) did not start: {first.strip()!r}\n{self.log_tail()}")
        self.url = first[len(prefix):].strip().rstrip("/")
        # The rest of standard output goes to the log, read as it comes so the pipe never
        # fills and blocks the server.
        threading.Thread(target=self._drain, daemon=True).start()
        self.client = httpx.Client(base_url=self.url)

    def _drain(self):
        for line in self.process.stdout:
            self.log.write(line)
            self.log.flush()

    def log_tail(self, lines: int = 25) -> str:
        self.log.flush()
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("  | " + line for line in text[-lines:])

    def check_alive(self, what: str, grace: float = 0.0):
        """Raises if the server has exited (waiting up to `grace` seconds for an exit
        that a dropped connection announces)."""
        try:
            code = self.process.wait(timeout=grace) if grace else self.process.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            raise CapstanError(f"capstan serve ({self.label}) exited with status {code} {what}\n{self.log_tail()}")

    def send(self, conversation: str, text: str, timeout: float, pair: str) -> dict:
        """Sends `text` to a new conversation and returns the answer once the work it
        started is over and stored."""
        self.check_alive(f"before {pair}")
        try:
            response = self.client.post(
                f"/v1/channels/{conversation}/messages",
                json={"text": text, "wait": True},
                timeout=httpx.Timeout(timeout, connect=10.0),
            )
        except httpx.TimeoutException as err:
            self.check_alive(f"while answering {pair}")
            raise CapstanError(f"{pair}: no answer from capstan serve ({self.label}) in {timeout:g} s") from err
        except httpx.TransportError as err:
            self.check_alive(f"while answering {pair}", grace=5.0)
            raise CapstanError(f"{pair}: capstan serve ({self.label}) dropped the request: {err}") from err
        if response.status_code not in (200, 202):
            raise CapstanError(f"{pair}: capstan serve ({self.label}) answered {response.status_code}: {response.text[:500]}")
        return response.json()

    def stop(self) -> int:
        """Stops the server gracefully; its exit status."""
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        code = self.process.returncode
        self.log.close()
        return code

    def cleanup(self):
        self.dir.cleanup()
