"""Plugins in Python, JavaScript and Rust, each from `capstan plugins new --lang ...`, built
from source with its language's standard toolchain (componentize-py from PyPI,
ComponentizeJS from npm, cargo with the wasm32-wasip2 toolchain scripts/setup found),
then loaded by the real `capstan` binary.

The Python and JavaScript projects get a second tool appended, as an author would write
it: one that declares only `fs.read` and tries to write. A scripted agent turn has a
worker call both; the read works through the read-only grant, the write is refused by the
sandbox, and the audit log shows each call.

Each project also gets probe tools that call every host import (tasks, memory, secrets) and
make HTTP requests to a loopback server, each success and each error checked exactly in
every language: a host import's refusal becomes the matching tool error with the host's
message, an uncaught exception `failed`, a request outside the grant `denied` with the
host's reason, and a call with no network grant `denied` before anything is sent. Every
project is built with `capstan plugins build`, and each step of the author's path
(scaffold, build, first load, call) is timed into target/author-path.json."""

import contextlib
import http.server
import json
import os
import pathlib
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import BINARY, PLUGINS, ROOT

NOTES = "one two two\nthree three three\n"

# What each language's author appends: a tool that declares fs.read and writes anyway.
PYTHON_WRITER = '''

@toolbox.tool(needs=["fs.read"])
def {name}_save(path: str, text: str) -> str:
    """Saves text to a workspace file."""
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)
    return f"saved {{path}}"


Tool = toolbox.export()
'''

JS_WRITER = '''
import {{ writeText }} from './capstan.js';

toolbox.tool(
  {{ name: '{name}_save', description: 'Saves text to a workspace file.', needs: ['fs.read'],
    args: {{ path: {{ type: 'string' }}, text: {{ type: 'string' }} }} }},
  ({{ path, text }}) => {{ writeText(path, text); return `saved ${{path}}`; }},
);

export const tool = toolbox.export();
'''


# What each language's author appends: probe tools calling one host import (or making one
# request) per `op`, each answering {"value": ...}. NAME is the plugin's name. `_host` holds
# tasks.write and memory.write, `_bare` only fs.read, `_net` a loopback rule.
PYTHON_PROBE = """

from componentize_py_types import Err
from capstan_sdk import http, host_error
from wit_world.imports import memory, secrets, tasks


def NAME_probe(op: str, arg: str = "") -> dict:
    \"\"\"Calls one host import.\"\"\"
    if op == "task_create":
        value = str(tasks.create(tasks.NewTask(title=arg, description="", priority=None, parent=None, metadata=None)).number)
    elif op == "task_get":
        value = tasks.get(int(arg)).title
    elif op == "task_update":
        value = tasks.update(int(arg), tasks.TaskPatch(title=None, description=None, status=tasks.TaskStatus.DONE, priority=None, metadata=None)).status.name
    elif op == "task_list":
        value = [t.title for t in tasks.list(tasks.TaskFilter(status=tasks.TaskStatus.BACKLOG, limit=10))]
    elif op == "memory_save":
        value = memory.save(memory.NewMemory(kind="fact", content=arg, importance=None)).id
    elif op == "memory_recall":
        value = [m.content for m in memory.recall(arg, 5)]
    elif op == "memory_delete":
        memory.delete(arg)
        value = "deleted"
    elif op == "working_set":
        memory.working_set("k", arg, None)
        value = "set"
    elif op == "hmac":
        value = len(secrets.hmac_sha256(arg, b"data"))
    elif op == "caught":
        try:
            tasks.get(int(arg))
            value = "found"
        except Err as err:
            problem = host_error(err)
            value = f"{problem.kind}: {problem.message}"
    elif op == "fetch":
        response = http.get(arg)
        value = {"status": response.status, "body": response.text(), "type": response.headers.get("content-type")}
    elif op == "post":
        response = http.post(arg, json={"hello": "world"})
        value = {"status": response.status, "body": response.text()}
    elif op == "boom":
        raise ValueError(f"boom: {arg}")
    else:
        raise ToolError.invalid_args(f"unknown op {op}")
    return {"value": value}


toolbox.tool(name="NAME_host", needs=["tasks.write", "memory.write"])(NAME_probe)
toolbox.tool(name="NAME_bare", needs=["fs.read"])(NAME_probe)
toolbox.tool(name="NAME_net", needs=["net:http://127.0.0.1:*"])(NAME_probe)

Tool = toolbox.export()
"""

JS_PROBE = """
import { http, hostError } from './capstan.js';
import * as tasks from 'capstan:plugin/tasks@0.2.1';
import * as memory from 'capstan:plugin/memory@0.2.1';
import * as secrets from 'capstan:plugin/secrets@0.2.1';

function probe({ op, arg = '' }) {
  let value;
  switch (op) {
    case 'task_create': value = String(tasks.create({ title: arg, description: '' }).number); break;
    case 'task_get': value = tasks.get(BigInt(arg)).title; break;
    case 'task_update': value = tasks.update(BigInt(arg), { status: 'done' }).status; break;
    case 'task_list': value = tasks.list({ status: 'backlog', limit: 10 }).map((t) => t.title); break;
    case 'memory_save': value = memory.save({ kind: 'fact', content: arg }).id; break;
    case 'memory_recall': value = memory.recall(arg, 5).map((m) => m.content); break;
    case 'memory_delete': memory.delete(arg); value = 'deleted'; break;
    case 'working_set': memory.workingSet('k', arg, undefined); value = 'set'; break;
    case 'hmac': value = secrets.hmacSha256(arg, new TextEncoder().encode('data')).length; break;
    case 'caught':
      try { tasks.get(BigInt(arg)); value = 'found'; } catch (err) { const problem = hostError(err); value = `${problem.kind}: ${problem.message}`; }
      break;
    case 'fetch': { const r = http.get(arg); value = { status: r.status, body: r.text(), type: r.headers['content-type'] ?? null }; break; }
    case 'post': { const r = http.post(arg, { json: { hello: 'world' } }); value = { status: r.status, body: r.text() }; break; }
    case 'boom': throw new Error(`boom: ${arg}`);
    default: throw ToolError.invalidArgs(`unknown op ${op}`);
  }
  return { value };
}

const probeArgs = { op: { type: 'string' }, arg: { type: 'string', optional: true } };
toolbox.tool({ name: 'NAME_host', description: 'Calls one host import.', needs: ['tasks.write', 'memory.write'], args: probeArgs }, probe);
toolbox.tool({ name: 'NAME_bare', description: 'Calls one host import.', needs: ['fs.read'], args: probeArgs }, probe);
toolbox.tool({ name: 'NAME_net', description: 'Calls one host import.', needs: ['net:http://127.0.0.1:*'], args: probeArgs }, probe);

export const tool = toolbox.export();
"""

# What each language's author appends to see its instance kept: `_tally` reads a workspace
# file through the SDK's helper and counts its calls in module state; `_hold` keeps a file
# open past its call; `_fail` counts too, then answers with a tool error; `_bloat` asks for
# more memory than the limit. Kept mode shows in the count: it goes on while the instance is kept and starts
# again at 1 in a fresh one.
PYTHON_KEPT = """

_calls = 0
_held = []


@toolbox.tool(name="NAME_tally", needs=["fs.read"])
def NAME_tally(step: str) -> str:
    \"\"\"Counts this instance's calls.\"\"\"
    global _calls
    with open("notes.txt", encoding="utf-8") as file:
        file.read()
    _calls += 1
    return f"{step}: tally {_calls}"


@toolbox.tool(name="NAME_hold", needs=["fs.read"])
def NAME_hold() -> str:
    \"\"\"Keeps a workspace file open after the call.\"\"\"
    _held.append(open("notes.txt", encoding="utf-8"))
    return "holding notes.txt"


@toolbox.tool(name="NAME_fail", needs=["fs.read"])
def NAME_fail() -> str:
    \"\"\"Counts this instance's calls, then answers with a tool error.\"\"\"
    global _calls
    _calls += 1
    raise ToolError.failed("failing on purpose")


@toolbox.tool(name="NAME_bloat", needs=["fs.read"])
def NAME_bloat() -> str:
    \"\"\"Asks for more memory than a call may have.\"\"\"
    _held.append(bytearray(256 << 20))
    return "bloated"


Tool = toolbox.export()
"""

JS_KEPT = """
import { readText as keptRead } from './capstan.js';
import { getDirectories as keptDirs } from 'wasi:filesystem/preopens@0.2.12';

let calls = 0;
const held = [];

toolbox.tool(
  { name: 'NAME_tally', description: 'Counts the calls of this instance.', needs: ['fs.read'], args: { step: { type: 'string' } } },
  ({ step }) => { keptRead('notes.txt'); calls += 1; return `${step}: tally ${calls}`; },
);
toolbox.tool(
  { name: 'NAME_hold', description: 'Keeps a workspace file open after the call.', needs: ['fs.read'], args: {} },
  () => {
    const [[dir]] = keptDirs().filter(([, path]) => path === '.');
    held.push(dir.openAt({ symlinkFollow: false }, 'notes.txt', {}, { read: true }));
    return 'holding notes.txt';
  },
);
toolbox.tool(
  { name: 'NAME_fail', description: 'Counts the calls of this instance, then answers with a tool error.', needs: ['fs.read'], args: {} },
  () => { calls += 1; throw ToolError.failed('failing on purpose'); },
);
toolbox.tool(
  { name: 'NAME_bloat', description: 'Asks for more memory than a call may have.', needs: ['fs.read'], args: {} },
  () => { held.push(new Uint8Array(256 << 20)); return 'bloated'; },
);

export const tool = toolbox.export();
"""

# A worker calls `_tally` between the others: each answer names the step that asked, so a
# count that went wrong leaves the script with no step to match and the turn fails. The
# first call answers with a tool error before any file is read, and the count goes on
# after it (an answer, not a failure; and the workspace a later call reads was held from
# the first); it starts again after a file held and after a refused memory growth.
KEPT_SCRIPT = """
[[step]]
process = "channel"
when = "tally with {name}"
tool_calls = [
  {{ name = "spawn_worker", arguments = {{ task = "Tally using {name}." }} }},
  {{ name = "skip" }},
]

[[step]]
process = "worker"
when = "using {name}"
tool_calls = [{{ name = "{name}_fail", arguments = {{}} }}]

[[step]]
process = "worker"
when = "failing on purpose"
tool_calls = [{{ name = "{name}_tally", arguments = {{ step = "first" }} }}]

[[step]]
process = "worker"
when = "first: tally 2"
tool_calls = [{{ name = "{name}_tally", arguments = {{ step = "second" }} }}]

[[step]]
process = "worker"
when = "second: tally 3"
tool_calls = [{{ name = "{name}_hold", arguments = {{}} }}]

[[step]]
process = "worker"
when = "holding notes.txt"
tool_calls = [{{ name = "{name}_tally", arguments = {{ step = "third" }} }}]

[[step]]
process = "worker"
when = "third: tally 1"
tool_calls = [{{ name = "{name}_tally", arguments = {{ step = "fourth" }} }}]

[[step]]
process = "worker"
when = "fourth: tally 2"
tool_calls = [{{ name = "{name}_bloat", arguments = {{}} }}]

[[step]]
process = "worker"
when = "memory"
tool_calls = [{{ name = "{name}_tally", arguments = {{ step = "fifth" }} }}]

[[step]]
process = "worker"
when = "fifth: tally 1"
tool_calls = [{{ name = "set_status", arguments = {{ state = "done", message = "{name} kept, then dropped twice" }} }}]

[[step]]
process = "channel"
when = "{name} kept, then dropped twice"
reply = "{name}: kept and dropped as it should be."
"""


RUST_PROBE = """
use capstan_sdk::host::{self, NewMemory, NewTask, TaskFilter, TaskPatch, TaskStatus};
use capstan_sdk::http::Request;
use serde_json::{Value, json};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Probe {
    op: String,
    #[serde(default)]
    arg: String,
}

fn probe(args: Probe, _ctx: &Context) -> Result<Json<Value>, ToolError> {
    let arg = args.arg;
    let number = || arg.parse::<u64>().map_err(|e| ToolError::invalid_args(e.to_string()));
    let value = match args.op.as_str() {
        "task_create" => json!(host::tasks::create(&NewTask { title: arg.clone(), description: String::new(), priority: None, parent: None, metadata: None })?.number.to_string()),
        "task_get" => json!(host::tasks::get(number()?)?.title),
        "task_update" => json!(host::tasks::update(number()?, &TaskPatch { title: None, description: None, status: Some(TaskStatus::Done), priority: None, metadata: None })?.status.to_string()),
        "task_list" => json!(host::tasks::list(&TaskFilter { status: Some(TaskStatus::Backlog), limit: Some(10) })?.into_iter().map(|t| t.title).collect::<Vec<_>>()),
        "memory_save" => json!(host::memory::save(&NewMemory { kind: "fact".into(), content: arg.clone(), importance: None })?.id),
        "memory_recall" => json!(host::memory::recall(&arg, 5)?.into_iter().map(|m| m.content).collect::<Vec<_>>()),
        "memory_delete" => { host::memory::delete(&arg)?; json!("deleted") }
        "working_set" => { host::memory::working_set("k", &arg, None)?; json!("set") }
        "hmac" => json!(host::secrets::hmac_sha256(&arg, b"data")?.len()),
        "caught" => match host::tasks::get(number()?) {
            Ok(_) => json!("found"),
            Err(host::HostError::NotFound(message)) => json!(format!("not-found: {message}")),
            Err(other) => return Err(other.into()),
        },
        "fetch" => {
            let r = Request::get(&arg).send()?;
            json!({"status": r.status, "body": r.text(), "type": r.header("content-type")})
        }
        "post" => {
            let r = Request::post(&arg).header("content-type", "application/json").body(r#"{"hello":"world"}"#).send()?;
            json!({"status": r.status, "body": r.text()})
        }
        "boom" => panic!("boom: {arg}"),
        other => return Err(ToolError::invalid_args(format!("unknown op {other}"))),
    };
    Ok(Json(json!({ "value": value })))
}

fn with_probes() -> Toolbox {
    let net: Capability = "net:http://127.0.0.1:*".parse().unwrap();
    toolbox()
        .tool(Tool::new("NAME_host", "Calls one host import.", probe).needs(Capability::TasksWrite).needs(Capability::MemoryWrite))
        .tool(Tool::new("NAME_bare", "Calls one host import.", probe).needs(Capability::FsRead))
        .tool(Tool::new("NAME_net", "Calls one host import.", probe).needs(net))
}

capstan_sdk::export_plugin!(with_probes);
"""

SCRIPT = """
[[step]]
process = "channel"
when = "count the words with {name}"
repeat = true
tool_calls = [
  {{ name = "spawn_worker", arguments = {{ task = "Count the words of notes.txt using {name}." }} }},
  {{ name = "skip" }},
]

[[step]]
process = "worker"
when = "using {name}"
repeat = true
tool_calls = [{{ name = "{name}", arguments = {{ path = "notes.txt", top = {top} }} }}]

[[step]]
process = "worker"
when = "{word}"
repeat = true
tool_calls = [{{ name = "{name}_save", arguments = {{ path = "count-{name}.txt", text = "6 words" }} }}]

[[step]]
process = "worker"
when = "count-{name}.txt"
repeat = true
tool_calls = [{{ name = "set_status", arguments = {{ state = "done", message = "{name} counted; saving was refused" }} }}]

[[step]]
process = "channel"
when = "{name} counted"
repeat = true
reply = "{name}: counted, and the write was refused."
"""


def run(args, cwd, env=None, timeout=900):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


# Seconds each step of the author's path took, per language: filled by `built`, written to
# target/author-path.json, and reported in BENCHMARKS.md.
TIMINGS: dict[str, dict[str, float]] = {}


def timed(lang, step, args, cwd, env=None):
    started = time.monotonic()
    result = run(args, cwd, env)
    TIMINGS.setdefault(lang, {})[step] = round(time.monotonic() - started, 2)
    return result


def new_project(lang, name, base):
    project = base / name
    out = timed(lang, "scaffold", [str(BINARY), "plugins", "new", "--lang", lang, name, "--dir", str(project)], base)
    assert f"wrote the {name} plugin" in out.stdout
    assert f"capstan plugins build {project}" in out.stdout, out.stdout
    assert (project / "BINDINGS.md").is_file()
    return project


def append_tools(path, *texts, export, last):
    """Appends `texts` after the template's own code, every export line (starting with
    `export`) dropped and `last` written at the end, once."""
    kept = [
        line
        for text in (path.read_text(), *texts)
        for line in text.splitlines()
        if not line.startswith(export)
    ]
    path.write_text("\n".join(kept) + f"\n\n{last}\n")


def build_env():
    # The setup's target dir for Rust: std for wasm32-wasip2 is built there already.
    return {**os.environ, "CARGO_TARGET_DIR": str(ROOT / "target" / "wasm")}


@pytest.fixture(scope="module")
def built():
    """The three projects, built with `capstan plugins build`: name -> component file.
    The Python one is first built for an older contract, refused with the fix, then
    brought up to date with `--update-wit`."""
    with tempfile.TemporaryDirectory(prefix="capstan-langs-") as tmp:
        base = pathlib.Path(tmp)
        components = {}

        project = new_project("python", "pywords", base)
        append_tools(project / "app.py", PYTHON_WRITER.format(name="pywords"), PYTHON_PROBE.replace("NAME", "pywords"), PYTHON_KEPT.replace("NAME", "pywords"), export="Tool = ", last="Tool = toolbox.export()")
        wit = project / "wit" / "plugin.wit"
        wit.write_text(wit.read_text().replace("package capstan:plugin@0.2.1;", "package capstan:plugin@0.1.0;"))
        build = timed("python", "build", [str(BINARY), "plugins", "build", str(project)], base, build_env())
        assert "==> building the Python plugin `pywords`" in build.stderr and "built " in build.stderr, build.stderr
        inspect = [str(BINARY), "plugins", "inspect", str(project / "pywords.wasm")]
        env = {**os.environ, "CAPSTAN_CACHE_DIR": str(ROOT / "target" / "test-component-cache")}
        refused = subprocess.run(inspect, capture_output=True, text=True, timeout=600, env=env)
        assert refused.returncode == 1, refused.stderr
        assert "built for capstan:plugin@0.1.0, but this host speaks capstan:plugin@0.2.1" in refused.stderr, refused.stderr
        assert "`capstan plugins build DIR --update-wit`" in refused.stderr, refused.stderr
        timed("python", "rebuild", [str(BINARY), "plugins", "build", "--update-wit", str(project)], base, build_env())
        assert "package capstan:plugin@0.2.1;" in wit.read_text()
        components["pywords"] = project / "pywords.wasm"

        project = new_project("js", "jswords", base)
        append_tools(project / "plugin.js", JS_WRITER.format(name="jswords"), JS_PROBE.replace("NAME", "jswords"), JS_KEPT.replace("NAME", "jswords"), export="export const tool =", last="export const tool = toolbox.export();")
        build = timed("js", "build", [str(BINARY), "plugins", "build", str(project)], base, build_env())
        assert "==> building the JavaScript plugin `jswords`" in build.stderr, build.stderr
        timed("js", "rebuild", [str(BINARY), "plugins", "build", str(project)], base, build_env())
        components["jswords"] = project / "jswords.wasm"

        project = new_project("rust", "rswords", base)
        manifest = project / "Cargo.toml"
        manifest.write_text(manifest.read_text().replace("[dependencies]\n", '[dependencies]\nserde_json = "1"\n'))
        append_tools(project / "src" / "lib.rs", RUST_PROBE.replace("NAME", "rswords"), export="capstan_sdk::export_plugin!", last="capstan_sdk::export_plugin!(with_probes);")
        build = timed("rust", "build", [str(BINARY), "plugins", "build", str(project)], base, build_env())
        assert "==> building the Rust plugin `rswords`" in build.stderr, build.stderr
        lib = project / "src" / "lib.rs"
        lib.write_text(lib.read_text() + "\n")
        timed("rust", "rebuild", [str(BINARY), "plugins", "build", str(project)], base, build_env())
        components["rswords"] = project / "rswords.wasm"

        for component in components.values():
            assert component.is_file(), component
        yield components


@pytest.fixture(scope="module")
def home(built):
    with tempfile.TemporaryDirectory(prefix="capstan-langs-home-") as tmp:
        base = pathlib.Path(tmp)
        (base / "workspace").mkdir()
        (base / "workspace" / "notes.txt").write_text(NOTES)
        plugins = base / "plugins"
        plugins.mkdir()
        for plugin in PLUGINS.glob("*.wasm"):
            shutil.copy(plugin, plugins / plugin.name)
        for name, component in built.items():
            shutil.copy(component, plugins / f"{name}.wasm")
        tools = ", ".join(f'"{n}", "{n}_save"' for n in ("pywords", "jswords")) + ', "rswords"'
        (base / "capstan.toml").write_text(f"""
[agent]
workspace = "workspace"
plugins_dir = "plugins"

[provider]
kind = "scripted"
script = "script.toml"

[profiles.worker]
tools = ["set_status", {tools}]
capabilities = ["fs.read"]
""")
        # Each worker's step is told by what its own tool answered: the JS one lists the
        # top two words ("two" among them) and comes first; the Python one lists "three" only.
        script = SCRIPT.format(name="jswords", top=2, word="two") + SCRIPT.format(name="pywords", top=1, word="three")
        (base / "script.toml").write_text(script)
        yield base


def capstan(home, *args, cache=None):
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CAPSTAN_CACHE_DIR": str(cache or ROOT / "target" / "test-component-cache"),
        "CAPSTAN_STATE_DIR": str(home / "state"),
    }
    return subprocess.run(
        [str(BINARY), *args, "--config", str(home / "capstan.toml")],
        cwd=home, env=env, capture_output=True, text=True, timeout=600,
    )


def test_each_template_builds_to_a_plugin_the_host_loads_with_its_tools(home, built):
    for name, component in built.items():
        inspected = capstan(home, "plugins", "inspect", str(component))
        assert inspected.returncode == 0, inspected.stderr
        assert "wit:     capstan:plugin@0.2.1" in inspected.stdout
        assert f"  {name}  [fs.read]" in inspected.stdout, inspected.stdout
        call = ["tool", "call", name, "--as", "worker", "--workspace", str(home / "workspace")]
        called = capstan(home, *call, '{"path": "notes.txt", "top": 2}')
        assert called.returncode == 0, called.stderr
        assert json.loads(called.stdout) == {"lines": 2, "words": 6, "top": [["three", 3], ["two", 2]]}
        # The schema is checked before the tool runs, in every language.
        wrong = capstan(home, *call, '{"path": 3}')
        assert wrong.returncode == 3 and "error[invalid-args]" in wrong.stderr, (name, wrong.stderr)


@pytest.mark.parametrize("name", ["pywords", "jswords"])
def test_a_worker_reads_through_a_read_only_grant_and_its_write_is_refused(home, name):
    result = capstan(home, "run", f"count the words with {name}")
    assert result.returncode == 0, result.stderr
    assert f"{name}: counted, and the write was refused." in result.stdout, result.stdout
    assert not (home / "workspace" / f"count-{name}.txt").exists()
    with contextlib.closing(sqlite3.connect(home / ".capstan" / "capstan.db")) as db:
        rows = db.execute(
            "SELECT process, tool, grants, outcome, detail FROM audit WHERE tool LIKE ? ORDER BY id",
            (f"{name}%",),
        ).fetchall()
    calls = [(process.split(":")[0], tool, grants, outcome) for process, tool, grants, outcome, _ in rows]
    assert ("worker", name, "fs.read", "ok") in calls, rows
    assert ("worker", f"{name}_save", "fs.read", "denied") in calls, rows
    detail = next(d for _, t, _, _, d in rows if t == f"{name}_save")
    assert f"count-{name}.txt" in detail and "ermitted" in detail, detail


@pytest.fixture(scope="module")
def kept_home(built):
    """A home whose workers keep the Python and JavaScript plugins' instances."""
    with tempfile.TemporaryDirectory(prefix="capstan-langs-kept-") as tmp:
        base = pathlib.Path(tmp)
        (base / "workspace").mkdir()
        (base / "workspace" / "notes.txt").write_text(NOTES)
        plugins = base / "plugins"
        plugins.mkdir()
        for name in ("pywords", "jswords"):
            shutil.copy(built[name], plugins / f"{name}.wasm")
        tools = ", ".join(f'"{n}_{t}"' for n in ("pywords", "jswords") for t in ("tally", "hold", "fail", "bloat"))
        (base / "capstan.toml").write_text(f"""
[agent]
workspace = "workspace"
plugins_dir = "plugins"

[provider]
kind = "scripted"
script = "script.toml"

[plugins]
instance_reuse = {{ pywords = "process", jswords = "process" }}

[profiles.worker]
tools = ["set_status", {tools}]
capabilities = ["fs.read"]
""")
        yield base


@pytest.mark.parametrize("name", ["pywords", "jswords"])
def test_a_kept_interpreter_instance_serves_a_process_s_calls_and_is_dropped_as_the_rules_say(kept_home, name):
    """The SDK's file helper leaves nothing open, so the instance is kept from call to
    call; a file the tool keeps open, or a memory growth refused, drops it."""
    # The steps' messages are the same for both plugins: each run gets its own script.
    (kept_home / "script.toml").write_text(KEPT_SCRIPT.format(name=name))
    result = capstan(kept_home, "run", f"tally with {name}")
    assert result.returncode == 0, result.stderr
    assert f"{name}: kept and dropped as it should be." in result.stdout, result.stdout
    with contextlib.closing(sqlite3.connect(kept_home / ".capstan" / "capstan.db")) as db:
        rows = db.execute(
            "SELECT tool, outcome FROM audit WHERE tool LIKE ? ORDER BY id", (f"{name}_%",)
        ).fetchall()
    tools = [tool.removeprefix(f"{name}_") for tool, _ in rows]
    assert tools == ["fail", "tally", "tally", "hold", "tally", "tally", "bloat", "tally"], rows
    assert [outcome for tool, outcome in rows if tool.endswith("_bloat")] == ["failed"], rows
    # The interpreter caught the refusal and the SDK answered with it (no trap): the refused
    # growth alone is what dropped the instance.
    with contextlib.closing(sqlite3.connect(kept_home / ".capstan" / "capstan.db")) as db:
        (detail,) = db.execute("SELECT detail FROM audit WHERE tool = ?", (f"{name}_bloat",)).fetchone()
    caught = {"pywords": "MemoryError", "jswords": "Error: out of memory"}[name]
    assert detail.startswith(caught), detail


LANGS = {"python": "pywords", "js": "jswords", "rust": "rswords"}


def test_first_load_shows_the_compile_and_each_step_is_timed(home, built, tmp_path):
    for lang, name in LANGS.items():
        started = time.monotonic()
        first = capstan(home, "plugins", "inspect", str(built[name]), cache=tmp_path / lang)
        TIMINGS[lang]["first load"] = round(time.monotonic() - started, 2)
        assert first.returncode == 0, first.stderr
        big = built[name].stat().st_size >= 4 << 20
        # A Python or JavaScript component takes seconds to compile: it is said, then timed.
        assert (f"compiling {name}.wasm (" in first.stderr) == big, first.stderr
        assert (f"compiled {name}.wasm in " in first.stderr) == big, first.stderr
        started = time.monotonic()
        again = capstan(home, "plugins", "inspect", str(built[name]), cache=tmp_path / lang)
        TIMINGS[lang]["cached load"] = round(time.monotonic() - started, 2)
        assert again.returncode == 0 and "compiling" not in again.stderr, again.stderr
        # The author's own call: the project's directory as the plugins directory.
        call = ["tool", "call", name, '{"path": "notes.txt"}', "--grant", "fs.read", "--workspace", str(home / "workspace"),
                "--plugins-dir", str(built[name].parent)]
        # The first call also compiles the first-party plugins into this fresh cache; the
        # second is a call as an author makes it again and again.
        for _ in range(2):
            started = time.monotonic()
            called = capstan(home, *call, "--store", "memory", cache=tmp_path / lang)
            TIMINGS[lang]["call"] = round(time.monotonic() - started, 2)
            assert called.returncode == 0, called.stderr
    steps = ["scaffold", "build", "rebuild", "first load", "cached load", "call"]
    for lang in LANGS:
        for step in steps:
            assert TIMINGS[lang].get(step, 0) > 0, (lang, step, TIMINGS)
    (ROOT / "target" / "author-path.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")
    print("\nthe author's path, seconds:", json.dumps(TIMINGS))


def probe(home, tool, op, arg="", grant=None, store="memory"):
    """`tool call TOOL {"op", "arg"} --json`: ("ok", value) or (kind, message)."""
    args = ["tool", "call", tool, json.dumps({"op": op, "arg": arg}), "--json", "--store", store]
    if grant:
        args += ["--grant", grant]
    done = capstan(home, *args)
    assert done.returncode in (0, 3, 4, 5, 6), done.stderr
    outcome = json.loads(done.stdout)
    if "ok" in outcome:
        return "ok", json.loads(outcome["ok"])["value"]
    return outcome["error"]["kind"], outcome["error"]["message"]


HOST = "tasks.write,memory.write"


@pytest.mark.parametrize("lang", list(LANGS))
def test_every_host_import_answers_or_refuses_as_the_matching_tool_error(home, lang):
    name = LANGS[lang]
    host = lambda op, arg="": probe(home, f"{name}_host", op, arg, grant=HOST, store="configured")
    kind, number = host("task_create", f"ship {lang}")
    assert kind == "ok" and number.isdigit(), number
    assert host("task_get", number) == ("ok", f"ship {lang}")
    assert host("task_get", "987654") == ("not-found", "task #987654 does not exist")
    kind, message = host("task_update", number)
    assert kind == "invalid-args" and "backlog" in message and "done" in message, message
    assert host("caught", "987654") == ("ok", "not-found: task #987654 does not exist")
    kind, titles = host("task_list")
    assert kind == "ok" and f"ship {lang}" in titles, titles
    kind, memory_id = host("memory_save", f"{lang} remembers")
    assert kind == "ok" and memory_id.isdigit(), memory_id
    assert host("memory_delete", "not-a-number") == ("invalid-args", "memory id `not-a-number` is not a number")
    assert host("memory_delete", "987654") == ("not-found", "memory 987654 does not exist")
    assert host("memory_delete", memory_id) == ("ok", "deleted")
    assert host("working_set", "v") == ("ok", "set")
    kind, message = host("memory_recall", "x")
    assert kind == "denied" and message.startswith("memory.recall needs capability memory.read;"), message
    kind, message = host("hmac", "nope")
    assert kind == "denied" and message.startswith("secret `nope` is not granted"), message
    kind, message = probe(home, f"{name}_bare", "task_get", "1", grant="fs.read")
    assert kind == "denied" and message.startswith("tasks.get needs capability"), message
    kind, message = probe(home, f"{name}_bare", "memory_save", "x", grant="fs.read")
    assert kind == "denied" and message.startswith("memory.save needs capability memory.write;"), message
    # An uncaught exception (a panic, in Rust) is `failed` with its message.
    kind, message = host("boom", "the tool's own error")
    assert kind == "failed" and "boom: the tool's own error" in message, message


@pytest.mark.parametrize("lang", list(LANGS))
def test_a_store_failure_reaches_the_tool_as_failed_with_the_host_s_message(home, lang):
    name = LANGS[lang]
    # A damaged database: every new memory is refused by the database itself.
    assert probe(home, f"{name}_host", "working_set", "v", grant=HOST, store="configured") == ("ok", "set")
    database = home / ".capstan" / "capstan.db"
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.execute("CREATE TRIGGER IF NOT EXISTS refuse_memories BEFORE INSERT ON memories BEGIN SELECT RAISE(ABORT, 'the disk is on fire'); END")
        db.commit()
    try:
        kind, message = probe(home, f"{name}_host", "memory_save", "lost", grant=HOST, store="configured")
        assert kind == "failed" and "the disk is on fire" in message, message
    finally:
        with contextlib.closing(sqlite3.connect(database)) as db:
            db.execute("DROP TRIGGER refuse_memories")
            db.commit()


def test_without_a_config_a_call_gets_a_throwaway_store_unless_it_asks_for_the_configured_one(home, tmp_path):
    env = {**os.environ, "CAPSTAN_CACHE_DIR": str(ROOT / "target" / "test-component-cache"), "CAPSTAN_STATE_DIR": str(tmp_path / "state")}

    def call(*extra):
        return subprocess.run(
            [str(BINARY), "tool", "call", "rswords_host", '{"op": "task_create", "arg": "t"}', "--grant", HOST,
             "--plugins-dir", str(home / "plugins"), "--json", *extra],
            cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
        )

    # No config file: each call gets a fresh store (the first task is #1 each time), and
    # nothing is written beside it.
    for extra in ([], ["--store", "memory"]):
        done = call(*extra)
        assert done.returncode == 0, done.stderr
        assert json.loads(json.loads(done.stdout)["ok"]) == {"value": "1"}
    assert not (tmp_path / ".capstan").exists(), list(tmp_path.iterdir())
    # Asked for, the configured store is opened: SQLite in ./.capstan by default.
    done = call("--store", "configured")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".capstan" / "capstan.db").is_file()


class Loopback(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the granted server"
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(201)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def servers():
    """Two loopback servers: the first is granted, the second never."""
    started = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Loopback) for _ in range(2)]
    for server in started:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [server.server_address[1] for server in started]
    for server in started:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("lang", list(LANGS))
def test_http_from_each_sdk_reaches_the_granted_server_and_carries_the_host_s_refusal(home, servers, lang):
    name = LANGS[lang]
    granted, other = servers
    grant = f"net:http://127.0.0.1:{granted}"
    assert probe(home, f"{name}_net", "fetch", f"http://127.0.0.1:{granted}/", grant=grant) == (
        "ok", {"status": 200, "body": "hello from the granted server", "type": "text/plain"})
    kind, value = probe(home, f"{name}_net", "post", f"http://127.0.0.1:{granted}/x", grant=grant)
    assert kind == "ok" and value["status"] == 201 and json.loads(value["body"]) == {"hello": "world"}, value
    # Outside the grant: the host's reason, naming the grant and the rule that would allow it.
    kind, message = probe(home, f"{name}_net", "fetch", f"http://127.0.0.1:{other}/", grant=grant)
    assert kind == "denied", (kind, message)
    assert message.startswith("capstan refused this request:"), message
    assert f"granted net: http://127.0.0.1:{granted}" in message and f"net:http://127.0.0.1:{other}" in message, message
    # No network grant at all: refused by the SDK before anything is sent, never a trap.
    kind, message = probe(home, f"{name}_bare", "fetch", f"http://127.0.0.1:{granted}/", grant="fs.read")
    assert kind == "denied", (kind, message)
    assert message.startswith(f"capstan refused this request: GET http://127.0.0.1:{granted}/: this call holds no network grant (it runs with: fs.read)"), message
