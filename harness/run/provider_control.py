"""Client for the provider simulators' control API (/_sim/...) and their ledgers.

The APNs and FCM simulators write their ledger to Arrow files (one per serving process,
:mod:`emulators.providers.ledger_files`) and say where (``GET /_sim/ledger/source``); when that
directory is on this machine, :meth:`SimulatorControl.new_rows` reads the files that grew since
its last call, and the simulator does no work for it. Otherwise (the SES and in-app simulators,
or a simulator on another machine) it pages ``GET /_sim/ledger?since=N``.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx

from emulators.providers.ledger_files import FORMAT, LedgerReader

# How long a read waits for the simulator's processes to write the rows they buffered.
FLUSH_WAIT_S = 2.0


class SimulatorControl:
    def __init__(self, url: str, ca_file: str | None = None) -> None:
        verify: Any = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self.http = httpx.Client(base_url=url, verify=verify, timeout=10)
        self.next = 0
        self._reader: LedgerReader | None = None
        self._source_known = False

    def reset(self) -> None:
        self.http.post("/_sim/reset").raise_for_status()
        self.next = 0  # the file reader sees the new epoch itself

    def set_payload_ids(self, paths: dict[str, str]) -> None:
        """Where the system's pushes name their tenant and notification (dotted paths)."""
        self.http.put("/_sim/payload-ids", json=paths).raise_for_status()

    def unregister(self, tokens: list[str], reason: str | None = None) -> None:
        """``reason`` (APNs): BadDeviceToken to have them answer 400 BadDeviceToken, not 410."""
        if tokens:
            body: dict[str, Any] = {"tokens": tokens}
            if reason is not None:
                body["reason"] = reason
            self.http.post("/_sim/tokens/unregistered", json=body).raise_for_status()

    def revive(self, tokens: list[str]) -> int:
        """Dead tokens answer as valid again (an app installed again); how many were dead."""
        if not tokens:
            return 0
        response = self.http.post("/_sim/tokens/revived", json={"tokens": tokens})
        response.raise_for_status()
        return int(response.json()["revived"])

    def project_quota(self, per_minute: int | None = None) -> int:
        """The FCM simulator's project quota (messages per project per minute), after setting
        it to ``per_minute`` when given (until the simulator's next reset)."""
        if per_minute is not None:
            self.http.put("/_sim/project-quota", json={"per_minute": per_minute}).raise_for_status()
        response = self.http.get("/_sim/project-quota")
        response.raise_for_status()
        return int(response.json()["per_minute"])

    def strict(self) -> bool:
        """Whether the FCM simulator enforces credentials and limits."""
        response = self.http.get("/_sim/strict")
        response.raise_for_status()
        return bool(response.json()["enabled"])

    def ledger_files(self) -> LedgerReader | None:
        """A reader of the simulator's ledger files, when they are on this machine."""
        if not self._source_known:
            self._source_known = True
            response = self.http.get("/_sim/ledger/source")
            if response.status_code == 200:
                source = response.json()
                directory = Path(str(source.get("dir", "")))
                if source.get("format") == FORMAT and (directory / "meta").is_file():
                    self._reader = LedgerReader(directory)
        return self._reader

    def new_rows(self) -> list[dict[str, Any]]:
        """Ledger rows not seen by an earlier call."""
        reader = self.ledger_files()
        if reader is not None:
            # the rows of every request answered before this call (bounded wait)
            reader.shared.wait_flushed(timeout=FLUSH_WAIT_S)
            rows = reader.read_new().to_pylist()
            self.next = reader.next
            return rows
        response = self.http.get("/_sim/ledger", params={"since": self.next})
        response.raise_for_status()
        data = response.json()
        self.next = data["next"]
        return data["rows"]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self.http.close()
