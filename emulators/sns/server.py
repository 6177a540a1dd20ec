"""The SNS endpoint server: the SNS API (AWS query protocol) and its control API on one port.

Run: ``python -m emulators.sns --port N [--host 127.0.0.1] [--apns-url U]
[--apns-sandbox-url U] [--apns-ca-file F] [--fcm-url U] [--fcm-ca-file F] [--sqs-url U]
[--account-id N] [--https-ca-file F] [--region R]`` (foreground). Prints ``sns endpoint listening
on http://HOST:PORT`` when ready;
exits 2 on bad arguments or a taken port, 0 on SIGTERM/SIGINT.

Control API (``/_sns/...``, JSON):

* ``GET /_sns/health`` -> ``{"ok", "applications", "endpoints", "topics", "pending_deliveries",
  "active_faults", "providers": {"apns", "apns_sandbox", "fcm", "sqs"}, "connections_opened":
  {"apns", "fcm"}, "fcm_tokens_fetched"}``
* ``GET /_sns/ledger?since=N&limit=M`` -> ``{"rows", "next"}``: every Publish to a platform
  endpoint (see :mod:`emulators.sns.ledger` for the row keys)
* ``GET /_sns/sms?since=N&limit=M`` -> ``{"rows", "next"}``: every SMS
* ``GET /_sns/deliveries?since=N&limit=M`` -> ``{"rows", "next"}``: every topic delivery (SQS,
  HTTP/S, SMS, platform endpoint) and confirmation sent, refused or failed, with the application
  event it carried (:mod:`emulators.sns.fanout`)
* ``GET /_sns/endpoint-events?since=N&limit=M`` -> ``{"rows", "next"}``: every change to a
  platform endpoint: ``event`` created / updated / deleted, ``by`` ``api`` (a caller's
  CreatePlatformEndpoint, SetEndpointAttributes, DeleteEndpoint) or ``sns`` (a provider's dead
  answer turned it off; ``reason`` InvalidPlatformToken), ``endpoint_arn``,
  ``application_arn``, ``token``, ``enabled`` after the change, ``changed`` (the attributes
  that changed)
* ``POST /_sns/sms/replies`` ``{"phoneNumber": "+1...", "text": "STOP"}`` -> ``{"optedOut"}``: a
  handset's reply; ``STOP`` (and AWS's other opt-out keywords) opts the number out
* ``POST /_sns/sms/opted-out`` ``{"phoneNumbers": ["+1...", ...]}`` -> ``{"optedOut"}`` (how
  many were not opted out before): numbers that replied STOP before the run, in one call (a
  test's or harness's population loads thousands)
* ``POST /_sns/faults`` ``{"fault": "throttle", "params": {"p"?, "rate"?}, "targets": [...] |
  null, "seed"?, "duration"?}`` -> ``{"id", "window"}`` (:mod:`emulators.sns.faults`);
  ``DELETE /_sns/faults/{id}`` -> ``{"window"}``; ``DELETE /_sns/faults`` -> ``{"stopped"}``;
  ``GET /_sns/faults/log`` -> ``{"windows"}``
* ``POST /_sns/reset``: drop every application, endpoint, topic, SMS setting and ledger row and
  stop every fault (the fault log is kept)
* ``GET /_sns/SimpleNotificationService.pem``: the certificate topic notifications are signed
  with
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from pathlib import Path
from typing import Any

from emulators.http_server import (
    ConnectionRegistry,
    PortInUseError,
    Request,
    Response,
    json_response,
    server_port,
    start_server,
    stop_on_signals,
)
from emulators.sns.common import ACCOUNT_ID
from emulators.sns.delivery import ApnsTransport, FcmTransport, SqsTransport
from emulators.sns.errors import SnsError
from emulators.sns.faults import ActiveFault, FaultState
from emulators.sns.http_delivery import HttpTransport
from emulators.sns.ledger import RowLog
from emulators.sns.model import REGION, SnsModel, valid_phone_number
from emulators.sns.protocol import SnsProtocol
from emulators.sns.service import SnsService

CONTROL_PREFIX = "/_sns/"
MAX_PAGE = 10_000
# Numbers one POST /_sns/sms/opted-out may name.
MAX_OPT_OUTS = 100_000


class SnsEndpoint:
    """The whole endpoint in one object: model, service, protocol, control API."""

    def __init__(
        self,
        *,
        apns_url: str | None = None,
        apns_sandbox_url: str | None = None,
        apns_ca_file: str | None = None,
        fcm_url: str | None = None,
        fcm_ca_file: str | None = None,
        sqs_url: str | None = None,
        region: str = REGION,
        account_id: str = ACCOUNT_ID,
        https_ca_file: str | None = None,
        provider_connections: int = 2,
        provider_timeout: float = 10.0,
    ) -> None:
        self.faults = FaultState()
        self.model = SnsModel(region, account_id=account_id)
        self.service = SnsService(
            self.model,
            self.faults,
            apns=ApnsTransport(
                apns_url,
                apns_sandbox_url,
                apns_ca_file,
                connections=provider_connections,
                timeout=provider_timeout,
            ),
            fcm=FcmTransport(
                fcm_url, fcm_ca_file, connections=provider_connections, timeout=provider_timeout
            ),
            sqs=SqsTransport(sqs_url, timeout=provider_timeout),
            http=HttpTransport(timeout=provider_timeout, ca_file=https_ca_file),
        )
        self.protocol = SnsProtocol(self.service)
        self.providers = {
            "apns": apns_url,
            "apns_sandbox": apns_sandbox_url or apns_url,
            "fcm": fcm_url,
            "sqs": sqs_url,
        }
        self._timers: dict[str, asyncio.TimerHandle] = {}

    async def handle(self, request: Request) -> Response:
        if request.path.startswith(CONTROL_PREFIX):
            return self.control(request)
        return await self.protocol.handle(request)

    # -- control API -----------------------------------------------------------------------------
    def control(self, request: Request) -> Response:
        path = request.path[len(CONTROL_PREFIX) :].rstrip("/")
        method = request.method
        routes = {
            ("GET", "ledger"): self.service.ledger,
            ("GET", "sms"): self.service.sms_ledger,
            ("GET", "deliveries"): self.service.deliveries,
            ("GET", "endpoint-events"): self.service.endpoint_events,
        }
        if (method, path) in routes:
            return self._page(request, routes[(method, path)])
        if (method, path) == ("GET", "health"):
            return json_response(200, self.health())
        if (method, path) == ("GET", "SimpleNotificationService.pem"):
            return Response(
                200,
                {"content-type": "application/x-pem-file"},
                self.service.signer.certificate_pem,
            )
        if (method, path) == ("POST", "sms/replies"):
            return self._reply(request)
        if (method, path) == ("POST", "sms/opted-out"):
            return self._opt_out_all(request)
        if (method, path) == ("GET", "faults/log"):
            return json_response(200, {"windows": self.faults.log()})
        if (method, path) == ("POST", "faults"):
            return self._start_fault(request)
        if (method, path) == ("DELETE", "faults"):
            return json_response(200, {"stopped": [f.window() for f in self._stop_all()]})
        if method == "DELETE" and path.startswith("faults/"):
            fault_id = path[len("faults/") :]
            stopped = self._stop(fault_id)
            known = stopped or self.faults.get(fault_id)
            if known is None:
                return json_response(404, {"error": f"no fault {fault_id}"})
            return json_response(200, {"window": known.window()})
        if (method, path) == ("POST", "reset"):
            stopped = self._stop_all()
            self.service.reset()
            return json_response(200, {"ok": True, "stopped_faults": len(stopped)})
        return json_response(404, {"error": f"no control route {method} {request.path}"})

    def health(self) -> dict[str, Any]:
        return {
            "ok": True,
            "applications": sum(len(m.applications) for m in self.service.models.values()),
            "endpoints": sum(len(m.endpoints) for m in self.service.models.values()),
            "topics": sum(len(m.topics) for m in self.service.models.values()),
            "pending_deliveries": self.service.pending_deliveries,
            "active_faults": [f.window() for f in self.faults.active()],
            "providers": self.providers,
            # HTTP/2 connections opened over the endpoint's life: a handful, not one per publish
            "connections_opened": {
                "apns": self.service.apns.connections_opened,
                "fcm": self.service.fcm.connections_opened,
            },
            "fcm_tokens_fetched": self.service.fcm.tokens_fetched,
        }

    @staticmethod
    def _page(request: Request, rows: RowLog) -> Response:
        try:
            since = int(request.query.get("since", "0"))
            limit = int(request.query.get("limit", str(MAX_PAGE)))
        except ValueError:
            return json_response(400, {"error": "since and limit must be whole numbers"})
        if since < 0 or not 1 <= limit <= MAX_PAGE:
            return json_response(
                400, {"error": f"since must be >= 0 and limit between 1 and {MAX_PAGE}"}
            )
        page, next_seq = rows.snapshot(since, limit)
        return json_response(200, {"rows": page, "next": next_seq})

    def _reply(self, request: Request) -> Response:
        try:
            body = request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("phoneNumber"), str):
            return json_response(
                400, {"error": 'body must be {"phoneNumber": "+15550100", "text": "STOP"}'}
            )
        text = body.get("text", "STOP")
        if not isinstance(text, str):
            return json_response(400, {"error": "text must be a string"})
        try:
            opted_out = self.service.handset_reply(body["phoneNumber"], text)
        except SnsError as exc:
            return json_response(400, {"error": exc.message})
        return json_response(200, {"optedOut": opted_out})

    def _opt_out_all(self, request: Request) -> Response:
        """Opt out many numbers at once; all are checked before any is changed."""
        try:
            body = request.json()
        except ValueError:
            body = None
        numbers = body.get("phoneNumbers") if isinstance(body, dict) else None
        if not isinstance(numbers, list) or len(numbers) > MAX_OPT_OUTS:
            return json_response(
                400,
                {"error": f'body must be {{"phoneNumbers": [...]}}, at most {MAX_OPT_OUTS}'},
            )
        try:
            checked = [valid_phone_number(n) for n in numbers]
        except SnsError as exc:
            return json_response(400, {"error": exc.message})
        return json_response(200, {"optedOut": sum(self.model.opt_out(n) for n in checked)})

    def _start_fault(self, request: Request) -> Response:
        try:
            body = request.json()
        except ValueError:
            return json_response(400, {"error": "body must be JSON"})
        if not isinstance(body, dict):
            return json_response(400, {"error": "body must be a JSON object"})
        duration = body.get("duration")
        if duration is not None and (
            isinstance(duration, bool) or not isinstance(duration, int | float) or duration <= 0
        ):
            return json_response(400, {"error": "duration must be a positive number of seconds"})
        try:
            active = self.faults.start(
                str(body.get("fault")), body.get("params"), body.get("targets"), body.get("seed")
            )
        except (ValueError, TypeError) as exc:
            return json_response(400, {"error": str(exc)})
        if duration is not None:
            loop = asyncio.get_running_loop()
            self._timers[active.id] = loop.call_later(float(duration), self._stop, active.id)
        return json_response(200, {"id": active.id, "window": active.window()})

    def _stop(self, fault_id: str) -> ActiveFault | None:
        timer = self._timers.pop(fault_id, None)
        if timer is not None:
            timer.cancel()
        return self.faults.stop(fault_id)

    def _stop_all(self) -> list[ActiveFault]:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        return self.faults.stop_all()

    # -- serving ---------------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> tuple[asyncio.Server, ConnectionRegistry]:
        registry = ConnectionRegistry()
        server = await start_server(self.handle, host, port, registry=registry)
        self.service.base_url = f"http://{_url_host(host)}:{server_port(server)}"
        return server, registry

    async def close(self) -> None:
        self._stop_all()
        await self.service.close()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


async def serve(host: str, port: int, **options: Any) -> None:
    """Serve until SIGTERM/SIGINT. Raises PortInUseError when the port is taken."""
    endpoint = SnsEndpoint(**options)
    server, registry = await endpoint.start(host, port)
    try:
        with stop_on_signals() as stop:
            print(f"sns endpoint listening on {endpoint.service.base_url}", flush=True)
            await stop.wait()
    finally:
        server.close()
        registry.close_all()
        await server.wait_closed()
        await endpoint.close()


def _url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {value!r}")
    return value.rstrip("/")


def _file(value: str) -> str:
    if not Path(value).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.sns",
        description="SNS endpoint (AWS query protocol) that delivers mobile push to the APNs and "
        "FCM simulators, records SMS, and delivers topic notifications to SQS.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--apns-url", type=_url, help="APNs base URL (https: TLS, http: h2c)")
    parser.add_argument("--apns-sandbox-url", type=_url, help="APNS_SANDBOX (default: --apns-url)")
    parser.add_argument("--apns-ca-file", type=_file, help="CA to trust for an https APNs URL")
    parser.add_argument("--fcm-url", type=_url, help="FCM HTTP v1 base URL (its /token too)")
    parser.add_argument("--fcm-ca-file", type=_file, help="CA to trust for an https FCM URL")
    parser.add_argument("--sqs-url", type=_url, help="SQS endpoint for sqs subscriptions")
    parser.add_argument(
        "--region", default=REGION, help="the region of requests that name none (unsigned)"
    )
    parser.add_argument(
        "--account-id", default=ACCOUNT_ID, help=f"the account in every ARN ({ACCOUNT_ID})"
    )
    parser.add_argument(
        "--https-ca-file", type=_file, help="CA to trust for https subscriptions (loopback)"
    )
    parser.add_argument(
        "--provider-connections", type=int, default=2, help="HTTP/2 connections per provider"
    )
    parser.add_argument("--provider-timeout", type=float, default=10.0, help="seconds")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.provider_connections < 1 or args.provider_timeout <= 0:
        parser.error("--provider-connections must be >= 1 and --provider-timeout > 0")
    if not re.fullmatch(r"\d{12}", args.account_id):
        parser.error("--account-id must be 12 digits")
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s %(message)s")
    options = {
        "apns_url": args.apns_url,
        "apns_sandbox_url": args.apns_sandbox_url,
        "apns_ca_file": args.apns_ca_file,
        "fcm_url": args.fcm_url,
        "fcm_ca_file": args.fcm_ca_file,
        "sqs_url": args.sqs_url,
        "region": args.region,
        "account_id": args.account_id,
        "https_ca_file": args.https_ca_file,
        "provider_connections": args.provider_connections,
        "provider_timeout": args.provider_timeout,
    }
    try:
        asyncio.run(serve(args.host, args.port, **options))
    except PortInUseError as exc:
        print(f"sns endpoint: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
