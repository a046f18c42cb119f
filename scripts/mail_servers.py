"""A mail system on loopback for the email channel's demo and tests: pymap (an IMAP
server, PyPI) holding the agent's mailbox, and aiosmtpd (an SMTP server, PyPI) taking
submissions with a password. A letter to the agent's address is appended to its IMAP
inbox, under the `Authentication-Results: localhost; auth=pass smtp.auth=LOGIN` header a
submission server writes (who logged in to send it); a letter to anyone else is kept as a
file in OUTBOX/<address>/ (their inbox).

    mail_servers.py IMAP_PORT SMTP_PORT OUTBOX AGENT_ADDRESS AGENT_PASSWORD USER:PASSWORD...

Prints `ready` once both servers answer; stops with its standard input.
Run with the Python of the venv from tests/interop/mail-requirements.txt."""

import imaplib
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult


def main():
    imap_port, smtp_port = int(sys.argv[1]), int(sys.argv[2])
    outbox = pathlib.Path(sys.argv[3])
    agent, agent_password = sys.argv[4], sys.argv[5]
    users = dict(pair.split(":", 1) for pair in sys.argv[6:])
    users[agent] = agent_password

    # The agent's mailbox: one user, in memory. No TLS: loopback only.
    imap = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pymap.main import main; sys.exit(main())",
         "--host", "127.0.0.1", "--port", str(imap_port),
         "dict", "--demo-user", agent, "--demo-password", agent_password],
        stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", imap_port), timeout=1):
                break
        except OSError:
            if imap.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("pymap did not start")
            time.sleep(0.1)

    lock = threading.Lock()

    class Deliver:
        async def handle_DATA(self, server, session, envelope):
            with lock:
                for rcpt in envelope.rcpt_tos:
                    if rcpt.lower() == agent.lower():
                        login = (session.login_data or b"").decode()
                        vouched = (f"Authentication-Results: localhost; auth=pass "
                                   f"smtp.auth={login}\r\n").encode()
                        box = imaplib.IMAP4("127.0.0.1", imap_port)
                        box.login(agent, agent_password)
                        box.append("INBOX", None, None, vouched + envelope.original_content)
                        box.logout()
                    else:
                        folder = outbox / rcpt.lower()
                        folder.mkdir(parents=True, exist_ok=True)
                        n = len(list(folder.glob("*.eml")))
                        part = folder / f".{n}.part"
                        part.write_bytes(envelope.original_content)
                        os.replace(part, folder / f"{n:04}.eml")
            return "250 OK"

    def authenticate(server, session, envelope, mechanism, auth_data):
        login = auth_data.login.decode()
        ok = users.get(login) == auth_data.password.decode()
        return AuthResult(success=ok, auth_data=auth_data)

    smtp = Controller(Deliver(), hostname="127.0.0.1", port=smtp_port,
                      authenticator=authenticate, auth_required=True,
                      auth_require_tls=False)
    smtp.start()
    print("ready", flush=True)
    try:
        sys.stdin.read()
    finally:
        smtp.stop()
        imap.terminate()
        imap.wait(timeout=30)


if __name__ == "__main__":
    main()
