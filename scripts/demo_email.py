"""The agent answering over email, on this machine: an IMAP server (pymap) and an SMTP
server (aiosmtpd) on loopback (scripts/mail_servers.py), `capstan serve` with the email
adapter and the demo's scripted model, and alice writing to the agent. Prints the letters
as alice's mail program shows them.
Run by scripts/demo-email, which builds everything and passes the paths:
    demo_email.py MAIL_PYTHON CAPSTAN_BINARY ADAPTER PLUGINS_DIR DEMO_DIR
Uses the standard library only (the servers run on MAIL_PYTHON)."""

import email
import email.policy
import os
import pathlib
import smtplib
import subprocess
import sys
import tempfile
from email.message import EmailMessage
from email.utils import make_msgid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from demo_matrix import demo_agent, free_port, start_serve, until  # noqa: E402

AGENT = "agent@localhost"
SERVERS = pathlib.Path(__file__).resolve().parent / "mail_servers.py"


class MailServers:
    """The agent's mailbox (IMAP) and the submission server (SMTP) on free loopback
    ports; letters to anyone but the agent land in `outbox/<address>/`. The tests use it
    too (tests/interop/test_email.py)."""

    def __init__(self, python, work, agent_password, users):
        self.dir = pathlib.Path(work)
        self.outbox = self.dir / "outbox"
        self.imap_port, self.smtp_port = free_port(), free_port()
        self.users = dict(users)
        self.log = open(self.dir / "mail.log", "w")
        self.process = subprocess.Popen(
            [python, str(SERVERS), str(self.imap_port), str(self.smtp_port), str(self.outbox),
             AGENT, agent_password, *(f"{u}:{p}" for u, p in self.users.items())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        if self.process.stdout.readline().strip() != "ready":
            self.process.wait(timeout=30)
            raise RuntimeError((self.dir / "mail.log").read_text())

    def table(self, channel, adapter, password_secret):
        """The `[channels.CHANNEL.email]` table reaching these servers, and the settings
        that believe what the SMTP server says of who logged in."""
        return f"""[channels.{channel}.settings]
authenticated_by = "localhost"

[channels.{channel}.email]
imap = "imap://127.0.0.1:{self.imap_port}"
smtp = "smtp://127.0.0.1:{self.smtp_port}"
user = "{AGENT}"
password = "{password_secret}"
address = "{AGENT}"
"""

    def send(self, sender, subject, text, in_reply_to=None, to=AGENT, headers=None, login=None):
        """`sender` writes to the agent, logged in as themselves (or as `login`), with
        `headers` besides; the letter's Message-ID."""
        letter = EmailMessage()
        letter["From"] = sender
        letter["To"] = to
        letter["Subject"] = subject
        letter["Message-ID"] = make_msgid(domain="localhost")
        if in_reply_to:
            letter["In-Reply-To"] = in_reply_to
            letter["References"] = in_reply_to
        for name, value in (headers or {}).items():
            letter[name] = value
        letter.set_content(text)
        with smtplib.SMTP("127.0.0.1", self.smtp_port, timeout=30) as smtp:
            login = login or sender
            smtp.login(login, self.users[login])
            smtp.send_message(letter)
        return letter["Message-ID"]

    def inbox(self, address):
        """The letters `address` received, oldest first, parsed."""
        folder = self.outbox / address.lower()
        return [email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
                for path in sorted(folder.glob("*.eml"))]

    def stop(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.log.close()


def main():
    mail_python, binary, adapter, plugins, demo = (os.path.abspath(a) for a in sys.argv[1:6])
    work = pathlib.Path(tempfile.mkdtemp(prefix="capstan-email-demo-"))
    print("==> starting an IMAP server (pymap) and an SMTP server (aiosmtpd)", file=sys.stderr)
    servers = MailServers(mail_python, work, "demo-agent-password",
                          {"alice@localhost": "demo-alice-password"})
    print(f"    IMAP on 127.0.0.1:{servers.imap_port}, SMTP on 127.0.0.1:{servers.smtp_port}",
          file=sys.stderr)
    serve = None
    try:
        agent = demo_agent(work, demo, f"""[secrets.MAIL_PASSWORD]
env = "MAIL_PASSWORD"

[channels.mail]
adapter = "{adapter}"
conversation = "thread"
allow = ["alice@localhost"]
trusted = ["alice@localhost"]
poll_wait_secs = 1

{servers.table("mail", adapter, "MAIL_PASSWORD")}""")
        serve = start_serve(binary, agent, plugins, {"MAIL_PASSWORD": "demo-agent-password"},
                            "mail")
        servers.send("alice@localhost", "My notes", "What are the open items in my notes?")
        until("the worker's report in alice's inbox",
              lambda: any("3 open items" in l.get_content() for l in servers.inbox("alice@localhost")))
        print("\n==> alice's inbox, as her mail program shows it:\n")
        for letter in servers.inbox("alice@localhost"):
            for header in ("From", "To", "Subject", "In-Reply-To"):
                if letter[header]:
                    print(f"{header}: {letter[header]}")
            print()
            for line in letter.get_content().strip().splitlines():
                print(f"    {line}")
            print()
    finally:
        if serve:
            serve.terminate()
            serve.wait(timeout=60)
        servers.stop()


if __name__ == "__main__":
    main()
