"""Issue 30, item 3, replayed against the real binary: trickling console logins.

`POST /ui/login` needs no session, and its form body was read with no deadline, so a
client that sent one byte at a time held its connection for as long as it liked: 1,024 of
them took every connection and every API and console call answered 503. Here the server
has `max_connections = 64` and `body_read_timeout = "2s"`, and 64 clients trickle a byte
every half second for 12 s. The attack is refused when the API answers again within a few
seconds of the read timeout, while the trickling goes on.

Exit status 0 when the attack was refused, 1 when the API stayed unavailable.
Environment: COMMITPOINT_BIN (default target/debug/commitpoint).
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BIN = os.environ.get("COMMITPOINT_BIN", "target/debug/commitpoint")
CLIENTS = 64
TRICKLE_FOR = 12.0
TOKEN = "admin-token-trickle-attack-01"


def start_server(work):
    token = os.path.join(work, "admin-token")
    with open(token, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token, 0o600)
    config = os.path.join(work, "config.toml")
    with open(config, "w") as f:
        f.write(f'[server]\nmax_connections = {CLIENTS}\nbody_read_timeout = "2s"\n'
                f'[access]\nadmin_token_file = "{token}"\n')
    out = open(os.path.join(work, "stdout"), "w+")
    server = subprocess.Popen(
        [BIN, "serve", "--config", config, "--data-dir", os.path.join(work, "data"), "--listen", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.DEVNULL, env=dict(os.environ, COMMITPOINT_LOG="warn"))
    for _ in range(300):
        out.seek(0)
        match = re.search(r"^commitpoint listening on http://(\S+):(\d+)", out.read(), re.M)
        if match:
            return server, (match.group(1), int(match.group(2)))
        if server.poll() is not None:
            break
        time.sleep(0.1)
    server.kill()
    sys.exit("commitpoint did not start")


def trickle(addr, stop, answered):
    try:
        conn = socket.create_connection(addr, timeout=2)
        conn.sendall(b"POST /ui/login HTTP/1.1\r\nhost: localhost\r\n"
                     b"content-type: application/x-www-form-urlencoded\r\ncontent-length: 1000\r\n\r\nt")
        conn.settimeout(0.5)
        while not stop.is_set():
            try:
                if conn.recv(4096):
                    answered.append(1)
                    # The attacker keeps at it on the same connection for as long as it is open.
                conn.sendall(b"o")
            except socket.timeout:
                conn.sendall(b"o")
            except OSError:
                return
    except OSError:
        return


def stats_status(addr):
    request = urllib.request.Request(f"http://{addr[0]}:{addr[1]}/v1/stats",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=3) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def main():
    work = tempfile.mkdtemp(prefix="commitpoint-trickle-")
    server, addr = start_server(work)
    stop, answered = threading.Event(), []
    try:
        threads = [threading.Thread(target=trickle, args=(addr, stop, answered), daemon=True) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        start = time.monotonic()
        time.sleep(0.5)
        held = stats_status(addr)
        print(f"    while {CLIENTS} logins trickle: /v1/stats answers {held}")
        back_after = None
        while time.monotonic() - start < TRICKLE_FOR:
            if stats_status(addr) == 200:
                back_after = time.monotonic() - start
                break
            time.sleep(0.25)
    finally:
        stop.set()
        server.terminate()
        server.wait(timeout=30)
    print(f"    trickling logins answered: {len(answered)} of {CLIENTS}")
    if back_after is not None and back_after < 6:
        print(f"ok  the API answered again {back_after:.1f} s into the attack (body_read_timeout = 2s)")
        return 0
    print(f"BROKEN  the API stayed unavailable while the logins trickled ({TRICKLE_FOR:.0f} s)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
