"""What the SNS endpoint puts on the wire to APNs and FCM: the real simulators, served in this
process on real sockets behind a recorder that keeps every request's headers (the simulators'
ledgers do not keep headers), and the endpoint itself, also in process, called over HTTP."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from emulators.h2_client import H2ClientConnection
from emulators.http_server import Request, Response, server_port, start_server
from emulators.providers.apns import ApnsSimulator
from emulators.providers.fcm import FcmSimulator, write_service_account_file
from emulators.sns.server import SnsEndpoint

pytestmark = pytest.mark.integration


class Recorder:
    """Wraps a simulator's handler: keeps each request, and can answer some itself first."""

    def __init__(self, handler: Callable[[Request], Awaitable[Response]]) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self.answer_first: list[Response] = []  # answered before the simulator sees the request

    async def __call__(self, request: Request) -> Response:
        if not request.path.startswith("/_sim/"):
            self.requests.append(request)
            if self.answer_first and request.path != "/token":
                return self.answer_first.pop(0)
        return await self.handler(request)


async def serve(handler: Callable[[Request], Awaitable[Response]]) -> tuple[Any, str]:
    server = await start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server_port(server)}"


async def call(client: httpx.AsyncClient, **params: str) -> httpx.Response:
    return await client.post("/", data=params)


def xml_value(response: httpx.Response, tag: str) -> str:
    text = response.text
    start = text.index(f"<{tag}>") + len(tag) + 2
    return text[start : text.index(f"</{tag}>", start)]


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


def test_apns_request_carries_the_provider_token_and_sns_headers() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()

    async def scenario() -> None:
        apns = Recorder(ApnsSimulator().handle)
        apns_server, apns_url = await serve(apns)
        sns = SnsEndpoint(apns_url=apns_url)
        sns_server, _ = await sns.start("127.0.0.1", 0)
        try:
            async with httpx.AsyncClient(base_url=sns.service.base_url, timeout=20) as client:
                created = await call(
                    client,
                    Action="CreatePlatformApplication",
                    Name="ios",
                    Platform="APNS",
                    **{
                        "Attributes.entry.1.key": "PlatformCredential",
                        "Attributes.entry.1.value": pem,
                        "Attributes.entry.2.key": "PlatformPrincipal",
                        "Attributes.entry.2.value": "KEYID12345",
                        "Attributes.entry.3.key": "ApplePlatformTeamID",
                        "Attributes.entry.3.value": "TEAMID1234",
                        "Attributes.entry.4.key": "ApplePlatformBundleID",
                        "Attributes.entry.4.value": "com.example.fanout",
                    },
                )
                app = xml_value(created, "PlatformApplicationArn")
                token = "ab" * 32
                made = await call(
                    client, Action="CreatePlatformEndpoint", PlatformApplicationArn=app, Token=token
                )
                arn = xml_value(made, "EndpointArn")
                before = int(time.time())
                published = await call(
                    client,
                    Action="Publish",
                    TargetArn=arn,
                    Message="plain text",
                    **{
                        "MessageAttributes.entry.1.Name": "AWS.SNS.MOBILE.APNS.TTL",
                        "MessageAttributes.entry.1.Value.DataType": "String",
                        "MessageAttributes.entry.1.Value.StringValue": "600",
                        "MessageAttributes.entry.2.Name": "AWS.SNS.MOBILE.APNS.COLLAPSE_ID",
                        "MessageAttributes.entry.2.Value.DataType": "String",
                        "MessageAttributes.entry.2.Value.StringValue": "c-9",
                    },
                )
                assert published.status_code == 200, published.text
                message_id = xml_value(published, "MessageId")
        finally:
            sns_server.close()
            await sns.close()
            apns_server.close()
        (request,) = apns.requests
        assert request.http_version == "2" and request.path == f"/3/device/{token}"
        headers = request.headers
        assert headers["apns-id"] == message_id
        assert headers["apns-topic"] == "com.example.fanout"
        assert (headers["apns-push-type"], headers["apns-priority"]) == ("alert", "10")
        assert headers["apns-collapse-id"] == "c-9"
        assert before + 600 <= int(headers["apns-expiration"]) <= int(time.time()) + 600
        scheme, bearer = headers["authorization"].split(" ", 1)
        assert scheme == "bearer"
        claims = jwt.decode(bearer, key.public_key(), algorithms=["ES256"])
        assert claims["iss"] == "TEAMID1234"
        assert jwt.get_unverified_header(bearer)["kid"] == "KEYID12345"
        assert json.loads(request.body) == {"aps": {"alert": "plain text"}}

    run(scenario)


def test_fcm_gets_one_oauth_token_and_a_fresh_one_after_a_401() -> None:
    async def scenario() -> None:
        simulator = FcmSimulator()
        fcm = Recorder(simulator.handle)
        fcm_server, fcm_url = await serve(fcm)
        account = Path(tempfile.mkdtemp()) / "sa.json"
        write_service_account_file(account, f"{fcm_url}/token", "proj-rec")
        sns = SnsEndpoint(fcm_url=fcm_url)
        sns_server, _ = await sns.start("127.0.0.1", 0)
        try:
            async with httpx.AsyncClient(base_url=sns.service.base_url, timeout=20) as client:
                created = await call(
                    client,
                    Action="CreatePlatformApplication",
                    Name="android",
                    Platform="GCM",
                    **{
                        "Attributes.entry.1.key": "PlatformCredential",
                        "Attributes.entry.1.value": account.read_text(),
                    },
                )
                app = xml_value(created, "PlatformApplicationArn")
                made = await call(
                    client, Action="CreatePlatformEndpoint", PlatformApplicationArn=app, Token="t:1"
                )
                arn = xml_value(made, "EndpointArn")
                # over HTTP/2 the endpoint runs each handler eagerly, outside a Task: five of
                # them wait on one token fetch
                h2 = await H2ClientConnection.open("127.0.0.1", server_port(sns_server))
                form = {"content-type": "application/x-www-form-urlencoded"}
                body = urlencode({"Action": "Publish", "TargetArn": arn, "Message": "hi"}).encode()
                try:
                    answers = await asyncio.gather(
                        *(h2.request("POST", "/", form, body) for _ in range(5))
                    )
                finally:
                    h2.close()
                assert [a.status for a in answers] == [200] * 5, answers[0].body
                assert simulator.tokens_issued == 1  # fetched once for five concurrent publishes
                fcm.answer_first.append(
                    Response(401, {"content-type": "application/json"}, b'{"error": {}}')
                )
                again = await call(client, Action="Publish", TargetArn=arn, Message="hi")
                assert again.status_code == 200, again.text
        finally:
            sns_server.close()
            await sns.close()
            fcm_server.close()
        assert simulator.tokens_issued == 2
        sends = [r for r in fcm.requests if r.path != "/token"]
        assert {r.path for r in sends} == {"/v1/projects/proj-rec/messages:send"}
        bearers = [r.headers["authorization"] for r in sends]
        assert all(b.startswith("Bearer ya29.sim-") for b in bearers)
        assert len(set(bearers)) == 2 and bearers[-2] == bearers[0] != bearers[-1]
        assert json.loads(sends[0].body) == {"message": {"data": {"default": "hi"}, "token": "t:1"}}
        grant = [r for r in fcm.requests if r.path == "/token"][0]
        assert b"grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer" in grant.body

    run(scenario)
