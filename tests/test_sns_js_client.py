"""The SNS endpoint driven by a client that did not come from us: the AWS SDK for JavaScript v3
(``@aws-sdk/client-sns`` from npm, pinned in package-lock.json), against the real APNs and FCM
simulator processes. ``tests/sns_js_client.mjs`` does the SNS calls; this test prepares tokens,
runs it and checks what it saw against the simulators' and the endpoint's ledgers."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from emulators.providers.apns_keys import new_signing_key
from emulators.providers.fcm import write_service_account_file
from harness.stack.supervisor import ROOT, Stack

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "tests" / "sns_js_client.mjs"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("sns-js"), parts=["apns", "fcm", "sns"]) as up:
        yield up


def require_sdk() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: install the Debian package nodejs (make setup)")
    if not (ROOT / "node_modules" / "@aws-sdk" / "client-sns").is_dir():
        pytest.fail("@aws-sdk/client-sns is not installed in node_modules: run `make setup`")
    return node


def test_aws_sdk_for_javascript_v3_drives_the_endpoint(stack: Stack) -> None:
    node = require_sdk()
    apns, fcm, sns = (stack.info.url(p) for p in ("apns", "fcm", "sns"))
    tls = ssl.create_default_context(cafile=stack.info.tls_ca)
    live, dead = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    httpx.post(f"{apns}/_sim/tokens/unregistered", json={"tokens": [dead]}, verify=tls)
    account = Path(tempfile.mkdtemp()) / "sa.json"
    write_service_account_file(account, f"{fcm}/token", "js-sender")
    # the key sns_js_client.mjs names (ABCDE12345, team TEAM123456), registered with "Apple"
    signing = new_signing_key(team_id="TEAM123456", key_id="ABCDE12345")
    body = signing.registration(["com.example.js"])
    assert httpx.put(f"{apns}/_sim/apns/keys", json=body, verify=tls).status_code == 200
    key = signing.private_pem.encode()
    paging = [uuid.uuid4().hex * 2 for _ in range(120)]
    # the app's devices belong to its bundle, as Apple binds a token to its app
    bound = {"tokens": {token: "com.example.js" for token in (live, dead, *paging)}}
    assert httpx.put(f"{apns}/_sim/apns/topics", json=bound, verify=tls).status_code == 200
    config = {
        "sns": sns,
        "name": f"js-{uuid.uuid4().hex[:8]}",
        "p8Key": key.decode(),
        "serviceAccount": account.read_text(),
        "liveToken": live,
        "deadToken": dead,
        "fcmToken": f"js:{uuid.uuid4().hex}",
        "pagingTokens": paging,
        "phone": "+14155550123",
    }
    done = subprocess.run(
        [node, str(SCRIPT), json.dumps(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert seen["again"] == seen["endpoint"]
    assert seen["conflict"]["name"] == "InvalidParameterException"
    assert seen["conflict"]["status"] == 400
    assert seen["conflict"]["message"] == (
        f"Invalid parameter: Token Reason: Endpoint {seen['endpoint']} already exists with the "
        "same Token, but different attributes."
    )
    apns_rows = httpx.get(f"{apns}/_sim/ledger", verify=tls).json()["rows"]
    delivered = [r for r in apns_rows if r["apns_id"] == seen["apnsMessageId"]]
    assert [
        (r["token"], r["status"], r["collapse_id"], r["notification_id"]) for r in delivered
    ] == [(live, 200, "js-1", "js-1")]
    fcm_rows = httpx.get(f"{fcm}/_sim/ledger").json()["rows"]
    assert [(r["token"], r["project"], r["collapse_id"]) for r in fcm_rows] == [
        (config["fcmToken"], "js-sender", "js-2")
    ]
    assert [(r["token"], r["status"]) for r in apns_rows if r["token"] == dead] == [(dead, 410)]
    assert seen["deadAttributes"]["Enabled"] == "false"
    assert (seen["disabled"]["name"], seen["disabled"]["status"]) == (
        "EndpointDisabledException",
        400,
    )
    assert (seen["listed"], seen["listedUnique"], seen["pages"]) == (122, 122, 2)
    assert (seen["notFound"]["name"], seen["notFound"]["status"]) == ("NotFoundException", 404)
    assert seen["badPhone"]["name"] == "InvalidParameterException"
    assert seen["badPhone"]["message"].endswith("12345 is not valid to publish to")
    assert (seen["foreign"]["name"], seen["foreign"]["status"]) == (
        "AuthorizationErrorException",
        403,
    )
    assert seen["badAttribute"]["name"] == "InvalidParameterValueException"
    assert (seen["throttled"]["name"], seen["throttled"]["status"]) == ("Throttling", 400)
    assert seen["throttled"]["message"] == "Rate exceeded"
    assert (seen["throttledRetried"]["name"], seen["throttledRetried"]["attempts"]) == (
        "Throttling",
        3,
    )
    assert (seen["optedOutBefore"], seen["optedOutAfter"], seen["optedOutListed"]) == (
        False,
        True,
        True,
    )
    sms = httpx.get(f"{sns}/_sns/sms").json()["rows"]
    assert [(r["message_id"], r["delivered"], r["sms_type"]) for r in sms] == [
        (seen["smsMessageId"], True, "Transactional"),
        (seen["smsAfterStop"], False, "Promotional"),
    ]
    ledger = httpx.get(f"{sns}/_sns/ledger").json()["rows"]
    assert {r["outcome"] for r in ledger} == {
        "delivered",
        "token_invalid",
        "endpoint_disabled",
        "sns_throttled",
    }
    throttled = [r for r in ledger if r["outcome"] == "sns_throttled"]
    assert len(throttled) == 4  # one, then three attempts of the retrying client
