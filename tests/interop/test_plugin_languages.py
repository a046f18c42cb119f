"""Plugins in Python, JavaScript and Rust, each from `capstan plugins new --lang ...`, built
from source with its language's standard toolchain (componentize-py from PyPI,
ComponentizeJS from npm, cargo with the wasm32-wasip2 toolchain scripts/setup found),
then loaded by the real `capstan` binary.

The Python and JavaScript projects get a second tool appended, as an author would write
it: one that declares only `fs.read` and tries to write. A scripted agent turn has a
worker call both; the read works through the read-only grant, the write is refused by the
sandbox, and the audit log shows each call."""

import contextlib
import json
import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys
import tempfile

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


def new_project(lang, name, base):
    project = base / name
    out = run([str(BINARY), "plugins", "new", "--lang", lang, name, "--dir", str(project)], cwd=base)
    assert f"wrote the {name} plugin" in out.stdout
    return project


def append_writer(path, text):
    """Appends `text` after the template's own export line, which it repeats at its end."""
    source = path.read_text()
    lines = [line for line in source.splitlines() if not line.startswith(("Tool = ", "export const tool ="))]
    path.write_text("\n".join(lines) + text)


@pytest.fixture(scope="module")
def built():
    """The three projects, built: name -> component file."""
    with tempfile.TemporaryDirectory(prefix="capstan-langs-") as tmp:
        base = pathlib.Path(tmp)
        components = {}

        project = new_project("python", "pywords", base)
        append_writer(project / "app.py", PYTHON_WRITER.format(name="pywords"))
        run(["./build.sh"], cwd=project)
        components["pywords"] = project / "pywords.wasm"

        project = new_project("js", "jswords", base)
        append_writer(project / "plugin.js", JS_WRITER.format(name="jswords"))
        run(["npm", "ci", "--no-audit", "--no-fund"], cwd=project)
        run(["npm", "run", "build"], cwd=project)
        components["jswords"] = project / "jswords.wasm"

        project = new_project("rust", "rswords", base)
        wasm_cargo = ROOT / "target" / "wasm-cargo"
        assert wasm_cargo.is_file(), "run scripts/setup first: it writes target/wasm-cargo"
        # The setup's target dir: std for wasm32-wasip2 is built there already.
        target = ROOT / "target" / "wasm"
        run([str(wasm_cargo), "--target-dir", str(target)], cwd=project)
        components["rswords"] = target / "wasm32-wasip2" / "release" / "rswords.wasm"

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


def capstan(home, *args):
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CAPSTAN_CACHE_DIR": str(ROOT / "target" / "test-component-cache"),
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
