"""Shared fixtures. Integration tests get one real local stack per session, always stopped."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.stack.supervisor import Stack

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The direct APNs/FCM path: these tests drive the push consumer's own provider clients
    # (headers, a dead answer inside a batch). The SNS transport, the stack's default, has its
    # own tests (test_sns_push.py) and runs every shipped scenario (test_chaos_scenarios.py).
    with Stack(
        tmp_path_factory.mktemp("stack"), reference_overrides={"push_transport": "direct"}
    ) as running:
        yield running


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
