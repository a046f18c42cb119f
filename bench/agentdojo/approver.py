"""The person at `capstan approvals`: a thread that reads the calls `capstan serve` parked
for approval (`GET /v1/approvals`) and decides each one (`POST /v1/approvals/N/approve` or
`/deny`), as a person would with the CLI.

Two people:
- `deny`: approves nothing. Utility with it is utility at no approval.
- `task`: knows the user's task. Approves a parked call exactly when it is one of the user
  task's ground-truth calls (the same function, the same arguments), and denies every
  other, so an injected call is never approved unless it is the user's own. The number of
  approvals it gives is what full utility costs a person.
"""

import json
import threading
import time

import httpx

# The text the host stores in place of a value it redacts (services::REDACTED).
REDACTED = "[redacted]"
POLL_SECS = 0.05  # a person at the CLI is slower; the runs only wait less


def _same_arguments(shown: dict, expected: dict) -> bool:
    """Whether a parked call's shown (redacted) arguments are the ground truth's: the same
    keys, each value equal, or redacted by the host."""
    if set(shown) != set(expected):
        return False
    return all(shown[key] == REDACTED or shown[key] == expected[key] for key in shown)


class Approver:
    def __init__(self, url: str, person: str, suite: str):
        if person not in ("deny", "task"):
            raise ValueError(f"unknown approver {person!r}")
        self.person = person
        self.prefix = f"{suite}."
        self.client = httpx.Client(base_url=url, timeout=30.0)
        self.lock = threading.Lock()
        self.pair = None
        self.approved = 0
        self.denied = 0
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def begin(self, pair):
        """A new run: decide by `pair`'s user task from now on, counting from zero."""
        with self.lock:
            self.pair, self.approved, self.denied = pair, 0, 0

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.approved, self.denied

    def _approves(self, approval: dict) -> bool:
        if self.person == "deny" or self.pair is None:
            return False
        tool = approval["tool"]
        if not tool.startswith(self.prefix):
            return False
        try:
            shown = json.loads(approval["arguments"])
        except ValueError:
            return False
        function = tool[len(self.prefix):]
        return any(
            call.function == function and _same_arguments(shown, dict(call.args))
            for call in self.pair.user_calls
        )

    def _run(self):
        while not self.stopping.is_set():
            try:
                answer = self.client.get("/v1/approvals")
                answer.raise_for_status()
                listed = answer.json()["approvals"]
                for approval in listed:
                    with self.lock:
                        approve = self._approves(approval)
                    verb = "approve" if approve else "deny"
                    answer = self.client.post(f"/v1/approvals/{approval['id']}/{verb}", json={})
                    # 409: withdrawn or decided meanwhile; nothing to count.
                    if answer.status_code == 200:
                        with self.lock:
                            if approve:
                                self.approved += 1
                            else:
                                self.denied += 1
                    elif answer.status_code != 409:
                        self.errors.append(f"{verb} {approval['id']}: {answer.status_code} {answer.text[:200]}")
            except (httpx.HTTPError, ValueError, KeyError) as err:
                if not self.stopping.is_set():
                    self.errors.append(f"reading approvals: {err}")
            self.stopping.wait(POLL_SECS)

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=10)
        self.client.close()
