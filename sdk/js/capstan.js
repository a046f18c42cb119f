// Capstan's helper for tool plugins written in JavaScript, built with ComponentizeJS.
//
// A plugin is an ES module that registers its tools on a Toolbox and exports it as `tool`:
//
//   import { Toolbox, ToolError, readText } from './capstan.js';
//
//   const toolbox = new Toolbox();
//   toolbox.tool({
//     name: 'line_count',
//     description: 'Counts the lines of a workspace file.',
//     needs: ['fs.read'],
//     args: { path: { type: 'string', description: 'a file, relative to the workspace root' } },
//   }, ({ path }) => readText(path).split('\n').length);
//
//   export const tool = toolbox.export();
//
// Built against the `plugin-wasi` world of Capstan's WIT:
//
//   componentize-js --wit wit --world-name plugin-wasi -o plugin.wasm plugin.js
//
// - `args` describes the arguments (JSON Schema properties); every one is required unless
//   `optional: true`. They are checked before the function runs: an unknown key, a missing
//   one or a wrong type is an `invalid-args` error naming the key.
// - A string result is returned as it is; anything else as JSON (nothing as `null`). A tool
//   may be async: its promise's value is the result.
// - `throw ToolError.denied(...)` and its siblings end a call with that kind of error. Any
//   other exception is `failed` with its message: a plugin never traps on an exception.
// - The workspace is the directory the call is granted (`fs.read`, `fs.write`):
//   `readText`, `writeText` and `listDir` reach it. A write without `fs.write` is `denied`.

import { write as hostLog } from 'capstan:plugin/log@0.2.1';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

const KINDS = ['invalid-args', 'denied', 'not-found', 'failed'];

/** Ends a call with an error the model reads. ComponentizeJS turns a thrown value with a
 * `payload` into the `err` of the exported result. */
export class ToolError extends Error {
  constructor(kind, message) {
    if (!KINDS.includes(kind)) throw new TypeError(`unknown tool error kind ${kind}; one of ${KINDS.join(', ')}`);
    super(String(message));
    this.kind = kind;
    this.payload = { tag: kind, val: String(message) };
  }
  static invalidArgs(message) { return new ToolError('invalid-args', message); }
  static denied(message) { return new ToolError('denied', message); }
  static notFound(message) { return new ToolError('not-found', message); }
  static failed(message) { return new ToolError('failed', message); }
}

/** Writes a line to the host's log (`trace`, `debug`, `info`, `warn` or `error`), tagged
 * with the plugin and tool; the host rate-limits it per call. */
export function log(level, message) {
  hostLog(level, String(message));
}

// The error code a wasi:filesystem call threw: 'no-entry', 'not-permitted', 'read-only'...
function code(err) {
  if (typeof err === 'string') return err;
  if (err && typeof err.payload === 'string') return err.payload;
  return String(err && err.message ? err.message : err);
}

function fsError(err, what) {
  const c = code(err);
  if (c === 'no-entry') return ToolError.notFound(`${what}: no such file or directory`);
  if (['access', 'not-permitted', 'read-only'].includes(c)) return ToolError.denied(`${what}: ${c} (the call's grant does not allow it)`);
  return ToolError.failed(`${what}: ${c}`);
}

function workspace() {
  const dirs = getDirectories();
  const found = dirs.find(([, path]) => path === '.');
  if (!found) throw ToolError.denied('this call holds no workspace: declare and be granted fs.read or fs.write');
  return found[0];
}

/** The text of a workspace file. */
export function readText(path) {
  let file;
  try {
    file = workspace().openAt({ symlinkFollow: false }, path, {}, { read: true });
  } catch (err) {
    throw err instanceof ToolError ? err : fsError(err, `cannot open ${path}`);
  }
  const chunks = [];
  let offset = 0;
  for (;;) {
    const [bytes, eof] = file.read(65536, offset);
    chunks.push(bytes);
    offset += bytes.length;
    if (eof || bytes.length === 0) break;
  }
  const all = new Uint8Array(offset);
  let at = 0;
  for (const chunk of chunks) { all.set(chunk, at); at += chunk.length; }
  return new TextDecoder().decode(all);
}

/** Writes `text` to a workspace file, replacing it. Needs `fs.write`. */
export function writeText(path, text) {
  let file;
  try {
    file = workspace().openAt({ symlinkFollow: false }, path, { create: true, truncate: true }, { write: true });
  } catch (err) {
    throw err instanceof ToolError ? err : fsError(err, `cannot write ${path}`);
  }
  const bytes = new TextEncoder().encode(String(text));
  let offset = 0;
  while (offset < bytes.length) {
    offset += Number(file.write(bytes.subarray(offset), offset));
  }
}

/** The names in a workspace directory, sorted. */
export function listDir(path = '.') {
  let entries;
  try {
    const dir = path === '.' ? workspace() : workspace().openAt({ symlinkFollow: false }, path, { directory: true }, { read: true });
    entries = dir.readDirectory();
  } catch (err) {
    throw err instanceof ToolError ? err : fsError(err, `cannot list ${path}`);
  }
  const names = [];
  for (let entry = entries.readDirectoryEntry(); entry; entry = entries.readDirectoryEntry()) names.push(entry.name);
  return names.sort();
}

const TYPES = {
  string: (v) => typeof v === 'string',
  integer: (v) => Number.isInteger(v),
  number: (v) => typeof v === 'number',
  boolean: (v) => typeof v === 'boolean',
  array: (v) => Array.isArray(v),
  object: (v) => v !== null && typeof v === 'object' && !Array.isArray(v),
};

/** The tools of one plugin: register with `tool(...)`, export with `export const tool =
 * toolbox.export()`. */
export class Toolbox {
  constructor() {
    this.tools = new Map();
  }

  /** Registers `run(args, context)` as a tool: `name` (lowercase letters, digits, `_`),
   * `description` (for the model), `needs` (capabilities it declares: `fs.read`,
   * `fs.write`, `tasks.read`, `net:api.example.com`, ...), `args` (JSON Schema
   * properties; `optional: true` on one that may be left out) and `effect` (what a call
   * does: `read`, `write-local` or `send`, for the host's data-flow rules, which take the
   * higher of it and what the capabilities imply). */
  tool({ name, description, needs = [], args = {}, effect }, run) {
    if (!/^[a-z][a-z0-9_]*$/.test(name ?? '')) throw new TypeError(`tool name ${name} must be lowercase letters, digits and _`);
    if (effect !== undefined && !['read', 'write-local', 'send'].includes(effect)) {
      throw new TypeError(`tool ${name}: effect ${effect} is not read, write-local or send`);
    }
    if (this.tools.has(name)) throw new TypeError(`tool ${name} is registered twice`);
    if (!description) throw new TypeError(`tool ${name} needs a description`);
    const properties = {};
    const required = [];
    for (const [key, { optional, ...schema }] of Object.entries(args)) {
      properties[key] = schema;
      if (!optional) required.push(key);
    }
    const schema = { type: 'object', properties, additionalProperties: false };
    if (required.length) schema.required = required;
    // The effect travels as an entry of the capability list: the contract's record stays.
    const declared = effect === undefined ? [...needs] : [...needs, `effect:${effect}`];
    this.tools.set(name, { name, description, needs: declared, schema, run });
    return this;
  }

  describe() {
    return [...this.tools.values()].map((t) => ({
      name: t.name,
      description: t.description,
      argsSchema: JSON.stringify(t.schema),
      capabilities: t.needs,
    }));
  }

  /** Runs a tool: a string, or a promise of one when the tool is async. */
  call(name, argsJson, context) {
    try {
      const tool = this.tools.get(name);
      if (!tool) throw ToolError.notFound(`no tool ${name} in this plugin`);
      let args;
      try {
        args = JSON.parse(argsJson);
      } catch (err) {
        throw ToolError.invalidArgs(`the arguments are not JSON: ${describe(err)}`);
      }
      if (!TYPES.object(args)) throw ToolError.invalidArgs('the arguments must be a JSON object');
      check(tool.schema, args);
      const result = tool.run(args, context);
      if (result && typeof result.then === 'function') return result.then(text, (err) => { throw asToolError(err); });
      return text(result);
    } catch (err) {
      throw asToolError(err);
    }
  }

  /** The object ComponentizeJS exports as `capstan:plugin/tool`. */
  export() {
    return {
      describe: () => this.describe(),
      call: (name, argsJson, context) => this.call(name, argsJson, context),
    };
  }
}

/** A tool's result as the text the host gets: a string as it is, anything else as JSON
 * (nothing, as `null`). */
function text(result) {
  if (typeof result === 'string') return result;
  if (result === undefined) return 'null';
  const json = JSON.stringify(result);
  if (json === undefined) throw ToolError.failed(`the tool's result is not JSON: a ${typeof result}`);
  return json;
}

function describe(err) {
  if (err && err.message) return String(err.message);
  try {
    return String(err);
  } catch {
    return 'an error that cannot be shown';
  }
}

/** Any thrown value as a ToolError: never a trap. */
function asToolError(err) {
  if (err instanceof ToolError) return err;
  return ToolError.failed(`${err && err.name ? err.name : 'Error'}: ${describe(err)}`);
}

const own = (object, key) => Object.prototype.hasOwnProperty.call(object, key);

function check(schema, args) {
  for (const key of Object.keys(args)) {
    if (!own(schema.properties, key)) {
      const known = Object.keys(schema.properties).map((k) => `\`${k}\``).join(', ') || 'none';
      throw ToolError.invalidArgs(`unknown argument \`${key}\` (arguments: ${known})`);
    }
  }
  for (const key of schema.required ?? []) {
    if (!own(args, key)) throw ToolError.invalidArgs(`missing argument \`${key}\``);
  }
  for (const [key, value] of Object.entries(args)) {
    const type = schema.properties[key].type;
    if (type && TYPES[type] && !TYPES[type](value)) {
      throw ToolError.invalidArgs(`argument \`${key}\` must be ${type}, not ${JSON.stringify(value).slice(0, 80)}`);
    }
  }
}
