"""The HTTP calls a worker makes, with retries where a retry is safe.

Every call is retried with exponential backoff on a connection error, 429 and 5xx,
honouring `Retry-After`. That is safe for each of them: a result posted twice is answered
as a replay, an extension sets the same expiry again, and a claim whose answer was lost
leaves a lease that simply expires (the work is handed out again after `lease_seconds`).
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Type


class ApiError(Exception):
    """An answer of the documented error shape `{"error": {"code", "message", "details"?}}`."""

    def __init__(self, status: int, code: str, message: str, details: Optional[Any] = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class StaleLease(ApiError):
    """`409 stale_lease`: the token is not the current lease; another worker has the work."""


class IllegalTransition(ApiError):
    """`409 illegal_transition`: the extraction is committed, failed or cancelled."""


class Reasked(ApiError):
    """`422 reasked`: the output failed the schema and the work went back to the queue."""


_ERRORS: Dict[str, Type[ApiError]] = {"stale_lease": StaleLease, "illegal_transition": IllegalTransition, "reasked": Reasked}

# Statuses worth another try: the server is busy (429) or briefly unable (5xx).
_RETRYABLE = {429, 500, 502, 503, 504}


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base_seconds: float = 0.2
    max_seconds: float = 10.0

    def delay(self, attempt: int, retry_after: Optional[float]) -> float:
        """Full-jitter backoff, never shorter than the server's `Retry-After`."""
        backoff = random.uniform(0, min(self.max_seconds, self.base_seconds * (2**attempt)))
        return max(backoff, retry_after or 0.0)


@dataclass(frozen=True)
class Grant:
    """One claimed extraction (`ClaimGrant` in the OpenAPI document)."""

    extraction_id: str
    lease_token: str
    lease_expires_at: str
    tenant: str
    source_id: str
    schema: str
    attempt: int
    content: str
    instructions: str
    schema_url: str
    metadata: Optional[Dict[str, Any]] = None
    previous_attempt: Optional[Dict[str, Any]] = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Grant":
        return cls(
            extraction_id=str(body["extraction_id"]),
            lease_token=str(body["lease_token"]),
            lease_expires_at=str(body["lease_expires_at"]),
            tenant=str(body["tenant"]),
            source_id=str(body["source_id"]),
            schema=str(body["schema"]),
            attempt=int(body["attempt"]),
            content=str(body["content"]),
            instructions=str(body.get("instructions", "")),
            schema_url=str(body.get("schema_url", "")),
            metadata=body.get("metadata"),
            previous_attempt=body.get("previous_attempt"),
        )


@dataclass
class Client:
    """`base_url` like `http://127.0.0.1:7878`; `token` a worker token (or the admin token)."""

    base_url: str
    token: Optional[str] = None
    timeout: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    sleep: Callable[[float], None] = time.sleep

    def claim(self, worker: str, *, limit: int = 1, lease_seconds: int = 300, schema: Optional[str] = None) -> List[Grant]:
        body: Dict[str, Any] = {"worker": worker, "limit": limit, "lease_seconds": lease_seconds}
        if schema is not None:
            body["schema"] = schema
        answer = self.request("POST", "/v1/claims", body)
        return [Grant.from_json(g) for g in answer["claims"]]

    def extend_lease(self, extraction_id: str, lease_token: str, lease_seconds: int) -> str:
        """The lease's new expiry (RFC 3339); raises `StaleLease` once the work is another's."""
        body = {"lease_token": lease_token, "lease_seconds": lease_seconds}
        return str(self.request("POST", f"/v1/extractions/{extraction_id}/lease", body)["lease_expires_at"])

    def post_result(
        self,
        extraction_id: str,
        lease_token: str,
        output: Any,
        *,
        usage: Optional[Mapping[str, Any]] = None,
        reask: bool = True,
    ) -> Dict[str, Any]:
        """`{"state": "committed", "findings": N, "replay": bool}`; `replay` when it was
        already committed (this post again, or a late worker's)."""
        body: Dict[str, Any] = {"lease_token": lease_token, "output": output, "reask": reask}
        if usage is not None:
            body["usage"] = dict(usage)
        return dict(self.request("POST", f"/v1/extractions/{extraction_id}/result", body))

    def submit(self, tenant: str, source_id: str, schema: str, content: str, metadata: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {"tenant": tenant, "source_id": source_id, "schema": schema, "content": content}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        return dict(self.request("POST", "/v1/extractions", body))

    def extraction(self, extraction_id: str) -> Dict[str, Any]:
        return dict(self.request("GET", f"/v1/extractions/{extraction_id}"))

    def request(self, method: str, path: str, body: Optional[Any] = None) -> Any:
        """One call with retries; an error answer raises `ApiError` (or a subclass)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        url = self.base_url.rstrip("/") + path
        for attempt in range(self.retry.attempts):
            last = attempt == self.retry.attempts - 1
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read() or b"null")
            except urllib.error.HTTPError as e:
                with e:
                    status, text = e.code, e.read()
                if status in _RETRYABLE and not last:
                    self.sleep(self.retry.delay(attempt, _retry_after(e.headers.get("Retry-After"))))
                    continue
                raise _error(status, text) from None
            except OSError:
                # Refused or reset connections, timeouts, DNS: URLError and socket errors alike.
                if last:
                    raise
                self.sleep(self.retry.delay(attempt, None))
        raise AssertionError("unreachable: the last attempt returns or raises")


def _retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a `Retry-After` of delta-seconds; an HTTP date is not sent by commitpoint."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _error(status: int, text: bytes) -> ApiError:
    try:
        error = json.loads(text)["error"]
        code, message, details = str(error["code"]), str(error["message"]), error.get("details")
    except (ValueError, KeyError, TypeError):
        code, message, details = "unexpected_answer", text[:200].decode(errors="replace"), None
    return _ERRORS.get(code, ApiError)(status, code, message, details)


__all__: Sequence[str] = ["ApiError", "Client", "Grant", "IllegalTransition", "Reasked", "RetryPolicy", "StaleLease"]
