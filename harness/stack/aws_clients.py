"""boto3 clients for the harness's own calls (SQS probes, DLQ reads, audit reads, table writes):
one Session per process, since a client from a new Session parses its service model again
(~0.1 s of CPU each) and a run makes dozens."""

from __future__ import annotations

import os
import threading
from typing import Any

import boto3
from botocore.config import Config as BotoConfig

_LOCK = threading.Lock()  # a Session is not thread-safe; the clients it makes are
_SESSIONS: dict[int, boto3.session.Session] = {}


def aws_client(service: str, **kwargs: Any) -> Any:
    """``boto3.client`` from this process's one Session (a forked child makes its own); an S3
    client on a local endpoint uses path-style addressing (an IP has no bucket subdomains)."""
    if service == "s3" and kwargs.get("endpoint_url"):
        kwargs.setdefault("config", BotoConfig(s3={"addressing_style": "path"}))
    with _LOCK:
        pid = os.getpid()
        if pid not in _SESSIONS:
            _SESSIONS.clear()
            _SESSIONS[pid] = boto3.session.Session()
        return _SESSIONS[pid].client(service, **kwargs)
