"""Client for the provider simulators' control API (/_sim/...)."""

from __future__ import annotations

import ssl
from typing import Any

import httpx


class SimulatorControl:
    def __init__(self, url: str, ca_file: str | None = None) -> None:
        verify: Any = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self.http = httpx.Client(base_url=url, verify=verify, timeout=10)
        self.next = 0

    def reset(self) -> None:
        self.http.post("/_sim/reset").raise_for_status()
        self.next = 0

    def unregister(self, tokens: list[str]) -> None:
        if tokens:
            self.http.post("/_sim/tokens/unregistered", json={"tokens": tokens}).raise_for_status()

    def new_rows(self) -> list[dict[str, Any]]:
        """Ledger rows not seen by an earlier call."""
        response = self.http.get("/_sim/ledger", params={"since": self.next})
        response.raise_for_status()
        data = response.json()
        self.next = data["next"]
        return data["rows"]

    def close(self) -> None:
        self.http.close()
