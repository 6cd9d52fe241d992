"""The lease-aware work loop: claim, run the handler while a heartbeat extends the lease,
post the result, and move on whatever the server answers."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

from .client import ApiError, Client, Grant, IllegalTransition, Reasked, StaleLease

log = logging.getLogger("commitpoint_worker")


@dataclass(frozen=True)
class Answer:
    """What a handler returns when it also reports its model call's usage."""

    output: Any
    usage: Optional[Mapping[str, Any]] = None


Handler = Callable[[Grant], Union[Answer, Any]]


@dataclass
class WorkStats:
    committed: int = 0
    replays: int = 0
    stale: int = 0
    refused: int = 0
    extensions: int = 0
    handler_errors: int = 0


class _Heartbeat:
    """Extends the lease every `every` seconds until stopped; notes when the lease is lost."""

    def __init__(self, client: Client, grant: Grant, lease_seconds: int, every: float, stats: WorkStats) -> None:
        self._client, self._grant, self._lease_seconds, self._every = client, grant, lease_seconds, every
        self._stats = stats
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{grant.extraction_id[:12]}", daemon=True)

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._client.extend_lease(self._grant.extraction_id, self._grant.lease_token, self._lease_seconds)
                self._stats.extensions += 1
            except (StaleLease, IllegalTransition) as e:
                # Another worker has the work, or it ended: the result will be refused or a replay.
                log.warning("lease of %s lost: %s", self._grant.extraction_id, e)
                self.lost.set()
                return
            except Exception as e:  # noqa: BLE001 - a missed heartbeat is retried at the next beat
                log.warning("heartbeat for %s failed: %s", self._grant.extraction_id, e)


def work(
    client: Client,
    handler: Handler,
    *,
    worker: str,
    schema: Optional[str] = None,
    lease_seconds: int = 300,
    heartbeat_seconds: Optional[float] = None,
    idle_seconds: float = 1.0,
    stop: Optional[threading.Event] = None,
    until_idle: bool = False,
) -> WorkStats:
    """Claims one extraction at a time and answers it with `handler(grant)` (its output, or
    an `Answer` with usage) until `stop` is set, or, with `until_idle`, until a claim finds
    no work. The heartbeat extends the lease every `heartbeat_seconds` (a third of the lease
    by default), so a handler may take longer than `lease_seconds`. A handler that raises
    leaves the lease to expire and the work to be claimed again."""
    stop = stop or threading.Event()
    every = heartbeat_seconds if heartbeat_seconds is not None else max(lease_seconds / 3.0, 0.5)
    stats = WorkStats()
    while not stop.is_set():
        grants = client.claim(worker, limit=1, lease_seconds=lease_seconds, schema=schema)
        if not grants:
            if until_idle:
                break
            stop.wait(idle_seconds)
            continue
        grant = grants[0]
        with _Heartbeat(client, grant, lease_seconds, every, stats) as heartbeat:
            try:
                answer = handler(grant)
            except Exception:  # noqa: BLE001 - the handler's failure is the work's, not the loop's
                log.exception("handler failed on %s; its lease will expire", grant.extraction_id)
                stats.handler_errors += 1
                continue
        if heartbeat.lost.is_set():
            log.info("posting %s although its lease was lost: the server decides", grant.extraction_id)
        answer = answer if isinstance(answer, Answer) else Answer(answer)
        try:
            reply = client.post_result(grant.extraction_id, grant.lease_token, answer.output, usage=answer.usage)
        except StaleLease:
            stats.stale += 1
        except (Reasked, IllegalTransition) as e:
            log.warning("result for %s refused: %s", grant.extraction_id, e)
            stats.refused += 1
        except ApiError as e:
            if e.status != 422:
                raise
            log.warning("result for %s refused: %s", grant.extraction_id, e)
            stats.refused += 1
        else:
            if reply.get("replay"):
                stats.replays += 1
            else:
                stats.committed += 1
    return stats
