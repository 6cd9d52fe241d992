"""The client's retries, against a local stub server: no commitpoint needed."""

from __future__ import annotations

import json
import sys
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from commitpoint_worker import ApiError, Client, RetryPolicy, StaleLease  # noqa: E402

# Each request takes the next (status, headers, body) of the script; the last one repeats.
Script = List[Tuple[int, Dict[str, str], Dict[str, Any]]]


def serve(script: Script) -> Tuple[ThreadingHTTPServer, List[str]]:
    seen: List[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.append(self.headers.get("Authorization", ""))
            status, headers, body = script[min(len(seen) - 1, len(script) - 1)]
            payload = json.dumps(body).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def error(code: str) -> Dict[str, Any]:
    return {"error": {"code": code, "message": code}}


class Retries(unittest.TestCase):
    def client(self, server: ThreadingHTTPServer, slept: List[float], attempts: int = 6) -> Client:
        return Client(f"http://127.0.0.1:{server.server_address[1]}", "tok", retry=RetryPolicy(attempts=attempts, base_seconds=0.001), sleep=slept.append)

    def test_429_and_503_are_retried_no_sooner_than_retry_after(self) -> None:
        lease = {"lease_token": "lt", "lease_expires_at": "2026-12-06T00:00:00Z"}
        server, seen = serve([(429, {"Retry-After": "7"}, error("rate_limited")), (503, {}, error("store_unavailable")), (200, {}, lease)])
        slept: List[float] = []
        self.assertEqual(self.client(server, slept).extend_lease("id", "lt", 60), lease["lease_expires_at"])
        self.assertEqual(len(seen), 3)
        self.assertEqual(seen[0], "Bearer tok")
        self.assertGreaterEqual(slept[0], 7.0, "Retry-After is a floor")
        self.assertLess(slept[1], 1.0, "no Retry-After: the short backoff")
        server.shutdown()
        server.server_close()

    def test_a_refusal_is_not_retried_and_raises_its_class(self) -> None:
        server, seen = serve([(409, {}, error("stale_lease"))])
        with self.assertRaises(StaleLease) as raised:
            self.client(server, []).post_result("id", "lt", {"findings": []})
        self.assertEqual((raised.exception.status, raised.exception.code, len(seen)), (409, "stale_lease", 1))
        server.shutdown()
        server.server_close()

    def test_the_last_attempt_raises_the_server_error(self) -> None:
        server, seen = serve([(502, {}, error("bad_gateway"))])
        with self.assertRaises(ApiError) as raised:
            self.client(server, [], attempts=3).claim("w")
        self.assertEqual((raised.exception.status, len(seen)), (502, 3))
        server.shutdown()
        server.server_close()

    def test_a_refused_connection_is_retried_then_raised(self) -> None:
        slept: List[float] = []
        client = Client("http://127.0.0.1:1", retry=RetryPolicy(attempts=3, base_seconds=0.001), sleep=slept.append)
        with self.assertRaises(OSError):
            client.claim("w")
        self.assertEqual(len(slept), 2, "two waits between three attempts")


if __name__ == "__main__":
    unittest.main()
