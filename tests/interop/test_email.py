"""The email adapter against real mail servers from PyPI on loopback: pymap (IMAP) holds
the agent's mailbox and aiosmtpd (SMTP) takes submissions with a password, both run by
scripts/mail_servers.py in their own venv (made by scripts/interop). Two people write to
the agent through the real `capstan serve` and each is answered once, in their thread; a
stranger, an automatic answer and an unreadable message get nothing and stop nothing; a
message too large to read whole is answered from its header; the account's password is in
no byte the host writes or sends."""

import imaplib
import os
import pathlib
import sys
import tempfile

import pytest

from conftest import ROOT, Server

# The mail servers and the letters the demo uses (scripts/demo-email): one copy.
sys.path.insert(0, str(ROOT / "scripts"))
from demo_email import AGENT, MailServers  # noqa: E402
from demo_matrix import until  # noqa: E402

MAIL_PYTHON = os.environ.get("CAPSTAN_MAIL_PYTHON")
ADAPTER = ROOT / "target" / "adapters" / "email.wasm"
# The canary: the account's password must never leave the host.
PASSWORD = "canary-mail-password-5b1e0c"

SCRIPT = '''
[[step]]
process = "channel"
when = "more than the host reads"
repeat = true
reply = "That one was cut: only its header came."

[[step]]
process = "channel"
when = "hello from alice"
repeat = true
reply = "Hi alice, noted."

[[step]]
process = "channel"
when = "what time"
repeat = true
reply = "Bob, it is time."
'''

USERS = {
    "alice@localhost": "alice-password-1",
    "bob@localhost": "bob-password-1",
    "mallory@localhost": "mallory-password-1",
}


@pytest.fixture
def mail():
    if not MAIL_PYTHON:
        pytest.fail("CAPSTAN_MAIL_PYTHON is not set: run the interop tests with scripts/interop")
    work = tempfile.TemporaryDirectory(prefix="capstan-mail-")
    servers = MailServers(MAIL_PYTHON, work.name, PASSWORD, USERS)
    yield servers
    servers.stop()
    work.cleanup()


def test_two_people_write_to_the_agent_and_each_is_answered_once_in_their_thread(mail):
    assert ADAPTER.is_file(), f"{ADAPTER} is missing: run scripts/setup"
    extra = f'''
[secrets.MAIL_PASSWORD]
env = "CAPSTAN_TEST_MAIL_PASSWORD"

[channels.mail]
adapter = "{ADAPTER}"
conversation = "thread"
allow = ["alice@localhost", "bob@localhost"]
trusted = ["alice@localhost"]
poll_wait_secs = 1

{mail.table("mail", ADAPTER, "MAIL_PASSWORD")}'''
    os.environ["CAPSTAN_TEST_MAIL_PASSWORD"] = PASSWORD
    try:
        server = Server(tokens=False, extra=extra, script=SCRIPT)
    finally:
        del os.environ["CAPSTAN_TEST_MAIL_PASSWORD"]
    try:
        cursor = server.base / ".capstan" / "channels" / "mail.cursor"
        until("the first read of the mailbox", cursor.is_file)

        def after_a_batch(send):
            """Runs `send`, then waits until the channel has stored a batch past it."""
            before = cursor.read_text()
            send()
            until("the channel reading past it", lambda: cursor.read_text() != before)

        # A stranger, alice forged by her (with a forged vouching header too), an
        # out-of-office answer and garbage: each read, none answered.
        after_a_batch(lambda: mail.send("mallory@localhost", "hi", "hello from alice"))
        forged = {"Authentication-Results": "localhost; auth=pass smtp.auth=alice@localhost"}
        after_a_batch(lambda: mail.send("alice@localhost", "hi", "hello from alice",
                                        login="mallory@localhost", headers=forged))
        after_a_batch(lambda: mail.send("alice@localhost", "Away", "hello from alice",
                                        headers={"Auto-Submitted": "auto-replied"}))

        def append_garbage():
            box = imaplib.IMAP4("127.0.0.1", mail.imap_port)
            box.login(AGENT, PASSWORD)
            box.append("INBOX", None, None, b"\x00\xff not a message\r\n\r\n\x00" * 100)
            box.logout()
        after_a_batch(append_garbage)
        assert mail.inbox("mallory@localhost") == []
        assert mail.inbox("alice@localhost") == []

        first = mail.send("alice@localhost", "The plan", "hello from alice")
        answer = until("the answer to alice", lambda: mail.inbox("alice@localhost"))[0]
        assert answer.get_content().strip() == "Hi alice, noted."
        assert answer["From"] == AGENT and answer["To"] == "alice@localhost"
        assert answer["Subject"] == "Re: The plan"
        assert answer["In-Reply-To"] == first
        assert first in answer["References"]

        # Bob answers in alice's thread: his own conversation's answer, threaded after his.
        asked = mail.send("bob@localhost", "Re: The plan", "what time is it?", in_reply_to=first)
        reply = until("the answer to bob", lambda: mail.inbox("bob@localhost"))[0]
        assert reply.get_content().strip() == "Bob, it is time."
        assert reply["In-Reply-To"] == asked
        assert reply["References"].split() == [first, asked]
        assert reply["Subject"] == "Re: The plan"

        # Larger than the host reads whole: answered from its header, which says so.
        mail.send("alice@localhost", "A big one", "x" * (1536 * 1024))
        until("the answer to the big letter", lambda: len(mail.inbox("alice@localhost")) == 2)
        assert mail.inbox("alice@localhost")[1].get_content().strip() == \
            "That one was cut: only its header came."

        # Each answered once, the strangers never.
        after_a_batch(lambda: mail.send("mallory@localhost", "again", "what time"))
        assert [len(mail.inbox(u)) for u in USERS] == [2, 1, 0]
    finally:
        server.process.terminate()
        out, err = server.process.communicate(timeout=60)
    try:
        stored = b"".join(p.read_bytes() for p in server.base.rglob("*") if p.is_file())
        # Bob's words are labelled by him; alice is trusted.
        assert b"chat:mail:bob@localhost" in stored
        assert b"chat:mail:alice@localhost" not in stored
        sent = b"".join(p.read_bytes() for p in mail.outbox.rglob("*.eml"))
        for where, data in [("standard output", out.encode()), ("standard error", err.encode()),
                            ("the host's files", stored), ("the letters sent", sent)]:
            assert PASSWORD.encode() not in data, f"the mail password is in {where}"
    finally:
        server.dir.cleanup()
