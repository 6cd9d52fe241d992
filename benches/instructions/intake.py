#!/usr/bin/env python3
"""Instructions per intake, counted by callgrind: a figure that does not move with the
machine's load, for comparing builds where wall-clock throughput varies by +-25 %.

    python3 benches/instructions/intake.py BINARY [BINARY ...]

Each binary serves a fresh data directory under `valgrind --tool=callgrind`; 16 client
threads POST code-review@1 intakes (1.9 KB sources) over keep-alive HTTP/1.1; the server is
stopped with SIGTERM. Two runs per binary (SMALL and LARGE intakes) cancel start-up and
shutdown: the figure is (Ir(LARGE) - Ir(SMALL)) / (LARGE - SMALL). Group commit makes the
transactions per intake vary a little from run to run (about 1-2 % of the figure).
Needs valgrind (on the machine; `apt-get install valgrind` elsewhere)."""

import glob
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading

SMALL, LARGE, CLIENTS = 1000, 4000, 16
FILLER = "the reviewer asks whether the lease is still renewed when a batch is split. " * 25


def instructions(binary: str, intakes: int, work: str) -> int:
    out = os.path.join(work, f"callgrind-{intakes}.out")
    data = tempfile.mkdtemp(dir=work)
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary, "serve",
         "--data-dir", data, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    address = None
    for line in server.stdout:
        found = re.search(r"listening on http://(\S+)", line)
        if found:
            address = found.group(1)
            break
    if address is None:
        server.kill()
        sys.exit(f"{binary} did not report its address")
    host, port = address.rsplit(":", 1)
    failures = []

    def client(number: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        for i in range(intakes // CLIENTS):
            body = json.dumps({"tenant": "bench", "source_id": f"bench/pr-{number}-{i}",
                               "schema": "code-review@1",
                               "content": f"PR c{number}-{i} revision 1. " + FILLER[:1800]})
            conn.request("POST", "/v1/extractions", body,
                         {"Content-Type": "application/json", "Host": address})
            answer = conn.getresponse()
            answer.read()
            if answer.status not in (200, 201):
                failures.append(answer.status)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server.send_signal(signal.SIGTERM)
    server.wait()
    if failures:
        sys.exit(f"{binary}: {len(failures)} intakes failed, first status {failures[0]}")
    total = 0
    for path in glob.glob(out + "*"):
        with open(path) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    total += int(line.split()[1])
                    break
    return total


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(f"{'binary':<40} {'instructions per intake':>24}")
    for binary in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as work:
            small = instructions(binary, SMALL, work)
            large = instructions(binary, LARGE, work)
        print(f"{binary:<40} {(large - small) / (LARGE - SMALL):>24,.0f}")


if __name__ == "__main__":
    main()
