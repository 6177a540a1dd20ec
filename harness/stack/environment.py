"""A long-lived verification environment for a team's system (``python -m harness env up``).

A team's system runs for days; the harness's parts it talks to must too. ``env up --target
FILE`` starts, detached, every part the target file places on its own addresses: the APNs and
FCM simulators (``apns_listen``, ``fcm_listen``), the fault proxy in front of the dedup store
and of every ``proxies`` entry, the SQS and SNS endpoints (``sqs_listen``, ``sns_listen``), the
Kinesis fault proxy (``kinesis_listen``). They stay up across runs until ``env down``; ``harness
run --target FILE`` uses them while they are up (each run resets the simulators' ledgers, dead
tokens and faults and the proxies' toxics: it sees only itself), and starts its own otherwise.

The APNs simulator's TLS authority is written once, to ``<env dir>/tls/ca.pem``, and kept
across ``env down`` / ``env up``: a client trusts it once, as it trusts Apple's. The directory
is ``$HARNESS_ENV_DIR/<target name>`` (default ``.stack/env/<target name>`` in the checkout).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from emulators.providers.apns_keys import read_signing_key
from harness.stack.supervisor import (
    ROOT,
    Stack,
    StackError,
    StackInfo,
    status_from_file,
    stop_from_file,
)
from harness.stack.target import Target

ENV_FILE = "env.json"


def root() -> Path:
    return Path(os.environ.get("HARNESS_ENV_DIR", ROOT / ".stack" / "env"))


def directory(target: Target) -> Path:
    """Where the environment of ``target`` keeps its state, logs and TLS authority."""
    return root() / re.sub(r"[^A-Za-z0-9_.-]", "_", target.name)


def env_file(target: Target) -> Path:
    return directory(target) / ENV_FILE


def ca_file(target: Target) -> Path:
    """The APNs simulator's CA: trust this in the system's APNs client."""
    return directory(target) / "tls" / "ca.pem"


def _stack(target: Target) -> Stack:
    return Stack(directory(target), target=target, stack_file=env_file(target))


def running(target: Target) -> StackInfo | None:
    """The environment of ``target`` when it is up and every part of it alive, else None."""
    path = env_file(target)
    if not path.exists():
        return None
    try:
        info = StackInfo.read(path)
    except (StackError, ValueError, TypeError, KeyError):
        return None
    wanted = set(_stack(target).selected)
    states = status_from_file(path)
    if set(info.parts) != wanted or not all(s.startswith("running") for s in states.values()):
        return None
    return info


def up(target: Target) -> StackInfo:
    """Start the environment (detached); StackError when it is up already or a part fails."""
    path = env_file(target)
    if path.exists():
        alive = [p for p, s in status_from_file(path).items() if s.startswith("running")]
        if alive:
            raise StackError(
                f"the environment of {target.name} is already up ({path}); "
                f"`python -m harness env down --target FILE` first"
            )
        path.unlink()
    stack = _stack(target)
    if not stack.selected:
        raise StackError(
            f"{target.name} places no part of the harness (apns_listen, fcm_listen, "
            "dedup_listen, proxies, sqs_listen, sns_listen, kinesis_listen): nothing to start"
        )
    info = stack.up()
    stack.procs.clear()  # they run in their own sessions and outlive this command
    tell_payload_ids(info, target)
    path.write_text(info.to_json())
    return info


def tell_payload_ids(info: StackInfo, target: Target) -> None:
    """The simulators read a push's ids where the target's pushes carry them."""
    import ssl
    import urllib.request

    for provider in ("apns", "fcm"):
        if provider not in info.parts:
            continue
        ca = info.tls_ca if provider == "apns" else None
        context = ssl.create_default_context(cafile=ca) if ca else None
        body = json.dumps(target.payload_paths(provider)).encode()
        request = urllib.request.Request(
            f"{info.url(provider)}/_sim/payload-ids", data=body, method="PUT"
        )
        with urllib.request.urlopen(request, timeout=10, context=context):
            pass


def down(target: Target) -> list[str]:
    """Stop the environment's parts; the TLS authority and logs stay."""
    path = env_file(target)
    if not path.exists():
        return []
    return stop_from_file(path)


def status(target: Target) -> dict[str, str]:
    path = env_file(target)
    return status_from_file(path) if path.exists() else {}


def describe(info: StackInfo, target: Target) -> list[str]:
    """What a team points its system at, in plain lines."""
    lines = []
    for name, part in info.parts.items():
        lines.append(f"  {name:<14} pid {part.pid:<7} {part.url or ''}")
    if "apns" in info.parts and info.tls_ca:
        lines.append(
            f"APNs over TLS: trust {info.tls_ca} (kept across env down/up); e.g. Node "
            "NODE_EXTRA_CA_CERTS, Python ssl.create_default_context(cafile=...), curl --cacert"
        )
    if "apns" in info.parts and info.apns_key_dir:
        key = read_signing_key(Path(info.apns_key_dir))
        lines.append(
            f"APNs token auth: sign ES256 provider tokens with {info.apns_key_dir}/"
            f"{key.file_name} (key id {key.key_id}, team {key.team_id}), or declare your own "
            "keys in apns_keys; pushes name apns-topic "
            f"{target.apns_topic or '(any bundle: apns_topic not set)'}"
        )
    if "fcm" in info.parts:
        lines.append(
            f"FCM: OAuth2 tokens from {info.url('fcm')}/token (the token_uri of a service-account "
            "file; see docs/TARGETS.md), sends to "
            f"{info.url('fcm')}/v1/projects/<project>/messages:send"
            + (f"; a service-account file for it: {info.fcm_credentials}" if info.fcm_credentials
               else "")
        )  # fmt: skip
    if "toxiproxy" in info.parts:
        lines.append(f"fault proxy API (Toxiproxy 2.x): {info.url('toxiproxy')}")
    return lines
