"""ASGI apps served on loopback from a thread of the runner's own process, so the runner,
the MCP server and the model share the current pair and environment in memory."""

import asyncio
import socket
import threading
import time

import uvicorn


class Background:
    """One asyncio loop in a daemon thread; each app gets a port the system picks."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-servers", daemon=True)
        self.thread.start()

    def serve(self, app, name: str) -> "Served":
        """Serves `app` on 127.0.0.1 and returns once it accepts connections."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        # The lifespan runs the app's startup (the MCP session manager needs it).
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
        server = uvicorn.Server(config)
        done = asyncio.run_coroutine_threadsafe(server.serve(sockets=[sock]), self.loop)
        served = Served(name, port, server, done, sock)
        served.wait_started()
        return served

    def close(self):
        """Cancels what is left on the loop (streams' watchers) and stops it."""

        async def cancel_rest():
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_rest(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class Served:
    """A running app: its port, and a way to stop it."""

    def __init__(self, name, port, server, done, sock):
        self.name, self.port, self.server, self.done, self.sock = name, port, server, done, sock

    def wait_started(self, timeout=30.0):
        # uvicorn sets `started` once it listens; a failure ends the future first.
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self.done.done():
                self.done.result()  # raises the startup error
                raise RuntimeError(f"the {self.name} server stopped at startup")
            time.sleep(0.02)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {self.name} server did not start in {timeout:.0f} s")

    def stop(self, timeout=30.0):
        self.server.should_exit = True
        try:
            self.done.result(timeout=timeout)
        finally:
            self.sock.close()
