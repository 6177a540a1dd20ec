"""The SNS endpoint's pure parts: model, provider requests, answer classification, SMS, faults."""

from __future__ import annotations

import datetime
import json

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from emulators.sns import messages as msg
from emulators.sns.credentials import parse_credentials
from emulators.sns.errors import SnsError
from emulators.sns.faults import FaultState
from emulators.sns.model import ACCOUNT_ID, OrderedPages, SnsModel, valid_phone_number


def p8_key() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def apns_attributes(**extra: str) -> dict[str, str]:
    return {
        "PlatformCredential": p8_key(),
        "PlatformPrincipal": "ABCDE12345",
        "ApplePlatformTeamID": "TEAM123456",
        "ApplePlatformBundleID": "com.example.app",
        **extra,
    }


def service_account(project: str = "proj-7") -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return json.dumps(
        {
            "type": "service_account",
            "project_id": project,
            "client_email": f"sa@{project}.iam.gserviceaccount.com",
            "private_key": pem,
            "private_key_id": "k1",
        }
    )


@pytest.fixture
def model() -> SnsModel:
    return SnsModel()


def error_of(call, *args, **kwargs) -> SnsError:
    with pytest.raises(SnsError) as info:
        call(*args, **kwargs)
    return info.value


# -- paging -------------------------------------------------------------------------------------
def test_pages_survive_deletions_between_pages() -> None:
    pages = OrderedPages()
    keys = [f"k{i:03d}" for i in range(250)]
    for key in keys:
        pages.add(key)
    first, token = pages.page(None)
    assert first == keys[:100] and token
    for key in keys[95:110]:  # some already seen, some not yet
        pages.remove(key)
    second, token = pages.page(token)
    assert second == keys[110:210]
    third, token = pages.page(token)
    assert third == keys[210:] and token is None
    assert len(pages) == 235


def test_bad_next_token_is_invalid_parameter() -> None:
    err = error_of(OrderedPages().page, "not-a-token")
    assert (err.code, err.message) == ("InvalidParameter", "Invalid parameter: NextToken")


# -- platform applications and endpoints ---------------------------------------------------------
def test_create_platform_endpoint_is_idempotent_and_refuses_other_attributes(
    model: SnsModel,
) -> None:
    app = model.create_platform_application("ios", "APNS", apns_attributes())
    token = "ab" * 32
    endpoint, created = model.create_platform_endpoint(app.arn, token, "u1", {})
    again, created_again = model.create_platform_endpoint(app.arn, token, "u1", {})
    assert created and not created_again and again is endpoint
    err = error_of(model.create_platform_endpoint, app.arn, token, "u2", {})
    assert err.code == "InvalidParameter" and err.status == 400
    assert err.message == (
        f"Invalid parameter: Token Reason: Endpoint {endpoint.arn} already exists with the same "
        "Token, but different attributes."
    )
    err = error_of(model.create_platform_endpoint, app.arn, token, "u1", {"Enabled": "false"})
    assert "already exists with the same Token" in err.message


def test_a_disabled_endpoint_is_returned_when_enabled_is_not_named(model: SnsModel) -> None:
    app = model.create_platform_application("ios", "APNS", apns_attributes())
    endpoint, _ = model.create_platform_endpoint(app.arn, "cd" * 32, None, {})
    assert model.disable_endpoint(endpoint) is not None
    assert model.disable_endpoint(endpoint) is None  # already off: no second event
    again, created = model.create_platform_endpoint(app.arn, "cd" * 32, None, {})
    assert again is endpoint and not created and not again.enabled


def test_token_change_moves_the_idempotency_index(model: SnsModel) -> None:
    app = model.create_platform_application("ios", "APNS", apns_attributes())
    endpoint, _ = model.create_platform_endpoint(app.arn, "aa" * 32, None, {})
    change = model.set_endpoint_attributes(endpoint.arn, {"Token": "bb" * 32, "Enabled": "true"})
    assert change.changed == {"Token": "bb" * 32}
    fresh, created = model.create_platform_endpoint(app.arn, "aa" * 32, None, {})
    assert created and fresh.arn != endpoint.arn


def test_endpoint_and_application_errors(model: SnsModel) -> None:
    app = model.create_platform_application("ios", "APNS", apns_attributes())
    err = error_of(model.create_platform_endpoint, app.arn, "not-hex", None, {})
    assert err.code == "InvalidParameter" and "hexadecimal" in err.message
    missing = app.arn.replace("/ios", "/nope")
    assert error_of(model.application, missing).code == "NotFound"
    assert error_of(model.application, missing).status == 404
    other_account = app.arn.replace(ACCOUNT_ID, "123456789012")
    assert error_of(model.application, other_account).code == "AuthorizationError"
    assert error_of(model.application, "nonsense").code == "InvalidParameter"
    assert error_of(model.create_platform_application, "x y", "APNS", {}).code == (
        "InvalidParameter"
    )
    assert "not delivered" in error_of(model.create_platform_application, "w", "WNS", {}).message


def test_application_attributes_never_answer_the_credentials(model: SnsModel) -> None:
    app = model.create_platform_application(
        "ios", "APNS", apns_attributes(EventDeliveryFailure=f"arn:aws:sns:us-east-1:{ACCOUNT_ID}:t")
    )
    public = app.public_attributes()
    assert "PlatformCredential" not in public and "PlatformPrincipal" not in public
    assert public["AuthenticationMethod"] == "Token" and public["Enabled"] == "true"
    assert public["EventDeliveryFailure"].endswith(":t")


# -- credentials --------------------------------------------------------------------------------
def test_apns_token_credential_signs_an_es256_provider_token() -> None:
    attributes = apns_attributes()
    credential = parse_credentials("APNS", attributes)
    bearer = credential.bearer(now=1_700_000_000)
    key = serialization.load_pem_private_key(attributes["PlatformCredential"].encode(), None)
    claims = jwt.decode(
        bearer, key.public_key(), algorithms=["ES256"], options={"verify_iat": False}
    )
    assert claims == {"iss": "TEAM123456", "iat": 1_700_000_000}
    assert jwt.get_unverified_header(bearer)["kid"] == "ABCDE12345"
    assert credential.bearer(now=1_700_000_000 + 60) == bearer  # reused within 50 minutes
    assert credential.bearer(now=1_700_000_000 + 3001) != bearer


def test_apns_certificate_credential_takes_its_topic_from_the_uid() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(x509.ObjectIdentifier("0.9.2342.19200300.100.1.1"), "com.ex.cert"),
            x509.NameAttribute(NameOID.COMMON_NAME, "Apple Push Services: com.ex.cert"),
        ]
    )
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now)
        .sign(key, hashes.SHA256())
    )
    credential = parse_credentials(
        "APNS_SANDBOX",
        {
            "PlatformPrincipal": cert.public_bytes(serialization.Encoding.PEM).decode(),
            "PlatformCredential": key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ).decode(),
        },
    )
    assert credential.topic == "com.ex.cert" and credential.bearer() is None
    assert credential.public_attributes()["AppleCertificateExpiryDate"] == "2030-01-01T00:00:00Z"


def test_bad_credentials_are_invalid_parameter() -> None:
    assert (
        "service-account JSON"
        in error_of(
            parse_credentials, "GCM", {"PlatformCredential": "AAAA-legacy-server-key"}
        ).message
    )
    assert (
        "EC P-256"
        in error_of(
            parse_credentials,
            "APNS",
            {
                **apns_attributes(),
                "PlatformCredential": json.loads(service_account())["private_key"],
            },
        ).message
    )
    no_team = apns_attributes()
    del no_team["ApplePlatformTeamID"]
    assert "ApplePlatformTeamID" in error_of(parse_credentials, "APNS", no_team).message


def test_fcm_assertion_is_an_rs256_jwt_bearer_grant() -> None:
    info = json.loads(service_account("p1"))
    credential = parse_credentials("GCM", {"PlatformCredential": json.dumps(info)})
    assertion = credential.assertion("http://127.0.0.1:1/token", now=1_700_000_000)
    key = serialization.load_pem_private_key(info["private_key"].encode(), None)
    claims = jwt.decode(
        assertion,
        key.public_key(),
        algorithms=["RS256"],
        audience="http://127.0.0.1:1/token",
        options={"verify_exp": False, "verify_iat": False},
    )
    assert claims["iss"] == info["client_email"] and claims["scope"].endswith("firebase.messaging")
    assert claims["exp"] - claims["iat"] == 3600


# -- provider requests ----------------------------------------------------------------------------
def attrs(**values: str) -> dict[str, msg.Attribute]:
    return msg.message_attributes(
        {k: {"DataType": "String", "StringValue": v} for k, v in values.items()}
    )


def apns(text: str, platform_payload: bool = True, **values: str) -> msg.ProviderRequest:
    return msg.apns_request(
        platform="APNS",
        token="ab" * 32,
        text=text,
        is_platform_payload=platform_payload,
        attributes=attrs(**values),
        default_topic="com.example.app",
        bearer="jwt",
        message_id="11111111-2222-3333-4444-555555555555",
        published_at=1000.5,
    )


def test_apns_headers_from_the_reserved_attributes() -> None:
    request = apns(
        json.dumps({"aps": {"alert": "hi"}, "tenant_id": "t1", "notification_id": "n1"}),
        **{
            "AWS.SNS.MOBILE.APNS.COLLAPSE_ID": "c-1",
            "AWS.SNS.MOBILE.APNS.PRIORITY": "5",
            "AWS.SNS.MOBILE.APNS.TTL": "60",
            "AWS.SNS.MOBILE.APNS.PUSH_TYPE": "alert",
            "AWS.SNS.MOBILE.APNS.TOPIC": "com.example.other",
        },
    )
    assert request.path == f"/3/device/{'ab' * 32}"
    assert request.headers == {
        "apns-id": "11111111-2222-3333-4444-555555555555",
        "apns-push-type": "alert",
        "apns-priority": "5",
        "apns-topic": "com.example.other",
        "apns-expiration": "1060",
        "apns-collapse-id": "c-1",
        "authorization": "bearer jwt",
    }
    assert (request.collapse_id, request.tenant_id, request.notification_id) == ("c-1", "t1", "n1")


def test_apns_defaults_background_plain_and_ttl_zero() -> None:
    background = apns(json.dumps({"aps": {"content-available": 1}}))
    assert background.headers["apns-push-type"] == "background"
    assert background.headers["apns-priority"] == "5"
    assert (
        "apns-expiration" not in background.headers and "apns-collapse-id" not in background.headers
    )
    plain = apns("hello", platform_payload=False, **{"AWS.SNS.MOBILE.APNS.TTL": "0"})
    assert json.loads(plain.body) == {"aps": {"alert": "hello"}}
    assert plain.headers["apns-priority"] == "10" and plain.headers["apns-expiration"] == "0"
    assert plain.headers["apns-topic"] == "com.example.app"


def test_malformed_platform_payload_and_bad_priority_are_refused() -> None:
    assert error_of(apns, "not json").code == "InvalidParameter"
    err = error_of(apns, "{}", **{"AWS.SNS.MOBILE.APNS.PRIORITY": "11"})
    assert err.code == "ParameterValueInvalid"


def fcm(text: str, platform_payload: bool = True, **values: str) -> dict:
    request = msg.fcm_request(
        project_id="proj-7",
        token="tok:1",
        text=text,
        is_platform_payload=platform_payload,
        attributes=attrs(**values),
    )
    assert request.path == "/v1/projects/proj-7/messages:send"
    return json.loads(request.body)


def test_fcm_v1_message_gets_the_token_and_the_ttl_attribute() -> None:
    body = fcm(
        json.dumps(
            {
                "fcmV1Message": {
                    "message": {
                        "topic": "ignored",
                        "data": {"tenant_id": "t"},
                        "android": {"collapse_key": "k", "ttl": "9s"},
                    },
                    "validate_only": False,
                }
            }
        ),
        **{"AWS.SNS.MOBILE.FCM.TTL": "30"},
    )
    assert body == {
        "message": {
            "data": {"tenant_id": "t"},
            "android": {"collapse_key": "k", "ttl": "30s"},
            "token": "tok:1",
        },
        "validate_only": False,
    }


def test_the_older_gcm_ttl_attribute_is_still_read() -> None:
    body = fcm("hello", platform_payload=False, **{"AWS.SNS.MOBILE.GCM.TTL": "60"})
    assert body["message"]["android"] == {"ttl": "60s"}


def test_fcm_legacy_payload_and_plain_message() -> None:
    body = fcm(
        json.dumps(
            {
                "data": {"a": "1", "n": 2},
                "notification": {"title": "T", "body": "B", "sound": "default"},
                "collapse_key": "deals",
                "time_to_live": 3600,
                "priority": "high",
            }
        )
    )
    assert body["message"] == {
        "data": {"a": "1", "n": "2"},
        "notification": {"title": "T", "body": "B"},
        "android": {
            "notification": {"sound": "default"},
            "collapse_key": "deals",
            "ttl": "3600s",
            "priority": "HIGH",
        },
        "token": "tok:1",
    }
    assert fcm("hello", platform_payload=False) == {
        "message": {"data": {"default": "hello"}, "token": "tok:1"}
    }


def test_platform_message_falls_back_to_default() -> None:
    per = msg.structured(json.dumps({"default": "d", "GCM": "{}"}), "json")
    assert msg.platform_message("x", per, "GCM") == "{}"
    assert msg.platform_message("x", per, "APNS") == "d"
    assert msg.platform_message("x", None, "APNS") == "x"
    assert msg.platform_message("x", {"GCM": "{}"}, "APNS") is None
    assert error_of(msg.structured, "[1]", "json").code == "InvalidParameter"
    assert error_of(msg.structured, "{}", "text").message == "Invalid parameter: MessageStructure"


def test_message_attribute_checks() -> None:
    entries = {
        "n": {"DataType": "Number", "StringValue": "12.5"},
        "b": {"DataType": "Binary", "BinaryValue": "AAE="},
        "s": {"DataType": "String.custom", "StringValue": "x"},
    }
    parsed = msg.message_attributes(entries)
    assert parsed["b"].value == b"\x00\x01" and parsed["s"].data_type == "String.custom"
    for bad in (
        {"x": {"DataType": "String", "StringValue": ""}},
        {"x": {"DataType": "Number", "StringValue": "ten"}},
        {"x": {"DataType": "Date", "StringValue": "1"}},
        {"x": {"StringValue": "1"}},
        {"bad..name": {"DataType": "String", "StringValue": "1"}},
    ):
        assert error_of(msg.message_attributes, bad).code == "ParameterValueInvalid", bad


# -- provider answers ------------------------------------------------------------------------------
def apns_answer(status: int, reason: str | None = None, headers: dict | None = None) -> msg.Outcome:
    body = json.dumps({"reason": reason}).encode() if reason else b""
    return msg.classify("apns", status, headers or {}, body)


def fcm_answer(status: int, code: str | None, message: str = "") -> msg.Outcome:
    error: dict = {"code": status, "message": message, "status": "X"}
    if code:
        error["details"] = [{"@type": "x", "errorCode": code}]
    return msg.classify("fcm", status, {}, json.dumps({"error": error}).encode())


def test_classify_apns() -> None:
    assert apns_answer(200).kind == msg.DELIVERED
    assert apns_answer(410, "Unregistered").kind == msg.TOKEN_INVALID
    assert apns_answer(400, "BadDeviceToken").kind == msg.TOKEN_INVALID
    assert apns_answer(400, "BadPriority").kind == msg.REJECTED
    throttled = apns_answer(429, "TooManyRequests", {"retry-after": "7"})
    assert (throttled.kind, throttled.retry_after) == (msg.THROTTLED, 7.0)
    assert apns_answer(503, "ServiceUnavailable").kind == msg.PROVIDER_ERROR
    assert apns_answer(413, "PayloadTooLarge").reason == "PayloadTooLarge"


def test_classify_fcm() -> None:
    assert msg.classify("fcm", 200, {}, b"{}").kind == msg.DELIVERED
    assert fcm_answer(404, "UNREGISTERED").kind == msg.TOKEN_INVALID
    assert fcm_answer(403, "SENDER_ID_MISMATCH").kind == msg.TOKEN_INVALID
    bad_token = "The registration token is not a valid FCM registration token"
    assert fcm_answer(400, "INVALID_ARGUMENT", bad_token).kind == msg.TOKEN_INVALID
    assert fcm_answer(400, "INVALID_ARGUMENT", "Message is too big").kind == msg.REJECTED
    assert fcm_answer(404, None, "The requested URL was not found.").kind == msg.REJECTED
    assert fcm_answer(429, "QUOTA_EXCEEDED").kind == msg.THROTTLED
    assert fcm_answer(500, "INTERNAL").kind == msg.PROVIDER_ERROR


# -- SMS --------------------------------------------------------------------------------------------
def test_sms_parts_gsm_and_ucs2() -> None:
    assert msg.sms_parts("a" * 160) == ("GSM", 1)
    assert msg.sms_parts("a" * 161) == ("GSM", 2)
    assert msg.sms_parts("a" * 306) == ("GSM", 2) and msg.sms_parts("a" * 307) == ("GSM", 3)
    assert msg.sms_parts("€" * 80) == ("GSM", 1)  # two septets each
    assert msg.sms_parts("€" * 81) == ("GSM", 2)
    assert msg.sms_parts("ж" * 70) == ("UCS2", 1) and msg.sms_parts("ж" * 71) == ("UCS2", 2)


def test_e164_validation() -> None:
    assert valid_phone_number("+14155550100") == "+14155550100"
    for bad in ("14155550100", "+0123", "+1234567890123456", "+1 415", "", None):
        err = error_of(valid_phone_number, bad)
        assert err.code == "InvalidParameter"
        assert (
            err.message
            == f"Invalid parameter: PhoneNumber Reason: {bad} is not valid to publish to"
        )


def test_opt_in_only_once_every_30_days() -> None:
    now = [1000.0]
    model = SnsModel(clock=lambda: now[0])
    assert model.opt_out("+15550000001") and not model.opt_out("+15550000001")
    assert model.list_opted_out(None) == (["+15550000001"], None)
    model.opt_in("+15550000001")
    assert not model.is_opted_out("+15550000001")
    model.opt_out("+15550000001")
    now[0] += 29 * 86400
    assert "30 days" in error_of(model.opt_in, "+15550000001").message
    now[0] += 2 * 86400
    model.opt_in("+15550000001")
    assert model.list_opted_out(None) == ([], None)


def test_sms_attributes(model: SnsModel) -> None:
    model.set_sms_attributes({"DefaultSMSType": "Transactional", "DefaultSenderID": "Fanout1"})
    assert model.get_sms_attributes(["DefaultSMSType"]) == {"DefaultSMSType": "Transactional"}
    assert error_of(model.set_sms_attributes, {"DefaultSMSType": "Bulk"}).code == "InvalidParameter"
    assert error_of(model.set_sms_attributes, {"DefaultSenderID": "12345"}).code == (
        "InvalidParameter"
    )
    assert error_of(model.set_sms_attributes, {"Nope": "1"}).code == "InvalidParameter"


# -- faults -----------------------------------------------------------------------------------------
def test_throttle_rate_is_a_token_bucket() -> None:
    now = [0.0]
    faults = FaultState(monotonic=lambda: now[0])
    fault = faults.start("throttle", {"rate": 5}, targets=["app"])
    decisions = [faults.throttle("app") for _ in range(8)]
    assert decisions == [None] * 5 + [fault.id] * 3
    assert faults.throttle("other") is None  # out of scope
    now[0] += 0.4  # two tokens back
    assert [faults.throttle("app") for _ in range(3)] == [None, None, fault.id]
    faults.stop(fault.id)
    assert faults.throttle("app") is None
    assert faults.log()[0]["stopped_at"] is not None


def test_throttle_probability_repeats_with_its_seed() -> None:
    def draws(seed: int) -> list[bool]:
        faults = FaultState()
        faults.start("throttle", {"p": 0.5}, seed=seed)
        return [faults.throttle("sms") is not None for _ in range(200)]

    assert draws(3) == draws(3) and 60 < sum(draws(3)) < 140
    for bad in ({}, {"p": 2}, {"rate": 0}, {"p": 0.5, "burst": 1}):
        with pytest.raises(ValueError):
            FaultState().start("throttle", bad)
