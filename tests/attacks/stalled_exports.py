#!/usr/bin/env python3
"""Issue 30, item 2: many export readers that stop reading, against the real binary.

The original attack: one tenant token opened 520 exports and read none of them. Each
held a blocking-pool thread (redb) or a pooled connection in an open transaction
(PostgreSQL) for ever, and every read of every tenant hung. This script opens
--readers such exports from one tenant, then checks that another tenant's listing,
export, point read and intake still answer, that the stalled exports were refused past
the per-tenant cap (429 + Retry-After), and that those let in lose their place after
server.stream_stall_timeout and end cut short, not with a clean end.

Exit 0 when the attack is contained, 1 when it is not. Runs on redb; with
COMMITPOINT_STORE_URL set, `serve` uses that PostgreSQL database instead.

    python3 tests/attacks/stalled_exports.py [--bin target/debug/commitpoint] [--readers 550]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ADMIN = "admin-token-attack-0000001"
ATTACKER = "attacker-token-attack-0001"
VICTIM = "victim-token-attack-000001"
STALL_SECONDS = 3
ANSWER_DEADLINE = 5.0


def call(base, method, path, token, body=None, timeout=ANSWER_DEADLINE):
    """(status, headers, parsed JSON or raw bytes); raises on transport errors and timeouts."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Authorization", "Bearer " + token)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status, headers = response.status, response.headers
    except urllib.error.HTTPError as refused:
        raw, status, headers = refused.read(), refused.code, refused.headers
    try:
        return status, headers, json.loads(raw)
    except ValueError:
        return status, headers, raw


def start(binary, work, old):
    for name, text in [("admin", ADMIN + "\n"), ("tenants", f"attacker {ATTACKER}\nvictim {VICTIM}\n")]:
        path = os.path.join(work, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o600)
    config = os.path.join(work, "config.toml")
    with open(config, "w") as f:
        f.write(f'[access]\nadmin_token_file = "{work}/admin"\ntenant_tokens_file = "{work}/tenants"\n')
        # --old: a build from before the fix, which knows no such setting.
        if not old:
            f.write(f'\n[server]\nstream_stall_timeout = "{STALL_SECONDS}s"\n')
    server = subprocess.Popen(
        [binary, "serve", "--config", config, "--data-dir", os.path.join(work, "data"), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=open(os.path.join(work, "serve.log"), "w"), text=True,
        env={**os.environ, "COMMITPOINT_LOG": "warn"},
    )
    line = server.stdout.readline()
    if "listening on " not in line:
        server.kill()
        sys.exit(f"serve did not start; see {work}/serve.log")
    return server, line.strip().split("listening on ", 1)[1]


def populate(base, tenant, n, findings, summary_bytes):
    ids = []
    for i in range(n):
        # One line per finding, so each finding's line is in the source (code-review@1's rules).
        content = "\n".join(f"fn f{i}_{k}() {{}}" for k in range(max(findings, 1)))
        body = {"tenant": tenant, "source_id": f"src/{i}.rs", "schema": "code-review@1", "content": content}
        status, _, reply = call(base, "POST", "/v1/extractions", ADMIN, body)
        assert status == 201, reply
        ids.append(reply["extraction_id"])
    _, _, claims = call(base, "POST", "/v1/claims", ADMIN, {"worker": "w", "limit": n, "lease_seconds": 600})
    summary = "s" * summary_bytes
    for claim in claims["claims"]:
        output = {"findings": [{"rule": "R", "severity": "high", "file": claim["source_id"], "line": k + 1,
                                "summary": summary}
                               for k in range(findings)]}
        status, _, reply = call(base, "POST", f"/v1/extractions/{claim['extraction_id']}/result", ADMIN,
                                {"lease_token": claim["lease_token"], "output": output}, timeout=30)
        assert status == 200, reply
    return ids


def stalled_export(addr):
    """An export request whose answer is never read past its status line."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(f"GET /v1/export?tenant=attacker HTTP/1.1\r\nHost: {addr}\r\n"
              f"Authorization: Bearer {ATTACKER}\r\n\r\n".encode())
    return s


def status_of(s):
    s.settimeout(10)
    head = b""
    while b"\r\n" not in head:
        got = s.recv(64)
        if not got:
            return 0, head
        head += got
    return int(head.split(b" ", 2)[1]), head


def read_rest(s, first):
    s.settimeout(20)
    got = first
    try:
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    return got


def timed(what, results, f):
    started = time.monotonic()
    try:
        ok, note = f()
    except Exception as e:  # a timeout or a dropped connection is the finding here
        ok, note = False, f"{type(e).__name__}: {e}"
    took = time.monotonic() - started
    results.append((what, ok, took, note))
    print(f"  {'ok  ' if ok else 'FAIL'} {what} ({took:.2f}s) {note}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="target/debug/commitpoint")
    parser.add_argument("--readers", type=int, default=550)
    parser.add_argument("--old", action="store_true", help="the binary predates the fix: write no new settings")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="commitpoint-attack-") as work:
        server, base = start(args.bin, work, args.old)
        addr = base.removeprefix("http://")
        held = []
        try:
            # 12 MB: more than the socket buffers and the export's own chunks hold.
            populate(base, "attacker", 40, 5, 60_000)
            victim_ids = populate(base, "victim", 2, 1, 10)
            print(f"{args.readers} exports from one tenant token, none of them read")
            statuses = {}
            for _ in range(args.readers):
                s = stalled_export(addr)
                status, head = status_of(s)
                statuses[status] = statuses.get(status, 0) + 1
                if status == 200:
                    held.append((s, head))
                else:
                    s.close()
            print(f"  answers: {dict(sorted(statuses.items()))}")
            time.sleep(1)
            print("meanwhile, another tenant:")
            results = []
            timed("listing", results, lambda: (lambda r: (r[0] == 200 and len(r[2]["extractions"]) == 2, ""))(
                call(base, "GET", "/v1/extractions?tenant=victim", VICTIM)))
            timed("point read", results, lambda: (lambda r: (r[0] == 200, ""))(
                call(base, "GET", f"/v1/extractions/{victim_ids[0]}", VICTIM)))
            timed("export", results, lambda: (lambda r: (r[0] == 200 and r[2].count(b"\n") == 2, ""))(
                call(base, "GET", "/v1/export?tenant=victim", VICTIM)))
            timed("intake", results, lambda: (lambda r: (r[0] == 201, ""))(
                call(base, "POST", "/v1/extractions", VICTIM,
                     {"tenant": "victim", "source_id": "new", "schema": "code-review@1", "content": "x"})))
            timed("findings page", results, lambda: (lambda r: (r[0] == 200, ""))(
                call(base, "GET", f"/v1/extractions/{victim_ids[0]}/findings", VICTIM)))
            refused = statuses.get(429, 0)
            results.append(("at most max_exports_per_tenant (2) let in", statuses.get(200, 0) <= 2, 0, ""))
            results.append(("the rest refused with 429", refused == args.readers - statuses.get(200, 0), 0, ""))
            if not args.old:
                _, headers, _ = call(base, "GET", "/v1/export?tenant=attacker", ATTACKER, timeout=10)
                results.append(("a refusal carries Retry-After", headers.get("Retry-After") is not None, 0, ""))
                time.sleep(STALL_SECONDS + 2)
                print(f"after server.stream_stall_timeout ({STALL_SECONDS}s):")
                timed("the tenant's next export is let in", results, lambda: (lambda r: (r[0] == 200, ""))(
                    call(base, "GET", "/v1/export?tenant=attacker", ATTACKER, timeout=30)))
                cut = [not read_rest(s, head).endswith(b"\r\n0\r\n\r\n") for s, head in held]
                results.append(("every stalled export was cut short, not ended cleanly", all(cut), 0, ""))
            failed = [r for r in results if not r[1]]
            for what, _, _, _ in failed:
                print(f"NOT CONTAINED: {what}")
            print(f"{len(results) - len(failed)}/{len(results)} checks held in {time.monotonic() - started:.1f}s")
            return 1 if failed else 0
        finally:
            for s, _ in held:
                s.close()
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    sys.exit(main())
