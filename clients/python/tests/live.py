"""Exercises the client against a running commitpoint (`.ci/clients.sh` starts one):
claim → post → replay → stale lease → lease extension → the work loop with a heartbeat.

Environment: COMMITPOINT_URL, COMMITPOINT_TOKEN. Exits non-zero on the first failed check.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from commitpoint_worker import Answer, Client, Grant, StaleLease, work  # noqa: E402

SCHEMA = "code-review@1"
TENANT = "py-client"
# A one-file diff: findings on a.rs lines 1-3 are grounded in it.
SOURCE = "diff --git a/a.rs b/a.rs\nnew file mode 100644\n--- /dev/null\n+++ b/a.rs\n@@ -0,0 +1,3 @@\n+a\n+b\n+c\n"
OUTPUT = {"findings": [{"rule": "R1", "severity": "high", "file": "a.rs", "line": 1, "summary": "s"}]}


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def submit(client: Client, source_id: str) -> str:
    reply = client.submit(TENANT, source_id, SCHEMA, SOURCE)
    check(reply["created"] is True, f"{source_id} submitted")
    return str(reply["extraction_id"])


def claim_only(client: Client, worker: str, extraction_id: str, lease_seconds: int) -> Grant:
    grants = client.claim(worker, limit=1, lease_seconds=lease_seconds)
    check(len(grants) == 1 and grants[0].extraction_id == extraction_id, f"{worker} claims {extraction_id[:12]}")
    return grants[0]


def main() -> None:
    client = Client(os.environ["COMMITPOINT_URL"], os.environ["COMMITPOINT_TOKEN"])

    # claim → post → replay
    first = submit(client, "post-and-replay")
    grant = claim_only(client, "py-a", first, 60)
    check(grant.tenant == TENANT and grant.content == SOURCE and grant.instructions != "", "the grant carries the work")
    reply = client.post_result(first, grant.lease_token, OUTPUT)
    check(reply == {"state": "committed", "findings": 1, "replay": False}, f"committed: {reply}")
    again = client.post_result(first, grant.lease_token, OUTPUT)
    check(again == {"state": "committed", "findings": 1, "replay": True}, f"the same post again is a replay: {again}")

    # stale lease: a one-second lease runs out, another worker takes the work over
    second = submit(client, "stale")
    old = claim_only(client, "py-a", second, 1)
    time.sleep(1.2)
    new = claim_only(client, "py-b", second, 60)
    try:
        client.post_result(second, old.lease_token, OUTPUT)
        check(False, "a superseded token's result is refused")
    except StaleLease as e:
        check(e.status == 409 and e.code == "stale_lease", "a superseded token's result is refused (409 stale_lease)")
    try:
        client.extend_lease(second, old.lease_token, 60)
        check(False, "a superseded token cannot extend")
    except StaleLease:
        check(True, "a superseded token cannot extend (409 stale_lease)")
    check(client.post_result(second, new.lease_token, OUTPUT)["replay"] is False, "the current holder commits")

    # lease extension: a one-second lease extended keeps the work past its first expiry
    third = submit(client, "extend")
    held = claim_only(client, "py-a", third, 1)
    expiry = client.extend_lease(third, held.lease_token, 60)
    check(expiry > held.lease_expires_at, f"the extension answers a later expiry ({expiry})")
    time.sleep(1.2)
    check(client.claim("py-b", limit=1, lease_seconds=60) == [], "the extended lease is not handed out again")
    check(client.post_result(third, held.lease_token, OUTPUT)["replay"] is False, "the extended lease commits")

    # the work loop: a handler slower than its two-second lease is kept alive by the
    # heartbeat, while a rival worker asking all along gets nothing
    slow = submit(client, "loop-slow")
    seen: List[str] = []

    def handler(g: Grant) -> Answer:
        seen.append(g.extraction_id)
        if g.extraction_id == slow:
            time.sleep(3.0)
        return Answer(OUTPUT, usage={"model": "m", "input_tokens": 10, "output_tokens": 5})

    rival_claims: List[Grant] = []
    stop_rival = threading.Event()

    def rival() -> None:
        while not stop_rival.wait(0.3):
            rival_claims.extend(client.claim("py-rival", limit=10, lease_seconds=60))

    thread = threading.Thread(target=rival)
    thread.start()
    try:
        stats = work(client, handler, worker="py-loop", lease_seconds=2, heartbeat_seconds=0.5, until_idle=True)
    finally:
        stop_rival.set()
        thread.join()
    check(seen == [slow] and stats.committed == 1 and stats.stale == 0, f"the slow one committed once: {stats}")
    check(stats.extensions >= 4, f"the heartbeat extended its lease ({stats.extensions} times)")
    check(rival_claims == [], "no rival claimed work the heartbeat kept")

    # the loop goes on from one extraction to the next and stops when the queue is empty
    ids = {submit(client, f"loop-{i}") for i in range(3)}
    seen.clear()
    stats = work(client, handler, worker="py-loop", lease_seconds=60, until_idle=True)
    check(set(seen) == ids and len(seen) == 3, "the loop answered each extraction once")
    check(stats.committed == 3 and stats.replays == 0, f"all three committed: {stats}")
    for extraction_id in ids | {slow}:
        check(client.extraction(extraction_id)["state"] == "committed", f"{extraction_id[:12]} is committed")
    print("python client: all checks passed")


if __name__ == "__main__":
    main()
