"""The channel split (seed 000): push, email and in-app queues, each job with its tenant as a
message attribute, and email / in-app consumers as real as push, against SES and API Gateway
Management API simulators that answer boto3 as AWS does."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import httpx
import pandas as pd
import pytest
from botocore.exceptions import ClientError
from helpers import TenantClient, apns_token, audit_lines
from sim_process import Sim, run_sim

from emulators.sns.faults import SnsControl
from harness.checkers import channel_delivery
from harness.checkers.evidence import evidence_from
from harness.checkers.registry import run_probe
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import SWITCHED_OFF
from harness.model.history import History
from harness.model.oracle import (
    expected_channel_deliveries,
    never_texted,
    switched_off_deliveries,
)
from harness.model.population import (
    Author,
    Device,
    Population,
    PopulationSpec,
    User,
    consent_stands,
    generate,
    preferences_body,
)
from harness.model.system import SystemPolicy
from harness.run.channel_ledgers import ChannelLedgers, append_channel_rows, register_online_users
from harness.run.provider_control import SimulatorControl
from harness.stack.supervisor import Stack, wait_until
from reference_impl.channel_consumer import EmailConsumer, SmsConsumer
from reference_impl.channel_providers import InAppClient, SesClient
from reference_impl.config import DEFAULT_CHANNELS_BY_KIND, PAGES_QUEUE, Config, ConfigError
from reference_impl.fanout import FanoutEvent, follower_jobs
from reference_impl.fanout_worker import FanoutWorker
from reference_impl.ids import valid_phone

KEYS = {"region_name": "us-east-1", "aws_access_key_id": "x", "aws_secret_access_key": "y"}
KEYS_CONFIG = {"aws_access_key_id": "x", "aws_secret_access_key": "y"}
CONSENT = {"granted_at": "2026-01-01T00:00:00+00:00", "version": "1"}
REVOKED = {**CONSENT, "revoked_at": "2026-06-01T00:00:00+00:00"}
NID = "01JD5V3KX9B9Q0ZC4S6Y2M8N7P"


def _simple(subject: str = "s") -> dict[str, Any]:
    return {"Simple": {"Subject": {"Data": subject}, "Body": {"Text": {"Data": "body"}}}}


def _error(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = exc.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


# -- simulators, through boto3 -----------------------------------------------------------------


@pytest.fixture(scope="module")
def ses_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with run_sim("emulators.providers.ses", tmp_path_factory.mktemp("ses")) as sim:
        yield sim


@pytest.fixture(scope="module")
def inapp_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with run_sim("emulators.providers.inapp", tmp_path_factory.mktemp("inapp")) as sim:
        yield sim


def test_ses_simulator_answers_the_sesv2_client(ses_sim: Sim) -> None:
    ses_sim.reset()
    ses = boto3.client("sesv2", endpoint_url=ses_sim.url, **KEYS)
    sent = ses.send_email(
        FromEmailAddress="Notifications <notify@example.com>",
        Destination={"ToAddresses": ["ada@example.com"], "CcAddresses": ["bob@example.com"]},
        Content={
            "Simple": {
                **_simple()["Simple"],
                "Headers": [{"Name": "X-Fanout-Tenant-Id", "Value": "acme.eu"}],
            }
        },
        EmailTags=[{"Name": "notification_id", "Value": NID}],
    )
    assert sent["MessageId"]
    rows = ses_sim.ledger()
    assert [(r["token"], r["status"], r["delivered"]) for r in rows] == [
        ("ada@example.com", 200, True),
        ("bob@example.com", 200, True),
    ]
    assert {(r["provider"], r["tenant_id"], r["notification_id"]) for r in rows} == {
        ("ses", "acme.eu", NID)
    }

    # A raw MIME message may name its recipients in its own headers.
    raw = b"From: a@example.com\r\nTo: raw@example.com\r\nSubject: x\r\n\r\nhi"
    ses.send_email(Content={"Raw": {"Data": raw}})
    assert ses_sim.ledger()[-1]["token"] == "raw@example.com"

    with pytest.raises(ClientError) as missing:
        ses.send_email(FromEmailAddress="a@example.com", Content=_simple())
    assert _error(missing) == ("BadRequestException", 400)
    with pytest.raises(ClientError) as bad_tag:
        ses.send_email(
            FromEmailAddress="a@example.com",
            Destination={"ToAddresses": ["ada@example.com"]},
            Content=_simple(),
            EmailTags=[{"Name": "tenant_id", "Value": "acme.eu"}],  # '.' is not a tag character
        )
    assert _error(bad_tag) == ("BadRequestException", 400)
    with pytest.raises(ClientError) as bad_address:
        ses.send_email(
            FromEmailAddress="a@example.com",
            Destination={"ToAddresses": ["not-an-address"]},
            Content=_simple(),
        )
    assert _error(bad_address) == ("BadRequestException", 400)

    status, _ = ses_sim.control(
        "POST", "/_sim/addresses/bounced", {"addresses": ["ADA@example.com"]}
    )
    assert status == 200
    with pytest.raises(ClientError) as rejected:
        ses.send_email(
            FromEmailAddress="a@example.com",
            Destination={"ToAddresses": ["ada@example.com"]},
            Content=_simple(),
        )
    assert _error(rejected) == ("MessageRejected", 400)
    last = ses_sim.ledger()[-1]
    assert (last["token"], last["status"], last["reason"], last["delivered"]) == (
        "ada@example.com",
        400,
        "MessageRejected",
        False,
    )


def test_inapp_simulator_answers_the_apigatewaymanagementapi_client(inapp_sim: Sim) -> None:
    inapp_sim.reset()
    gateway = boto3.client("apigatewaymanagementapi", endpoint_url=inapp_sim.url + "/prod", **KEYS)
    data = json.dumps({"tenant_id": "acme", "notification_id": NID}).encode()
    with pytest.raises(ClientError) as gone:
        gateway.post_to_connection(ConnectionId="acme:u1", Data=data)
    assert _error(gone) == ("GoneException", 410)

    assert inapp_sim.control("POST", "/_sim/connections", {"connections": ["acme:u1"]})[0] == 200
    answer = gateway.post_to_connection(ConnectionId="acme:u1", Data=data)
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert isinstance(gateway.get_connection(ConnectionId="acme:u1")["ConnectedAt"], datetime)
    with pytest.raises(ClientError) as too_large:
        gateway.post_to_connection(ConnectionId="acme:u1", Data=b"x" * (128 * 1024 + 1))
    assert _error(too_large) == ("PayloadTooLargeException", 413)

    gateway.delete_connection(ConnectionId="acme:u1")
    with pytest.raises(ClientError) as gone_again:
        gateway.post_to_connection(ConnectionId="acme:u1", Data=data)
    assert _error(gone_again) == ("GoneException", 410)
    rows = inapp_sim.ledger()
    assert [(r["token"], r["status"], r["delivered"]) for r in rows] == [
        ("acme:u1", 410, False),
        ("acme:u1", 200, True),
        ("acme:u1", 413, False),
        ("acme:u1", 410, False),
    ]
    assert rows[1]["tenant_id"] == "acme" and rows[1]["notification_id"] == NID


def test_channel_clients_classify_the_simulators_answers(ses_sim: Sim, inapp_sim: Sim) -> None:
    """What the consumers do with each answer: sent, rejected (ack), retry (no ack), offline."""
    ses_sim.reset()
    inapp_sim.reset()
    config = Config(ses_url=ses_sim.url, inapp_url=inapp_sim.url, **KEYS_CONFIG)
    job = {"tenant_id": "acme.eu", "notification_id": NID, "author_id": "a", "kind": "mention"}
    ses, gateway = SesClient(config), InAppClient(config)
    assert ses.send("ada@example.com", job).outcome == "sent"
    assert ses_sim.ledger()[-1]["tenant_id"] == "acme.eu"  # via the header, not a tag
    fault = ses_sim.start_fault("status", {"status": 429, "retry_after": 3})
    throttled = ses.send("ada@example.com", job)
    assert (throttled.outcome, throttled.status, throttled.retry_after) == ("retry", 429, 3.0)
    ses_sim.stop_fault(fault["id"])
    ses_sim.control("POST", "/_sim/addresses/bounced", {"addresses": ["gone@example.com"]})
    assert ses.send("gone@example.com", job).outcome == "rejected"

    assert gateway.send("acme.eu:u1", job).outcome == "offline"
    inapp_sim.control("POST", "/_sim/connections", {"connections": ["acme.eu:u1"]})
    assert gateway.send("acme.eu:u1", job).outcome == "sent"
    fault = inapp_sim.start_fault("status", {"status": 429})
    assert gateway.send("acme.eu:u1", job).outcome == "retry"
    inapp_sim.stop_fault(fault["id"])


def test_chaos_ses_and_inapp_status_faults_reach_the_simulators(
    ses_sim: Sim, inapp_sim: Sim
) -> None:
    """``ses-status`` and ``inapp-status`` (the chaos catalogue, as a scenario starts them) make
    the simulators answer 503 / 500 until undone: a consumer's reading of a channel's 5xx is
    exercised by a run, not only by this module's client tests."""
    from chaos.faults import ChaosTargets, make_fault

    ses_sim.reset()
    inapp_sim.reset()
    config = Config(ses_url=ses_sim.url, inapp_url=inapp_sim.url, **KEYS_CONFIG)
    job = {"tenant_id": "acme.eu", "notification_id": NID, "author_id": "a", "kind": "mention"}
    ses, gateway = SesClient(config), InAppClient(config)
    inapp_sim.control("POST", "/_sim/connections", {"connections": ["acme.eu:u1"]})
    targets = ChaosTargets(ses_url=ses_sim.url, inapp_url=inapp_sim.url)
    faults = [
        make_fault("ses-status", {"p": 1.0, "status": 503}),
        make_fault("inapp-status", {"p": 1.0, "status": 500}),
    ]
    for fault in faults:
        fault.start(targets, None)
    try:
        failed = ses.send("ada@example.com", job)
        assert (failed.outcome, failed.status) == ("retry", 503)
        assert gateway.send("acme.eu:u1", job).outcome == "retry"
    finally:
        for fault in faults:
            fault.stop(targets, None)
    assert ses.send("ada@example.com", job).outcome == "sent"
    assert gateway.send("acme.eu:u1", job).outcome == "sent"
    with pytest.raises(Exception, match="no SES simulator"):
        make_fault("ses-status", {"p": 1.0, "status": 503}).start(ChaosTargets(), None)


# -- routing, population, oracle, checker (pure) ------------------------------------------------


def test_channels_by_kind_routes_mentions_to_four_channels_and_the_rest_to_push() -> None:
    config = Config()
    assert config.channels_for("post") == ("push",)
    assert config.channels_for("mention") == ("push", "email", "in_app", "sms")
    assert config.channels_for("unknown-kind") == ("push",)
    event = FanoutEvent("acme", "a", "mention", "o", NID, "2026-11-22T12:00:00+00:00")
    jobs = follower_jobs(event, ["u1", "u2"], config.channels_for("mention"))
    assert [(j["recipient_user_id"], j["channel"]) for j in jobs] == [
        ("u1", "push"),
        ("u1", "email"),
        ("u1", "in_app"),
        ("u1", "sms"),
        ("u2", "push"),
        ("u2", "email"),
        ("u2", "in_app"),
        ("u2", "sms"),
    ]
    assert Config.from_mapping({"channels_by_kind": {"post": ["email"]}}).channels_for("post") == (
        "email",
    )
    with pytest.raises(ConfigError, match="channels_by_kind"):
        Config.from_mapping({"channels_by_kind": {"post": ["pigeon"]}})
    with pytest.raises(ConfigError, match="channels_by_kind"):
        Config.from_mapping({"channels_by_kind": {"post": []}})


def test_channel_attributes_leave_the_push_population_as_it_was() -> None:
    start = datetime(2026, 11, 22, 12, tzinfo=UTC)
    spec = PopulationSpec(tenants=1, users_per_tenant=40, celebrity_followers=20)
    none = generate(7, start, PopulationSpec(**{**spec.__dict__, "email_fraction": 0.0}))
    every = generate(7, start, PopulationSpec(**{**spec.__dict__, "email_fraction": 1.0}))
    push_fields = ("tenant_id", "user_id", "zone", "quiet_hours", "consent", "quiet_state")
    assert [[getattr(u, f) for f in push_fields] for u in none.users] == [
        [getattr(u, f) for f in push_fields] for u in every.users
    ]
    assert none.devices == every.devices and none.authors == every.authors
    assert all(u.email is None for u in none.users)
    assert all(u.email and u.email.endswith("@mail.example.com") for u in every.users)
    assert any(u.online for u in every.users) and not all(u.online for u in every.users)
    # Of those without email consent, some never gave it, some withdrew it (record kept).
    without = [u.email_consent for u in every.users if not consent_stands(u.email_consent)]
    assert None in without and any(c and c["revoked_at"] for c in without)


def _channel_population() -> Population:
    t = "acme"
    users = [
        User(t, "a", "UTC", None, CONSENT, "none", None),
        User(t, "both", "UTC", None, CONSENT, "none", None, "both@x.example", CONSENT, True),
        User(t, "no-consent", "UTC", None, CONSENT, "none", None, "nc@x.example", None, True),
        User(t, "offline", "UTC", None, CONSENT, "none", None, "off@x.example", CONSENT, False),
        User(t, "no-email", "UTC", None, CONSENT, "none", None, None, None, True),
        # Withdrawn, the record kept: no email either.
        User(t, "revoked", "UTC", None, CONSENT, "none", None, "rv@x.example", REVOKED, False),
    ]
    devices = [Device(t, "both", "apns", apns_token(1, "p"), False)]
    followers = ("both", "no-consent", "offline", "no-email", "revoked")
    return Population(0, 0.0, PopulationSpec(), users, devices, [Author(t, "a", False, followers)])


def test_oracle_expects_email_with_address_and_consent_and_in_app_when_online() -> None:
    population = _channel_population()
    history = History()  # as the runner records accepted events: the event kind in detail
    for nid, kind in (("N1", "mention"), ("N2", "post")):
        history.append("inject", tenant_id="acme", author_id="a", notification_id=nid, detail=kind)
    injected = history.frame().query("kind == 'inject'")
    rows = expected_channel_deliveries(population, injected, DEFAULT_CHANNELS_BY_KIND)
    assert sorted(rows.itertuples(index=False, name=None)) == [
        ("acme", "N1", "acme:both", "in_app"),
        ("acme", "N1", "acme:no-consent", "in_app"),
        ("acme", "N1", "acme:no-email", "in_app"),
        ("acme", "N1", "both@x.example", "email"),
        ("acme", "N1", "off@x.example", "email"),
    ]


def _history(rows: list[tuple[str, str, str, str, int]]) -> pd.DataFrame:
    history = History()
    history.append("inject", tenant_id="acme", notification_id="N1", detail="mention")
    ledger = [
        {
            "provider": provider,
            "token": token,
            "tenant_id": "acme",
            "notification_id": nid,
            "status": status,
            "delivered": status == 200,
            "received_at": 1.0,
        }
        for provider, nid, token, _, status in rows
    ]
    append_channel_rows(history, ledger)
    return history.frame()


EXPECTED = pd.DataFrame(
    [("acme", "N1", "ada@x.example", "email"), ("acme", "N1", "acme:ada", "in_app")],
    columns=["tenant_id", "notification_id", "token", "channel"],
)


def test_channel_checker_passes_exactly_once_per_channel() -> None:
    history = _history(
        [
            ("ses", "N1", "ada@x.example", "email", 200),
            ("inapp", "N1", "acme:ada", "in_app", 429),  # a retried answer is no delivery
            ("inapp", "N1", "acme:ada", "in_app", 200),
            ("inapp", "N1", "acme:bob", "in_app", 410),  # offline: not delivered, not unexpected
        ]
    )
    verdict = channel_delivery.check(EXPECTED, history)
    assert verdict.valid, verdict
    assert verdict.counts["email_delivered"] == verdict.counts["in_app_delivered"] == 1
    assert verdict.counts["duplicated"] == verdict.counts["lost"] == 0


def test_channel_checker_fails_on_a_duplicate_email() -> None:
    history = _history(
        [
            ("ses", "N1", "ada@x.example", "email", 200),
            ("ses", "N1", "ada@x.example", "email", 200),
            ("inapp", "N1", "acme:ada", "in_app", 200),
        ]
    )
    verdict = channel_delivery.check(EXPECTED, history)
    assert not verdict.valid
    assert verdict.counts["email_duplicated"] == 1 and verdict.counts["in_app_duplicated"] == 0
    assert verdict.details["channels"]["email"]["duplicate_examples"][0]["n"] == 2
    assert channel_delivery.check(EXPECTED, history, max_duplicated=1).valid


def test_channel_checker_fails_on_a_lost_email_and_an_unexpected_one() -> None:
    history = _history(
        [
            ("inapp", "N1", "acme:ada", "in_app", 200),
            ("ses", "N1", "eve@x.example", "email", 200),
        ]
    )
    verdict = channel_delivery.check(EXPECTED, history)
    assert not verdict.valid
    assert verdict.counts["email_lost"] == 1 and verdict.counts["email_unexpected"] == 1
    assert verdict.counts["in_app_lost"] == 0
    assert verdict.details["channels"]["email"]["lost_examples"] == [
        {"tenant_id": "acme", "notification_id": "N1", "token": "ada@x.example"}
    ]


# -- on the stack ------------------------------------------------------------------------------


# -- channel switches (seed 000: a user can turn a channel off) --------------------------------


def test_channel_switches_come_from_a_stream_of_their_own() -> None:
    """Every other field of every user, and the devices and authors, are what the seed gave
    before the switches existed; a user with nothing off sends the body it always sent."""
    start = datetime(2026, 11, 22, 12, tzinfo=UTC)
    spec = PopulationSpec(tenants=2, users_per_tenant=60, celebrity_followers=20)
    none, default, every = (
        generate(7, start, dataclasses.replace(spec, channel_off_fraction=f))
        for f in (0.0, spec.channel_off_fraction, 1.0)
    )

    def rest(population: Population) -> list[dict[str, Any]]:
        return [{k: v for k, v in vars(u).items() if k != "channels_off"} for u in population.users]

    assert rest(none) == rest(default) == rest(every)
    assert none.devices == default.devices == every.devices
    assert none.authors == default.authors == every.authors
    assert all(u.channels_off == () for u in none.users)
    assert all(u.channels_off == ("email", "in_app", "sms") for u in every.users)
    for channel in ("email", "in_app", "sms"):
        off = [u for u in default.users if channel in u.channels_off]
        assert 0 < len(off) < len(default.users) / 2, channel
    assert preferences_body(none.users[0])["channels"] == {"push": True}
    assert preferences_body(every.users[0])["channels"] == {
        "push": True, "email": False, "in_app": False, "sms": False
    }  # fmt: skip
    mixed = next(u for u in default.users if u.channels_off == ("sms",))
    assert preferences_body(mixed)["channels"] == {"push": True, "sms": False}


def test_a_population_file_without_switches_loads_with_every_channel_on(tmp_path: Any) -> None:
    start = datetime(2026, 11, 22, 12, tzinfo=UTC)
    spec = PopulationSpec(tenants=1, users_per_tenant=40, celebrity_followers=20)
    population = generate(3, start, dataclasses.replace(spec, channel_off_fraction=0.5))
    assert any(u.channels_off for u in population.users)
    population.save(tmp_path / "new.json")
    assert Population.load(tmp_path / "new.json").to_dict() == population.to_dict()
    # As a file written before the switches: no field on the users, none in the spec.
    old = population.to_dict()
    old["spec"].pop("channel_off_fraction")
    for user in old["users"]:
        user.pop("channels_off")
    (tmp_path / "old.json").write_text(json.dumps(old))
    loaded = Population.load(tmp_path / "old.json")
    assert all(u.channels_off == () for u in loaded.users)
    assert loaded.spec.channel_off_fraction == 0.0
    assert all(preferences_body(u)["channels"] == {"push": True} for u in loaded.users)


def _switch_population() -> Population:
    """Followers who would get every channel but switched some off, and one whose switch is
    moot (no email consent: withheld for that, not for the switch)."""
    t, phone = "acme", "+44770000001{}".format
    on = {"email_consent": CONSENT, "online": True, "sms_consent": CONSENT}
    users = [
        User(t, "a", "UTC", None, CONSENT, "none", None),
        User(t, "all-on", "UTC", None, CONSENT, "none", None, "on@x.example", phone=phone(1),
             **on),
        User(t, "mail-off", "UTC", None, CONSENT, "none", None, "mo@x.example", phone=phone(2),
             channels_off=("email",), **on),
        User(t, "all-off", "UTC", None, CONSENT, "none", None, "ao@x.example", phone=phone(3),
             channels_off=("email", "in_app", "sms"), **on),
        User(t, "moot", "UTC", None, CONSENT, "none", None, "mt@x.example",
             channels_off=("email",)),
    ]  # fmt: skip
    followers = tuple(u.user_id for u in users[1:])
    return Population(0, 0.0, PopulationSpec(), users, [], [Author(t, "a", False, followers)])


def _mention_injected() -> pd.DataFrame:
    history = History()
    history.append("inject", tenant_id="acme", author_id="a", notification_id="N1",
                   detail="mention")  # fmt: skip
    return history.frame().query("kind == 'inject'")


def test_oracle_expects_nothing_on_a_channel_the_user_switched_off() -> None:
    population, injected = _switch_population(), _mention_injected()
    rows = expected_channel_deliveries(population, injected, DEFAULT_CHANNELS_BY_KIND)
    assert sorted(rows.itertuples(index=False, name=None)) == [
        ("acme", "N1", "+447700000011", "sms"),
        ("acme", "N1", "+447700000012", "sms"),
        ("acme", "N1", "acme:all-on", "in_app"),
        ("acme", "N1", "acme:mail-off", "in_app"),
        ("acme", "N1", "on@x.example", "email"),
    ]
    withheld = switched_off_deliveries(population, injected, DEFAULT_CHANNELS_BY_KIND)
    assert sorted(withheld.itertuples(index=False, name=None)) == [
        ("acme", "N1", "+447700000013", "sms"),
        ("acme", "N1", "acme:all-off", "in_app"),
        ("acme", "N1", "ao@x.example", "email"),
        ("acme", "N1", "mo@x.example", "email"),
    ]  # not the moot one: no consent withholds it whatever the switch


def test_channel_checker_fails_a_delivery_to_a_switched_off_channel() -> None:
    population, injected = _switch_population(), _mention_injected()
    expected = expected_channel_deliveries(population, injected, DEFAULT_CHANNELS_BY_KIND)
    withheld = switched_off_deliveries(population, injected, DEFAULT_CHANNELS_BY_KIND)
    right = [
        ("ses", "N1", "on@x.example", "email", 200),
        ("inapp", "N1", "acme:all-on", "in_app", 200),
        ("inapp", "N1", "acme:mail-off", "in_app", 200),
        ("sms", "N1", "+447700000011", "sms", 200),
        ("sms", "N1", "+447700000012", "sms", 200),
    ]
    verdict = channel_delivery.check(expected, _history(right), switched_off_rows=withheld)
    assert verdict.valid, verdict
    assert (verdict.counts["email_withheld_by_switch"], verdict.counts["in_app_to_switched_off"],
            verdict.counts["withheld_by_switch"]) == (2, 0, 4)  # fmt: skip
    mailed = _history([*right, ("ses", "N1", "mo@x.example", "email", 200),
                       ("inapp", "N1", "acme:all-off", "in_app", 410)])  # fmt: skip
    verdict = channel_delivery.check(expected, mailed, switched_off_rows=withheld)
    assert not verdict.valid
    assert verdict.counts["email_to_switched_off"] == verdict.counts["email_unexpected"] == 1
    assert verdict.counts["in_app_to_switched_off"] == 0  # the gateway refused it: not delivered
    assert verdict.details["channels"]["email"]["to_switched_off_examples"] == [
        {"tenant_id": "acme", "notification_id": "N1", "token": "mo@x.example", "n": 1}
    ]
    # Told nothing of the switches, the checker still fails it (the oracle never expected it).
    blind = channel_delivery.check(expected, mailed)
    assert not blind.valid and blind.counts["email_unexpected"] == 1


def _put_user(t: TenantClient, user: str, **prefs: Any) -> None:
    body = {"zone": "UTC", "quiet_hours": None, "push_consent": CONSENT, **prefs}
    t.api.put(f"/v1/tenants/{t.tenant}/users/{user}/preferences", json=body).raise_for_status()


def _ledger(url: str, tenant: str) -> list[dict[str, Any]]:
    rows = httpx.get(f"{url}/_sim/ledger", params={"since": 0}, timeout=10).json()["rows"]
    return [r for r in rows if r["tenant_id"] == tenant]


def _queue_idle(sqs: Any, url: str) -> bool:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (
        int(attrs["ApproximateNumberOfMessages"])
        + int(attrs["ApproximateNumberOfMessagesNotVisible"])
        + int(attrs["ApproximateNumberOfMessagesDelayed"])
    ) == 0


@pytest.mark.integration
def test_a_mention_is_queued_per_channel_with_the_tenant_attribute(stack: Stack) -> None:
    """The fan-out worker against queues of its own (the running consumers drain the stack's)."""
    t = TenantClient(stack)
    t.follow("writer", ["m1", "m2"])
    prefix = f"chq-{uuid.uuid4().hex[:8]}"
    config = Config.from_mapping(
        {**json.loads(Config.load(stack.info.reference_config).to_json()), "audit_bucket": None}
        | {"queue_prefix": prefix}
    )
    sqs = stack.info.aws_client("sqs")
    urls = {
        c: sqs.create_queue(QueueName=config.queue_name(c))["QueueUrl"]
        for c in ("push", "email", "in_app", "sms")
    }
    # The page-task queues the worker resolves at start (unused: two followers are one page).
    spare = [
        sqs.create_queue(QueueName=config.queue_name(PAGES_QUEUE, suffix))["QueueUrl"]
        for suffix in ("", "-poison")
    ]
    event = FanoutEvent(t.tenant, "writer", "mention", "o1", NID, datetime.now(UTC).isoformat())
    assert FanoutWorker(config).fan_out(event) == {"tier": "write", "jobs": 8}
    post = FanoutEvent(t.tenant, "writer", "post", "o2", NID, datetime.now(UTC).isoformat())
    assert FanoutWorker(config).fan_out(post)["jobs"] == 2
    for channel, url in urls.items():
        messages = []
        for _ in range(10):
            messages += sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                MessageAttributeNames=["All"],
                WaitTimeSeconds=0,
            ).get("Messages", [])
            if len(messages) >= (4 if channel == "push" else 2):
                break
        bodies = [json.loads(m["Body"]) for m in messages]
        assert {m["MessageAttributes"]["tenant_id"]["StringValue"] for m in messages} == {t.tenant}
        assert {b["channel"] for b in bodies} == {channel}
        expected_kinds = (
            ["mention", "mention", "post", "post"] if channel == "push" else ["mention"] * 2
        )
        assert sorted(b["kind"] for b in bodies) == expected_kinds
        assert sorted(b["recipient_user_id"] for b in bodies if b["kind"] == "mention") == [
            "m1",
            "m2",
        ]
        sqs.delete_queue(QueueUrl=url)
    for url in spare:
        sqs.delete_queue(QueueUrl=url)


@pytest.mark.integration
def test_a_mention_reaches_ses_and_the_gateway_exactly_once(stack: Stack) -> None:
    t = TenantClient(stack)
    ses_url, inapp_url = stack.info.url("ses"), stack.info.url("inapp")
    token = apns_token(1, t.tenant)
    _put_user(t, "both", email="both@x.example", email_consent=CONSENT)
    t.api.put(f"/v1/tenants/{t.tenant}/users/both/devices/{token}", json={"platform": "apns"})
    _put_user(t, "no-consent", email="nc@x.example")  # email but no email consent; offline
    _put_user(t, "no-email", email_consent=CONSENT)  # consent, but no address; offline
    t.follow("author", ["both", "no-consent", "no-email"])
    online = User(t.tenant, "both", "UTC", None, None, "none", None, online=True)
    population = Population(0, 0.0, PopulationSpec(), [online])
    assert register_online_users(inapp_url, population) == 1

    nid = t.post("author", kind="mention")
    wait_until(
        lambda: (
            len(_ledger(ses_url, t.tenant)) >= 1
            and len(_ledger(inapp_url, t.tenant)) >= 3
            and len(t.rows_for(nid)) >= 1
        ),
        30,
        "the mention's email, in-app and push requests",
        interval=0.1,
    )

    # SQS delivers the same jobs again (twice more): the dedup keys hold.
    sqs = stack.info.aws_client("sqs")
    queues = {
        c: sqs.get_queue_url(QueueName=f"fanout-{c}")["QueueUrl"] for c in ("email", "in_app")
    }
    accepted = datetime.now(UTC).isoformat()
    for channel, url in queues.items():
        job = {
            "tenant_id": t.tenant, "author_id": "author", "kind": "mention", "object_id": "o1",
            "notification_id": nid, "accepted_at": accepted, "recipient_user_id": "both",
            "channel": channel,
        }  # fmt: skip
        for _ in range(2):
            sqs.send_message(
                QueueUrl=url,
                MessageBody=json.dumps(job),
                MessageAttributes={"tenant_id": {"DataType": "String", "StringValue": t.tenant}},
            )
    # A job without its tenant attribute is poison, not a retry.
    sqs.send_message(QueueUrl=queues["email"], MessageBody=json.dumps({**job, "channel": "email"}))

    def audited(part: str, outcome: str) -> list[dict[str, Any]]:
        return [
            r
            for r in audit_lines(stack, part)
            if r["audit"] == outcome and r["tenant_id"] == t.tenant
        ]

    wait_until(
        lambda: (
            len(audited("email-consumer", "deduped")) >= 2
            and len(audited("in-app-consumer", "deduped")) >= 2
            and all(_queue_idle(sqs, url) for url in queues.values())
        ),
        30,
        "the duplicate jobs to be deduplicated and the queues to drain",
        interval=0.2,
    )
    emails = _ledger(ses_url, t.tenant)
    assert [(r["token"], r["notification_id"], r["status"]) for r in emails] == [
        ("both@x.example", nid, 200)
    ]
    gateway = sorted((r["token"], r["status"]) for r in _ledger(inapp_url, t.tenant))
    # Offline users: one 410 each, acknowledged, never retried.
    assert gateway == sorted(
        [(f"{t.tenant}:both", 200), (f"{t.tenant}:no-consent", 410), (f"{t.tenant}:no-email", 410)]
    )
    assert [r["token"] for r in t.rows_for(nid)] == [token]  # push went on as before

    email_outcomes = {
        (r["audit"], r["recipient_user_id"])
        for r in audit_lines(stack, "email-consumer")
        if r["tenant_id"] == t.tenant
    }
    assert {("sent", "both"), ("denied_consent", "no-consent"), ("no_address", "no-email")} <= (
        email_outcomes
    )
    assert not any(o == "retry" for o, _ in email_outcomes)
    inapp = audit_lines(stack, "in-app-consumer")
    offline = [r for r in inapp if r["tenant_id"] == t.tenant and r["audit"] == "offline"]
    assert sorted(r["recipient_user_id"] for r in offline) == ["no-consent", "no-email"]
    assert all(r["channel"] == "in_app" for r in inapp if r["tenant_id"] == t.tenant)
    assert not [r for r in inapp if r["tenant_id"] == t.tenant and r["audit"] == "retry"]
    poison = sqs.get_queue_url(QueueName="fanout-email-poison")["QueueUrl"]
    wait_until(
        lambda: any(
            json.loads(m["Body"]).get("notification_id") == nid
            for m in sqs.receive_message(QueueUrl=poison, MaxNumberOfMessages=10).get(
                "Messages", []
            )
        ),
        10,
        "the attribute-less job in the poison queue",
        interval=0.2,
    )

    # The harness's view: channel rows in the history, judged effectively once per channel.
    history = History()
    ledgers = ChannelLedgers.for_stack(history, {"ses": ses_url, "inapp": inapp_url})
    ledgers.poll()
    ledgers.close()
    frame = history.frame()
    mine = frame[(frame["tenant_id"] == t.tenant)]
    assert set(mine["kind"]) == {"channel"}
    expected = pd.DataFrame(
        [(t.tenant, nid, "both@x.example", "email"), (t.tenant, nid, f"{t.tenant}:both", "in_app")],
        columns=["tenant_id", "notification_id", "token", "channel"],
    )
    assert ledgers.seen(expected) == 2
    verdict = channel_delivery.check(expected, mine.reset_index(drop=True))
    assert verdict.valid, verdict


def test_erasure_covers_the_channel_dedup_keys() -> None:
    from reference_impl.dedup_key import dedup_key, email_recipient, sms_recipient
    from reference_impl.erasure import channel_dedup_keys

    keys = channel_dedup_keys("acme", "u1", [NID], "ada@x.example")
    assert keys == [
        dedup_key("acme", NID, "u1#inapp"),
        dedup_key("acme", NID, email_recipient("u1", "ada@x.example")),
    ]
    assert email_recipient("u1", "ada@x.example").startswith("u1#email:")
    assert "ada" not in email_recipient("u1", "ada@x.example")
    with_phone = channel_dedup_keys("acme", "u1", [NID], None, "+447700000001")
    assert with_phone == [
        dedup_key("acme", NID, "u1#inapp"),
        dedup_key("acme", NID, sms_recipient("u1", "+447700000001")),
    ]
    assert "447700000001" not in sms_recipient("u1", "+447700000001")


@pytest.mark.integration
def test_email_consumer_retries_a_throttled_send_without_acking_then_sends_once(
    stack: Stack,
) -> None:
    """The Lambda shape: handler(event) -> batchItemFailures; a 503 is not acknowledged."""
    t = TenantClient(stack)
    address = f"retry-{t.tenant}@x.example"
    _put_user(t, "r1", email=address, email_consent=CONSENT)
    config = Config.from_mapping(
        {**json.loads(Config.load(stack.info.reference_config).to_json()), "audit_bucket": None}
    )
    consumer = EmailConsumer(config)
    job = {
        "tenant_id": t.tenant, "author_id": "a", "kind": "mention", "object_id": "o",
        "notification_id": NID, "accepted_at": "2026-11-22T12:00:00+00:00",
        "recipient_user_id": "r1", "channel": "email",
    }  # fmt: skip
    record = {
        "messageId": "m-1",
        "receiptHandle": "not-a-real-handle",  # the retry delay cannot be set: logged, not fatal
        "body": json.dumps(job),
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {"tenant_id": {"stringValue": t.tenant, "dataType": "String"}},
    }
    ses = SimulatorControl(stack.info.url("ses"))
    fault = ses.http.post(
        "/_sim/faults", json={"fault": "status", "params": {"status": 503, "tokens": [address]}}
    ).json()
    try:
        assert consumer({"Records": [record]}, None) == {
            "batchItemFailures": [{"itemIdentifier": "m-1"}]
        }
    finally:
        ses.http.delete(f"/_sim/faults/{fault['id']}").raise_for_status()
    assert consumer({"Records": [record]}, None) == {"batchItemFailures": []}
    assert consumer({"Records": [record]}, None) == {"batchItemFailures": []}  # deduped
    rows = [r for r in _ledger(stack.info.url("ses"), t.tenant) if r["token"] == address]
    assert [(r["status"], r["delivered"]) for r in rows] == [(503, False), (200, True)]


def test_preferences_body_adds_the_email_fields_only_for_users_who_have_them() -> None:
    plain = User("acme", "u1", "UTC", None, CONSENT, "none", None)
    assert set(preferences_body(plain)) == {"zone", "quiet_hours", "channels", "push_consent"}
    mailed = User("acme", "u2", "UTC", None, CONSENT, "none", None, "u2@x.example", CONSENT)
    body = preferences_body(mailed)
    assert (body["email"], body["email_consent"]) == ("u2@x.example", CONSENT)


# -- SMS: population, oracle, checker (pure) ----------------------------------------------------


PRE_SMS_POPULATION_SHA256 = "02001f0f3332ab58ccb1a726452869b8a6404a1149457884007a9196ffc089f6"


def test_sms_fields_come_from_a_stream_of_their_own() -> None:
    """Populations of existing seeds stay as they were: only the SMS fields depend on the SMS
    fractions, and every number is unique and E.164."""
    start = datetime(2026, 11, 22, 12, tzinfo=UTC)
    spec = PopulationSpec(tenants=2, users_per_tenant=40, celebrity_followers=20)
    none = generate(7, start, PopulationSpec(**{**spec.__dict__, "phone_fraction": 0.0}))
    every = generate(7, start, PopulationSpec(**{**spec.__dict__, "phone_fraction": 1.0}))
    sms_fields = {"phone", "sms_consent", "sms_opted_out"}

    def rest(users: list[User]) -> list[dict[str, Any]]:
        return [{k: v for k, v in vars(u).items() if k not in sms_fields} for u in users]

    assert rest(none.users) == rest(every.users)

    # The same seed's population as before SMS existed (a digest taken from the code before
    # this change: a draw moved to another stream would change it).
    # Since the red team, half of the users without email consent hold a withdrawn record
    # (``revoked_at``) where they held none: a draw of its own, so read as "none" here.
    # The channel switches came later still, from a stream of their own: left out here.
    def as_before(user: dict[str, Any]) -> dict[str, Any]:
        user = {k: v for k, v in user.items() if k != "channels_off"}
        consent = user.get("email_consent")
        withdrawn = isinstance(consent, dict) and "revoked_at" in consent
        return {**user, "email_consent": None} if withdrawn else user

    before = json.dumps([[as_before(u) for u in rest(none.users)], [vars(d) for d in none.devices],
                         [vars(a) | {"followers": list(a.followers)} for a in none.authors]],
                        sort_keys=True)  # fmt: skip
    assert hashlib.sha256(before.encode()).hexdigest() == PRE_SMS_POPULATION_SHA256
    assert none.devices == every.devices and none.authors == every.authors
    assert all(u.phone is None and u.sms_consent is None for u in none.users)
    phones = [u.phone for u in every.users]
    assert len(set(phones)) == len(phones) and all(valid_phone(p) for p in phones)
    assert any(u.sms_consent is None for u in every.users)  # never given
    assert any((u.sms_consent or {}).get("revoked_at") for u in every.users)  # withdrawn
    assert any(u.sms_opted_out for u in every.users)
    body = preferences_body(every.users[0])
    assert body["phone"] == phones[0]
    assert "phone" not in preferences_body(none.users[0])


def _sms_population() -> Population:
    t, q = "acme", {"start": "00:00", "end": "23:59"}
    users = [
        User(t, "a", "UTC", None, CONSENT, "none", None),
        User(t, "ok", "UTC", None, None, "none", None, phone="+447700000001", sms_consent=CONSENT),
        User(t, "nc", "UTC", None, None, "none", None, phone="+447700000002"),
        User(t, "stop", "UTC", None, None, "none", None, phone="+447700000003",
             sms_consent=CONSENT, sms_opted_out=True),
        User(t, "quiet", "UTC", q, None, "whole_run", None, phone="+447700000004",
             sms_consent=CONSENT),
        User(t, "later", "UTC", q, None, "ends_during_run", 1.0, phone="+447700000005",
             sms_consent=CONSENT),
        User(t, "nophone", "UTC", None, None, "none", None, sms_consent=CONSENT),
        User(t, "revoked", "UTC", None, None, "none", None, phone="+447700000006",
             sms_consent={**CONSENT, "revoked_at": "2026-06-01T00:00:00+00:00"}),
        User(t, "switched", "UTC", None, None, "none", None, phone="+447700000007",
             sms_consent=CONSENT, channels_off=("sms",)),
    ]  # fmt: skip
    followers = tuple(u.user_id for u in users[1:])
    return Population(0, 0.0, PopulationSpec(), users, [], [Author(t, "a", False, followers)])


def test_oracle_texts_numbers_with_consent_not_opted_out_and_not_quiet_all_run() -> None:
    population = _sms_population()
    history = History()
    for nid, kind in (("N1", "mention"), ("N2", "post")):
        history.append("inject", tenant_id="acme", author_id="a", notification_id=nid, detail=kind)
    injected = history.frame().query("kind == 'inject'")
    rows = expected_channel_deliveries(population, injected, DEFAULT_CHANNELS_BY_KIND)
    assert sorted(r for r in rows.itertuples(index=False, name=None) if r[3] == "sms") == [
        ("acme", "N1", "+447700000001", "sms"),
        ("acme", "N1", "+447700000005", "sms"),  # after its window, which ends during the run
    ]
    assert never_texted(population) == {
        "+447700000002": "no_sms_consent",
        "+447700000003": "opted_out",
        "+447700000006": "no_sms_consent",  # withdrawn
    }


SMS_EXPECTED = pd.DataFrame(
    [("acme", "N1", "+447700000001", "sms")],
    columns=["tenant_id", "notification_id", "token", "channel"],
)


def _sms_history(rows: list[tuple[str, int | None, str | None]]) -> pd.DataFrame:
    history = History()
    history.append("inject", tenant_id="acme", notification_id="N1", detail="mention")
    append_channel_rows(
        history,
        [
            {
                "provider": "sms",
                "token": number,
                "tenant_id": "acme",
                "notification_id": "N1",
                "status": status,
                "reason": reason,
                "delivered": status == 200,
                "received_at": 1.0,
            }
            for number, status, reason in rows
        ],  # fmt: skip
    )
    return history.frame()


def test_channel_checker_judges_sms_exactly_once_and_never_to_barred_numbers() -> None:
    never = never_texted(_sms_population())
    ok = _sms_history([("+447700000001", None, "THROTTLED"), ("+447700000001", 200, None)])
    verdict = channel_delivery.check(SMS_EXPECTED, ok, never=never)
    assert verdict.valid, verdict
    assert verdict.counts["sms_delivered"] == 1 and verdict.counts["sms_to_opted_out"] == 0

    twice = _sms_history([("+447700000001", 200, None)] * 2)
    verdict = channel_delivery.check(SMS_EXPECTED, twice, never=never)
    assert not verdict.valid and verdict.counts["sms_duplicated"] == 1

    # SNS answers a Publish to an opted-out number with a MessageId and texts nothing: the
    # ledger's OPTED_OUT row is the only trace, and it fails the run.
    stop = _sms_history([("+447700000001", 200, None), ("+447700000003", 400, "OPTED_OUT")])
    verdict = channel_delivery.check(SMS_EXPECTED, stop, never=never)
    assert not verdict.valid
    assert (verdict.counts["sms_to_opted_out"], verdict.counts["sms_unexpected"]) == (1, 0)
    assert verdict.details["channels"]["sms"]["barred_examples"][0]["why"] == "opted_out"

    no_consent = _sms_history([("+447700000001", 200, None), ("+447700000002", 200, None)])
    verdict = channel_delivery.check(SMS_EXPECTED, no_consent, never=never)
    assert not verdict.valid
    assert verdict.counts["sms_without_consent"] == verdict.counts["sms_unexpected"] == 1


def test_a_target_without_an_sms_ledger_gets_the_sms_part_switched_off() -> None:
    """Nothing texted and no ledger to read: not a failure, the SMS part is off and says why,
    the other channels are judged as ever."""
    population = _sms_population()
    history = History()
    history.append("inject", tenant_id="acme", author_id="a", notification_id="N1",
                   detail="mention")  # fmt: skip
    evidence = evidence_from(population, history.frame(), SystemPolicy(
        channels_by_kind={"mention": ("push", "sms")}))  # fmt: skip
    off = run_probe("channel_delivery", {}, evidence, frozenset({"queues"}))
    assert off.valid is True, off
    assert "no sms_ledger" in off.details["channels"]["sms"][SWITCHED_OFF]
    assert "sms_lost" not in off.counts
    on = run_probe("channel_delivery", {}, evidence, frozenset({"sms_ledger"}))
    assert on.valid is False and on.counts["sms_lost"] == 2


# -- SMS on the stack ---------------------------------------------------------------------------


def _sms_ledger(sns_url: str, tenant: str) -> list[dict[str, Any]]:
    rows = httpx.get(f"{sns_url}/_sns/sms", params={"since": 0}, timeout=10).json()["rows"]
    return [r for r in rows if r["tenant_id"] == tenant]


def _record(job: dict[str, Any], message_id: str) -> dict[str, Any]:
    return {
        "messageId": message_id,
        "receiptHandle": "not-a-real-handle",  # a retry's delay cannot be set: logged, not fatal
        "body": json.dumps(job),
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {"tenant_id": {"stringValue": job["tenant_id"], "dataType": "String"}},
    }


@pytest.mark.integration
def test_sms_consumer_texts_once_through_sns_and_never_an_opted_out_number(stack: Stack) -> None:
    """The SMS Lambda against the stack's SNS endpoint: consent, the opt-out list asked before
    every send, a throttled SNS leaves the job in the queue, a second copy is deduplicated; the
    sms_ignores_opt_out defect publishes to the opted-out number (SNS texts nothing, its ledger
    says OPTED_OUT)."""
    t = TenantClient(stack)
    sns_url = stack.info.url("sns")
    base = uuid.uuid4().int % 10**7
    ok, no_consent, stop, gone = (f"+1555{(base + n) % 10**7:07d}" for n in range(4))
    _put_user(t, "ok", phone=ok, sms_consent=CONSENT)
    _put_user(t, "nc", phone=no_consent)
    revoked = {**CONSENT, "revoked_at": "2026-06-01T00:00:00+00:00"}
    _put_user(t, "gone", phone=gone, sms_consent=revoked)  # SMS consent withdrawn
    _put_user(t, "stop", phone=stop, sms_consent=CONSENT)
    _put_user(t, "nophone", sms_consent=CONSENT)
    with SnsControl(sns_url) as sns:
        assert sns.opt_out([stop]) == 1
        values = {**json.loads(Config.load(stack.info.reference_config).to_json())}
        consumer = SmsConsumer(Config.from_mapping({**values, "audit_bucket": None}))

        def job(user: str, nid: str = NID) -> dict[str, Any]:
            return {
                "tenant_id": t.tenant, "author_id": "a", "kind": "mention", "object_id": "o",
                "notification_id": nid, "accepted_at": "2026-11-22T12:00:00+00:00",
                "recipient_user_id": user, "channel": "sms",
            }  # fmt: skip

        throttle = sns.throttle(p=1.0, targets=["sms"])
        try:  # the opt-out list cannot be read: no send, the job stays in the queue
            assert consumer({"Records": [_record(job("ok"), "m-0")]}, None) == {
                "batchItemFailures": [{"itemIdentifier": "m-0"}]
            }
        finally:
            sns.stop(throttle["id"])
        assert _sms_ledger(sns_url, t.tenant) == []
        records = [_record(job(u), f"m-{u}") for u in ("ok", "nc", "gone", "stop", "nophone")]
        assert consumer({"Records": records}, None) == {"batchItemFailures": []}
        assert consumer({"Records": [_record(job("ok"), "m-again")]}, None) == {
            "batchItemFailures": []
        }  # the second copy: deduplicated
        rows = _sms_ledger(sns_url, t.tenant)
        assert [(r["token"], r["status"], r["notification_id"]) for r in rows] == [(ok, 200, NID)]
        assert (rows[0]["sms_type"], rows[0]["sender_id"]) == ("Transactional", "FANOUT")

        broken = SmsConsumer(
            Config.from_mapping(
                {**values, "audit_bucket": None, "defects": ["sms_ignores_opt_out"]}
            )
        )
        other = "01JD5V3KX9B9Q0ZC4S6Y2M8N7Q"
        assert broken({"Records": [_record(job("stop", other), "m-b")]}, None) == {
            "batchItemFailures": []
        }
        rows = _sms_ledger(sns_url, t.tenant)
        assert [(r["token"], r["delivered"], r["reason"]) for r in rows[1:]] == [
            (stop, False, "OPTED_OUT")
        ]


def test_channel_delivery_judges_sms_the_same_with_the_history_on_disk(tmp_path: Any) -> None:
    """A history past the in-memory limit is read back from the DuckDB store (the kinds the
    checker reads): the SMS verdict, opted-out publish and a text to a number whose user
    switched SMS off included, is the same."""
    population = _sms_population()
    history = History()
    history.append("inject", tenant_id="acme", author_id="a", notification_id="N1",
                   detail="mention")  # fmt: skip
    append_channel_rows(
        history,
        [
            {
                "provider": "sms",
                "token": number,
                "tenant_id": "acme",
                "notification_id": "N1",
                "status": status,
                "reason": reason,
                "delivered": status == 200,
                "received_at": 1.0,
            }
            for number, status, reason in (
                ("+447700000001", 200, None),
                ("+447700000003", 400, "OPTED_OUT"),
                ("+447700000007", 200, None),
            )
        ],  # fmt: skip
    )
    frame = history.frame()
    # SMS for mentions, as the reference routes them (the harness's default policy has none).
    policy = SystemPolicy(channels_by_kind={"mention": ("push", "sms")})
    evidence = evidence_from(population, frame, policy)
    with HistoryStore.from_frame(frame, evidence.expectation, workdir=tmp_path / "db") as store:
        on_disk = dataclasses.replace(evidence, store=store)
        in_memory, out_of_core = (
            run_probe("channel_delivery", {}, e, frozenset({"sms_ledger"}))
            for e in (evidence, on_disk)
        )
    assert out_of_core.to_dict() == in_memory.to_dict()
    assert in_memory.valid is False and in_memory.counts["sms_to_opted_out"] == 1
    assert in_memory.counts["sms_to_switched_off"] == in_memory.counts["sms_unexpected"] == 1
    assert in_memory.counts["sms_withheld_by_switch"] == 1
