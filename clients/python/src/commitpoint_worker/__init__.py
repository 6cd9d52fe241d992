"""A worker client for commitpoint's external-worker API (docs/API.md, "Worker clients")."""

from .client import ApiError, Client, Grant, IllegalTransition, Reasked, RetryPolicy, StaleLease
from .worker import Answer, WorkStats, work

__all__ = [
    "Answer",
    "ApiError",
    "Client",
    "Grant",
    "IllegalTransition",
    "Reasked",
    "RetryPolicy",
    "StaleLease",
    "WorkStats",
    "work",
]
