"""What the faults act through: the fault proxy (with the PyPI toxiproxy-python client, so the
same faults work against a real Toxiproxy), the simulators' and SQS endpoint's control APIs, the
AWS fault proxy, and the stack's processes. Shared by the fault modules of this package."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from chaos.faults import ChaosTargets, FaultError


def toxiproxy_proxy(targets: ChaosTargets, name: str | None = None) -> Any:
    """A proxy of the fault proxy (the dedup store's unless ``name`` says another)."""
    if not targets.toxiproxy_url:
        raise FaultError("this target has no fault proxy (toxiproxy_url)")
    from toxiproxy import Toxiproxy

    url = httpx.URL(targets.toxiproxy_url)
    server = Toxiproxy()
    server.update_api_consumer(url.host, url.port)
    wanted = name or targets.dedup_proxy
    proxy = server.get_proxy(wanted)
    if proxy is None:
        known = ", ".join(sorted(server.proxies())) or "none"
        raise FaultError(f"the fault proxy has no proxy named {wanted!r} (it has: {known})")
    return proxy


def control_client(url: str | None, what: str, ca_file: str | None = None) -> httpx.Client:
    if not url:
        raise FaultError(f"this target has no {what}")
    verify: Any = ssl.create_default_context(cafile=ca_file) if ca_file else True
    return httpx.Client(base_url=url, verify=verify, timeout=10)


def simulator_fault(provider: str, fault: str) -> Callable[..., Callable[[], None]]:
    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        url, ca = {
            "apns": (targets.apns_url, targets.apns_ca_file),
            "fcm": (targets.fcm_url, None),
            "ses": (targets.ses_url, None),
            "inapp": (targets.inapp_url, None),
        }[provider]
        client = control_client(url, f"{provider} simulator", ca)
        body = {"fault": fault, "params": params}
        response = client.post("/_sim/faults", json=body)
        if response.status_code != 200:
            raise FaultError(f"{provider} simulator refused {body}: {response.text}")
        fault_id = response.json()["id"]

        def undo() -> None:
            client.delete(f"/_sim/faults/{fault_id}")
            client.close()

        return undo

    return start


def sqs_fault(fault: str) -> Callable[..., Callable[[], None]]:
    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        client = control_client(targets.sqs_url, "SQS endpoint with fault injection")
        fault_params = {k: v for k, v in params.items() if k != "queues"}
        body = {"fault": fault, "params": fault_params, "queues": params.get("queues")}
        response = client.post("/_sqs/faults", json=body)
        if response.status_code != 200:
            raise FaultError(f"SQS endpoint refused {body}: {response.text}")
        fault_id = response.json()["id"]

        def undo() -> None:
            client.delete(f"/_sqs/faults/{fault_id}")
            client.close()

        return undo

    return start


def sns_fault(fault: str) -> Callable[..., Callable[[], None]]:
    """A fault of the SNS endpoint (``POST /_sns/faults``); ``params.targets`` (platform
    application or topic ARNs, or ``"sms"``) narrows it, else it acts on every Publish."""

    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        client = control_client(targets.sns_url, "SNS endpoint")
        fault_params = {k: v for k, v in params.items() if k not in ("targets", "seed")}
        body: dict[str, Any] = {
            "fault": fault,
            "params": fault_params,
            "targets": params.get("targets"),
        }
        if "seed" in params:
            body["seed"] = params["seed"]
        response = client.post("/_sns/faults", json=body)
        if response.status_code != 200:
            raise FaultError(f"SNS endpoint refused {body}: {response.text}")
        fault_id = response.json()["id"]

        def undo() -> None:
            client.delete(f"/_sns/faults/{fault_id}")
            client.close()

        return undo

    return start


def dedup_toxic(toxic_type: str, attributes: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """A toxic on the dedup store's proxy."""
    return proxy_toxic(toxic_type, attributes, dedup=True)


def process_crash(part: str) -> Callable[..., Callable[[], None]]:
    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        processes = targets.processes
        if processes is None:
            raise FaultError("this target has no process hooks")
        processes.kill_part(part)  # kill -9: no cleanup, as a crash
        return lambda: processes.start_part(part)

    return start


def process_restart(part: str) -> Callable[..., Callable[[], None]]:
    """Stop ``part`` as a deploy does (SIGTERM: it finishes its batches and exits) at start,
    start it at stop: whatever it kept only in memory is gone, nothing is cut mid-send."""

    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        processes = targets.processes
        if processes is None:
            raise FaultError("this target has no process hooks")
        processes.stop_part(part)
        return lambda: processes.start_part(part)

    return start


def process_pause(part: str) -> Callable[..., Callable[[], None]]:
    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        processes = targets.processes
        if processes is None:
            raise FaultError("this target has no process hooks")
        processes.pause_part(part)  # SIGSTOP: its connections stay open, nothing answers
        return lambda: processes.resume_part(part)

    return start


def named_proxy(targets: ChaosTargets, params: dict[str, Any], dedup: bool = False) -> Any:
    """The proxy a fault names (``params.proxy``; the dedup store's with ``dedup``), through
    the Toxiproxy client."""
    if dedup:
        return toxiproxy_proxy(targets)
    name = params.get("proxy")
    if not isinstance(name, str) or not name:
        raise FaultError("this fault needs params.proxy: the name of a proxy of the target")
    return toxiproxy_proxy(targets, name)


def proxy_toxic(
    toxic_type: str, attributes: Callable[[dict[str, Any]], dict[str, Any]], dedup: bool = False
) -> Any:
    """A toxic on the proxy the fault names (a target's ``proxies`` entry), or on the dedup
    store's (``dedup``)."""

    def start(targets: ChaosTargets, params: dict[str, Any]) -> Callable[[], None]:
        proxy = named_proxy(targets, params, dedup)
        name = f"chaos_{toxic_type}_{uuid.uuid4().hex[:6]}"
        proxy.add_toxic(
            name=name,
            type=toxic_type,
            stream=params.get("stream", "downstream"),
            toxicity=float(params.get("toxicity", 1.0)),
            attributes=attributes(params),
        )
        return lambda: proxy.destroy_toxic(name)

    return start
