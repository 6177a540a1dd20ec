"""kinesis-shard-hold: one shard's records held from its consumer, then handed over in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.faults import ChaosTargets, FaultError, fault
from chaos.faults.adapters import control_client


@fault(
    "kinesis-shard-hold",
    "one Kinesis shard's records are held from its consumer (params: shard index, default 0;"
    " optional stream), then all delivered in order at the stop",
    needs="kinesis_proxy_url",
    needs_what="Kinesis fault proxy in front of its stream consumer (kinesis_listen)",
)
def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
    """The consumer of one shard gets no records (and its own iterator back) until the stop,
    then every held record in order: what a slow or stuck shard looks like from the fan-out."""
    unknown = sorted(set(params) - {"shard", "stream"})
    if unknown:
        raise FaultError(f"kinesis-shard-hold: unknown parameter(s) {', '.join(unknown)}")
    client = control_client(targets.kinesis_proxy_url, "Kinesis fault proxy (kinesis_listen)")
    body = {
        "fault": "hold_shard",
        "params": {"shard": params.get("shard", 0), "stream": params.get("stream")},
    }
    response = client.post("/_proxy/faults", json=body)
    if response.status_code != 200:
        client.close()
        raise FaultError(f"Kinesis fault proxy refused {body}: {response.text}")
    fault_id = response.json()["id"]

    def undo() -> None:
        client.delete(f"/_proxy/faults/{fault_id}").raise_for_status()
        client.close()

    return undo
