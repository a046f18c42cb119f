"""A trace receiver for OTLP/HTTP on loopback, written for the tests and the README: it takes
`POST /v1/traces`, decodes each body with the OpenTelemetry project's own protobuf classes
(`opentelemetry-proto` from PyPI) and keeps every body and span.

Run on its own, it prints each batch's spans as a tree:

    target/interop-venv/bin/python tests/interop/otlp_receiver.py 4318
"""

import gzip
import http.server
import sys
import threading

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: every body it took, and every span decoded."""

    def __init__(self, port=0):
        self.lock = threading.Lock()
        self.arrived = threading.Event()
        self.bodies = []
        self.requests = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                outer.take(self.path, self.headers.get("Content-Type"), body)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, path, content_type, body):
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            self.bodies.append((path, content_type, body))
            self.requests.append(request)
        self.arrived.set()

    def spans(self):
        """Every span received, with its resource's and scope's schema and attributes."""
        found = []
        with self.lock:
            for request in self.requests:
                for resource in request.resource_spans:
                    described = attributes(resource.resource.attributes)
                    service, pid = described.get("service.name"), described.get("process.pid")
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            found.append({
                                "name": span.name,
                                "trace": span.trace_id.hex(),
                                "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "kind": span.kind,
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": attributes(span.attributes),
                                "status": span.status.code,
                                "flags": span.flags,
                                "service": service,
                                "pid": pid,
                                "schema": scope.schema_url or resource.schema_url,
                                "scope": scope.scope.name,
                            })
        return found

    def stop(self):
        self.server.shutdown()


def attributes(pairs):
    out = {}
    for pair in pairs:
        value = pair.value
        kind = value.WhichOneof("value")
        out[pair.key] = getattr(value, kind) if kind else None
    return out


KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def tree(spans):
    """The spans as indented lines, children under their parents, in start order."""
    ids = {s["id"] for s in spans}
    lines = []

    def show(span, depth):
        shown = ", ".join(f"{k}={v}" for k, v in sorted(span["attributes"].items())
                          if not k.startswith("capstan.receipt.") or v)
        ms = (span["end"] - span["start"]) / 1e6
        lines.append(f"{'  ' * depth}{span['name']}  [{KINDS.get(span['kind'], '?')}, "
                     f"{ms:.1f} ms]  {shown}")
        for child in sorted((s for s in spans if s["parent"] == span["id"]),
                            key=lambda s: s["start"]):
            show(child, depth + 1)

    for root in sorted((s for s in spans if s["parent"] not in ids), key=lambda s: s["start"]):
        lines.append(f"trace {root['trace']}" + (f" (parent {root['parent']})" if root["parent"] else ""))
        show(root, 1)
    return "\n".join(lines)


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 4318
    receiver = Receiver(port)
    print(f"listening on {receiver.url}/v1/traces", flush=True)
    seen = 0
    try:
        while True:
            receiver.arrived.wait()
            receiver.arrived.clear()
            spans = receiver.spans()
            print(tree(spans[seen:]), flush=True)
            seen = len(spans)
    except KeyboardInterrupt:
        receiver.stop()


if __name__ == "__main__":
    main()
