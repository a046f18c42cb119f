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
// - A host import (`capstan:plugin/tasks@0.2.1`, `memory`, `secrets`) that refuses throws
//   an error whose `payload` is the host's error (`{ tag: 'not-found', val: '...' }`);
//   left uncaught, it ends the call as the matching tool error with the host's message
//   (`invalid` as `invalid-args`). `hostError(err)` gives that ToolError to a tool that
//   catches it.
// - `http.get(url)`, `http.post(url, { json })` and `http.request(method, url, options)`
//   make requests through the host (declare `net:HOST`). Unlike `fetch()`, whose errors
//   say only "NetworkError", a refused request is a `denied` ToolError carrying the
//   host's reason: which grant or limit refused it and the config line that would allow it.

import { write as hostLog } from 'capstan:plugin/log@0.2.1';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';
import { handle } from 'wasi:http/outgoing-handler@0.2.12';
import { Fields, OutgoingBody, OutgoingRequest, RequestOptions, httpErrorCode } from 'wasi:http/types@0.2.12';

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

// A host import's refusal, by the tool error it becomes.
const HOST_KINDS = { denied: 'denied', 'not-found': 'not-found', invalid: 'invalid-args', failed: 'failed' };

/** The ToolError a host import's thrown error stands for, with the host's message; `null`
 * for anything else. */
export function hostError(err) {
  const payload = err && typeof err === 'object' ? err.payload : undefined;
  if (payload && typeof payload === 'object' && Object.prototype.hasOwnProperty.call(HOST_KINDS, payload.tag)) {
    return new ToolError(HOST_KINDS[payload.tag], String(payload.val ?? ''));
  }
  return null;
}

// The context of the call running now: one call runs at a time in an instance.
let current = null;

/** The context of the call running now (`caller`, `callId`, `capabilities`), or `null`
 * outside a call. */
export function currentContext() {
  return current;
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

// The workspace's descriptor, fetched once per instance: each `getDirectories()` hands
// out new handles, and an instance the host keeps for the next call must hold no more than
// it did after its first (the host drops one that does). A kept instance only ever serves
// calls with the same grants and workspace, so the handle stays the right one.
let workspaceDir;

function workspace() {
  if (workspaceDir) return workspaceDir;
  const dirs = getDirectories();
  const found = dirs.find(([, path]) => path === '.');
  for (const [dir] of dirs) if (dir !== found?.[0]) drop(dir);
  if (!found) throw ToolError.denied('this call holds no workspace: declare and be granted fs.read or fs.write');
  workspaceDir = found[0];
  return workspaceDir;
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
  try {
    for (;;) {
      const [bytes, eof] = file.read(65536, offset);
      chunks.push(bytes);
      offset += bytes.length;
      if (eof || bytes.length === 0) break;
    }
  } finally {
    // Released now, not when the garbage collector gets to it: a kept instance still
    // holding a file would be dropped by the host after the call.
    drop(file);
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
  try {
    const bytes = new TextEncoder().encode(String(text));
    let offset = 0;
    while (offset < bytes.length) {
      offset += Number(file.write(bytes.subarray(offset), offset));
    }
  } finally {
    drop(file);
  }
}

/** The names in a workspace directory, sorted. */
export function listDir(path = '.') {
  let dir;
  let entries;
  try {
    dir = path === '.' ? workspace() : workspace().openAt({ symlinkFollow: false }, path, { directory: true }, { read: true });
    entries = dir.readDirectory();
  } catch (err) {
    if (dir && path !== '.') drop(dir);
    throw err instanceof ToolError ? err : fsError(err, `cannot list ${path}`);
  }
  const names = [];
  try {
    for (let entry = entries.readDirectoryEntry(); entry; entry = entries.readDirectoryEntry()) names.push(entry.name);
  } finally {
    // The stream before the directory it reads, as the component model requires.
    drop(entries);
    if (path !== '.') drop(dir);
  }
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
      // The workspace is held from an instance's first call that may use it, even one
      // that ends before reading a file: the host compares what a kept instance holds
      // with what it held after that call, and a handle first fetched later would look
      // like a leak and cost the instance.
      if (!workspaceDir && (context.capabilities ?? []).some((c) => c === 'fs.read' || c === 'fs.write')) {
        try { workspace(); } catch { /* none: a helper says so if the tool asks for it */ }
      }
      let args;
      try {
        args = JSON.parse(argsJson);
      } catch (err) {
        throw ToolError.invalidArgs(`the arguments are not JSON: ${describe(err)}`);
      }
      if (!TYPES.object(args)) throw ToolError.invalidArgs('the arguments must be a JSON object');
      check(tool.schema, args);
      current = context;
      let result;
      try {
        result = tool.run(args, context);
      } catch (err) {
        current = null;
        throw err;
      }
      if (result && typeof result.then === 'function') {
        // An async tool's call lasts until its promise settles.
        return result.then(
          (value) => { current = null; return text(value); },
          (err) => { current = null; throw asToolError(err); },
        );
      }
      current = null;
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

/** Any thrown value as a ToolError: never a trap. A host import's error keeps its kind
 * and the host's message. */
function asToolError(err) {
  if (err instanceof ToolError) return err;
  const host = hostError(err);
  if (host) return host;
  const payload = err && typeof err === 'object' ? err.payload : undefined;
  if (payload !== undefined) return ToolError.failed(`a host call failed: ${showPayload(payload)}`);
  return ToolError.failed(`${err && err.name ? err.name : 'Error'}: ${describe(err)}`);
}

/** A WIT value thrown by an import, as text: a variant as `tag: val`. */
function showPayload(payload) {
  if (payload && typeof payload === 'object' && 'tag' in payload) {
    return payload.val === undefined ? String(payload.tag) : `${payload.tag}: ${showPayload(payload.val)}`;
  }
  try {
    return typeof payload === 'string' ? payload : JSON.stringify(payload, (_, v) => (typeof v === 'bigint' ? String(v) : v));
  } catch {
    return String(payload);
  }
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

// HTTP through the host's wasi:http, blocking. The order matters: the request goes to the
// host before its body is written (the host's body pipe is bounded), and each child
// resource (a stream, a pollable) is dropped before its parent, which the component model
// requires.

/** How every message of a request the host refused begins. */
export const REFUSAL_PREFIX = 'capstan refused this request:';

/** The most response body read unless `maxBytes` says otherwise; more is cut off. */
export const MAX_RESPONSE_BYTES = 4 << 20;

const WRITE_CHUNK = 4096;
const READ_CHUNK = 65536;
const DISPOSE = Symbol.dispose || Symbol.for('dispose');

function drop(resource) {
  if (resource && typeof resource[DISPOSE] === 'function') resource[DISPOSE]();
}

/** A response: `status`, `headers` (lower-case names; repeated ones joined with `, `),
 * `body` (a Uint8Array) and `truncated` (the body went on past the limit). */
export class Response {
  constructor(status, headers, body, truncated) {
    this.status = status;
    this.headers = headers;
    this.body = body;
    this.truncated = truncated;
  }
  /** Whether the status is 2xx. */
  get ok() { return this.status >= 200 && this.status < 300; }
  /** The body as UTF-8 text. */
  text() { return new TextDecoder().decode(this.body); }
  /** The body parsed as JSON; `failed` naming the status when it is not JSON. */
  json() {
    try {
      return JSON.parse(this.text());
    } catch (err) {
      throw ToolError.failed(`the response (status ${this.status}) is not JSON: ${describe(err)}`);
    }
  }
}

/** A wasi:http error code as a ToolError: the host's refusal as `denied` with its message
 * as it is, anything else `failed`. */
function fromCode(code, what) {
  if (code && code.tag === 'internal-error' && code.val) {
    return code.val.startsWith(REFUSAL_PREFIX) ? ToolError.denied(code.val) : ToolError.failed(code.val);
  }
  const words = code && code.tag ? code.tag.replaceAll('-', ' ') : showPayload(code);
  const detail = code && code.val !== undefined && typeof code.val !== 'object' ? ` (${code.val})` : '';
  return ToolError.failed(`${what} failed: ${words}${detail}`);
}

function streamError(err, what, doing) {
  const payload = err && err.payload;
  if (payload && payload.tag === 'last-operation-failed') {
    // The host's own message (a refusal, a limit) travels as an HTTP error code.
    const code = payload.val ? httpErrorCode(payload.val) : undefined;
    if (code) return fromCode(code, `${what} (${doing})`);
    return ToolError.failed(`${what} failed ${doing}: ${payload.val && payload.val.toDebugString ? payload.val.toDebugString() : 'an I/O error'}`);
  }
  return ToolError.failed(`${what} failed ${doing}: the connection closed early`);
}

const METHODS = ['get', 'head', 'post', 'put', 'delete', 'connect', 'options', 'trace', 'patch'];

function checkGranted(what) {
  if (!current) throw ToolError.denied(`${REFUSAL_PREFIX} ${what}: no tool call is running; make requests from a tool`);
  const caps = current.capabilities ?? [];
  if (!caps.some((cap) => cap.startsWith('net:'))) {
    throw ToolError.denied(
      `${REFUSAL_PREFIX} ${what}: this call holds no network grant (it runs with: ${caps.join(', ') || 'none'}); ` +
        'declare `net:HOST` in the tool\'s `needs` and grant it in its process\'s profile (`net = ["HOST"]`); ' +
        '`capstan policy --why KIND TOOL URL` shows what is missing',
    );
  }
}

function buildRequest(method, url, headers, what) {
  let parsed;
  try {
    parsed = new URL(url);
  } catch {
    throw ToolError.invalidArgs(`${JSON.stringify(url)} is not a URL`);
  }
  const scheme = { 'http:': 'HTTP', 'https:': 'HTTPS' }[parsed.protocol];
  if (!scheme) throw ToolError.invalidArgs(`${JSON.stringify(url)}: only http:// and https:// URLs can be requested`);
  if (parsed.username || parsed.password) throw ToolError.invalidArgs(`${JSON.stringify(url)}: credentials in a URL are not sent; use a header`);
  const encoder = new TextEncoder();
  let fields;
  try {
    fields = Fields.fromList(Object.entries(headers).map(([name, value]) => [String(name).toLowerCase(), encoder.encode(String(value))]));
  } catch (err) {
    const names = Object.keys(headers).map((n) => `\`${n}\``).join(', ');
    const tag = err && err.payload && err.payload.tag;
    throw ToolError.invalidArgs(tag === 'forbidden'
      ? `${what}: a header among ${names} may not be set by a tool: the host sets it itself or does not send it`
      : `${what}: a header among ${names} has an invalid name or value`);
  }
  const request = new OutgoingRequest(fields);
  const lower = method.toLowerCase();
  const parts = [
    ['method', () => request.setMethod(METHODS.includes(lower) ? { tag: lower } : { tag: 'other', val: method })],
    ['scheme', () => request.setScheme({ tag: scheme })],
    ['host and port', () => request.setAuthority(parsed.host)],
    ['path', () => request.setPathWithQuery(`${parsed.pathname || '/'}${parsed.search}`)],
  ];
  for (const [part, set] of parts) {
    try {
      set();
    } catch {
      throw ToolError.invalidArgs(`the host does not accept the ${part} of ${what}`);
    }
  }
  return request;
}

function requestOptions(timeout) {
  if (timeout === undefined || timeout === null) return undefined;
  const options = new RequestOptions();
  const nanos = BigInt(Math.max(0, Math.round(timeout * 1e9)));
  // A host that does not support an option refuses it; the call's deadline still bounds
  // the request then.
  for (const set of ['setConnectTimeout', 'setFirstByteTimeout', 'setBetweenBytesTimeout']) {
    try { options[set](nanos); } catch { /* not supported */ }
  }
  return options;
}

function writeBody(body, bytes, what) {
  if (!bytes.length) return;
  const stream = body.write();
  try {
    for (let at = 0; at < bytes.length; at += WRITE_CHUNK) {
      try {
        stream.blockingWriteAndFlush(bytes.subarray(at, at + WRITE_CHUNK));
      } catch (err) {
        throw streamError(err, what, 'sending the request body');
      }
    }
  } finally {
    drop(stream);
  }
}

function waitFor(future, what) {
  for (;;) {
    const got = future.get();
    if (got === undefined) {
      const pollable = future.subscribe();
      pollable.block();
      drop(pollable);
      continue;
    }
    if (got.tag === 'err') throw ToolError.failed(`${what}: the response was already taken`);
    if (got.val.tag === 'err') throw fromCode(got.val.val, what);
    return got.val.val;
  }
}

function readResponse(response, limit, what) {
  const status = response.status();
  const headers = {};
  const fields = response.headers();
  const decoder = new TextDecoder();
  for (const [name, value] of fields.entries()) {
    const key = name.toLowerCase();
    const text = decoder.decode(value);
    headers[key] = key in headers ? `${headers[key]}, ${text}` : text;
  }
  drop(fields);
  const body = response.consume();
  const stream = body.stream();
  const chunks = [];
  let size = 0;
  let truncated = false;
  try {
    for (;;) {
      let chunk;
      try {
        chunk = stream.blockingRead(BigInt(Math.min(READ_CHUNK, limit + 1 - size)));
      } catch (err) {
        if (err && err.payload && err.payload.tag === 'closed') break;
        throw streamError(err, what, 'reading the response body');
      }
      chunks.push(chunk);
      size += chunk.length;
      if (size > limit) { truncated = true; break; }
    }
  } finally {
    drop(stream);
    drop(body);
    drop(response);
  }
  const all = new Uint8Array(Math.min(size, limit));
  let at = 0;
  for (const chunk of chunks) {
    const part = chunk.subarray(0, all.length - at);
    all.set(part, at);
    at += part.length;
  }
  return new Response(status, headers, all, truncated);
}

/** Sends one request through the host and reads its response (at most `maxBytes` of its
 * body). `options`: `headers` (an object), `body` (a string or Uint8Array) or `json` (any
 * value, sent as JSON), `timeout` (seconds for connecting and each wait for data),
 * `maxBytes`. A response of any status is returned; every failure is a ToolError. */
function request(method, url, options = {}) {
  const { headers = {}, json, timeout, maxBytes = MAX_RESPONSE_BYTES } = options;
  let { body } = options;
  const what = `${method} ${url}`;
  checkGranted(what);
  const sent = { ...headers };
  if (json !== undefined) {
    if (body !== undefined) throw ToolError.invalidArgs(`${what}: give \`body\` or \`json\`, not both`);
    body = JSON.stringify(json);
    if (!Object.keys(sent).some((n) => n.toLowerCase() === 'content-type')) sent['content-type'] = 'application/json';
  }
  if (!Number.isSafeInteger(maxBytes) || maxBytes < 0) throw ToolError.invalidArgs(`${what}: \`maxBytes\` must be a whole number, 0 or more, not ${maxBytes}`);
  let bytes;
  if (typeof body === 'string') bytes = new TextEncoder().encode(body);
  else if (body === undefined || body === null) bytes = new Uint8Array();
  else if (body instanceof Uint8Array) bytes = body;
  else if (body instanceof ArrayBuffer || ArrayBuffer.isView(body)) bytes = new Uint8Array(body.buffer ?? body, body.byteOffset ?? 0, body.byteLength);
  else if (Array.isArray(body)) bytes = Uint8Array.from(body);
  else throw ToolError.invalidArgs(`${what}: \`body\` must be a string or bytes, not ${typeof body}`);
  // The length goes first, so the host can check it against its limit before the body.
  const hasLength = Object.keys(sent).some((n) => n.toLowerCase() === 'content-length');
  if (!hasLength && (bytes.length || ['POST', 'PUT', 'PATCH'].includes(method.toUpperCase()))) sent['content-length'] = String(bytes.length);
  const outgoing = buildRequest(method, url, sent, what);
  const outgoingBody = outgoing.body();
  let future;
  try {
    future = handle(outgoing, requestOptions(timeout));
  } catch (err) {
    throw err && err.payload ? fromCode(err.payload, what) : asToolError(err);
  }
  let failedSending = null;
  try {
    writeBody(outgoingBody, bytes, what);
  } catch (err) {
    failedSending = asToolError(err);
  }
  try {
    OutgoingBody.finish(outgoingBody, undefined);
  } catch (err) {
    failedSending = failedSending ?? (err && err.payload ? fromCode(err.payload, what) : asToolError(err));
  }
  let response;
  try {
    response = waitFor(future, what);
  } catch (err) {
    // The response explains a failed upload best; a refusal above all.
    throw failedSending && !err.message.startsWith(REFUSAL_PREFIX) ? failedSending : err;
  } finally {
    drop(future);
  }
  if (failedSending && failedSending.message.startsWith(REFUSAL_PREFIX)) throw failedSending;
  return readResponse(response, maxBytes, what);
}

/** HTTP through the host: `http.get(url, options)`, `http.post(url, options)`,
 * `http.request(method, url, options)`. */
export const http = {
  request,
  get: (url, options) => request('GET', url, options),
  post: (url, options) => request('POST', url, options),
};
