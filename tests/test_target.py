"""Target files: bad ones are named clearly; a good one runs a chaos scenario against a second
reference instance that knows nothing of the harness (configured only through the file)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import ROOT, run_cli

from emulators.ports import free_port
from emulators.providers.apns_keys import ApnsSigningKey, new_signing_key
from emulators.providers.fcm import write_service_account_file
from harness.stack.supervisor import Stack, stop_process, wait_until
from harness.stack.target import TargetError, load, parse
from reference_impl.aws import client
from reference_impl.sns_push import provision_sns

GOOD = {
    "name": "t",
    "event_api": "http://127.0.0.1:18080",
    "apns_listen": "127.0.0.1:18443",
    "fcm_listen": "127.0.0.1:18444",
}


def test_the_shipped_example_parses():
    target = load(ROOT / "targets" / "example.yaml")
    assert target.queue_prefix == "staging" and not target.allow_remote


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "red"}, "unknown key(s) colour"),
        ({"fcm_listen": None}, "fcm_listen is required"),
        ({"event_api": "http://10.1.2.3:80"}, "event_api (10.1.2.3) not on loopback"),
        ({"dedup_redis": "127.0.0.1:6379"}, "dedup_redis and dedup_listen go together"),
        ({"apns_listen": "127.0.0.1"}, "apns_listen: expected host:port"),
        ({"apns_listen": "10.0.0.1:443", "allow_remote": True}, "apns_listen must be a loopback"),
        ({"kinesis_listen": "127.0.0.1:4568"}, "kinesis_listen and kinesis_upstream go together"),
        (
            {"kinesis_listen": "127.0.0.1:4568", "kinesis_upstream": "127.0.0.1:4567"},
            "kinesis_upstream must be an http(s) URL",
        ),
        (
            {"kinesis_listen": "127.0.0.1:4568", "kinesis_upstream": "https://kinesis.aws"},
            "kinesis_upstream (kinesis.aws) not on loopback",
        ),
        (
            {"kinesis_listen": "10.0.0.1:4568", "kinesis_upstream": "http://127.0.0.1:4567"},
            "kinesis_listen must be a loopback",
        ),
        ({"sns_listen": "10.0.0.1:9911", "allow_remote": True}, "sns_listen must be a loopback"),
        ({"sns_listen": "127.0.0.1"}, "sns_listen: expected host:port"),
        (
            {"sns_listen": "127.0.0.1:9911", "sns_endpoint": "http://127.0.0.1:9912"},
            "sns_listen and sns_endpoint exclude each other",
        ),
        ({"sns_endpoint": "http://10.0.0.2:9911"}, "sns_endpoint (10.0.0.2) not on loopback"),
        ({"dynamodb_endpoint": "http://10.0.0.3:8000"}, "dynamodb_endpoint (10.0.0.3) not on"),
        ({"ttl_tables": [{"purpose": "outbox", "table": "x"}]}, "ttl_tables[0] must be"),
        ({"ttl_tables": [{"purpose": "inbox", "table": "x", "ttl": 9}]}, "ttl_tables[0] must be"),
        ({"job_fields": {"id": "nid"}}, "job_fields maps tenant, notification, recipient"),
        ({"job_fields": {"notification": "job..nid"}}, "job_fields notification: a dotted path"),
        ({"job_template": {"id": "${nid}"}}, "job_template names ${nid}"),
        ({"job_template": {"to": "${recipient}"}}, "job_template must carry ${notification}"),
        (
            {"job_template": {"body": {"id": "${notification}"}, "platforms": {"apns": 1}}},
            "platforms maps apns and fcm",
        ),
        ({"payload_ids": {"gcm": {}}}, "payload_ids maps apns and/or fcm"),
        ({"payload_ids": {"apns": {"tenant": "t"}}}, "payload_ids maps apns and/or fcm"),
        ({"payload_ids": {"fcm": {"tenant_id": ""}}}, "payload_ids maps apns and/or fcm"),
        (
            {"policy": {"fcm_projects": ["a"], "fcm_mapping": "os.system"}},
            "fcm_mapping 'os.system': Attribute",
        ),
    ],
)
def test_mistakes_are_named(change, message):
    with pytest.raises(TargetError) as caught:
        parse({**GOOD, **change}, "target.yaml")
    assert message in str(caught.value)


def test_a_team_states_its_own_job_schema_payload_keys_and_fcm_mapping():
    target = parse(
        {
            **GOOD,
            "sqs_endpoint": "http://127.0.0.1:9324",
            "queues": {"work": {"push": "jobs"}, "poison": {"push": "quarantine"}},
            "job_fields": {"tenant": "job.org", "notification": "job.nid", "recipient": "job.to"},
            "job_template": {"v": 1, "job": {"org": "${tenant}", "nid": "${notification}"}},
            "payload_ids": {"apns": {"notification_id": "n.id"}},
            "policy": {"fcm_projects": ["a", "b"], "fcm_mapping": "projects[crc32(user_id) % 2]"},
        },
        "target.yaml",
    )
    queues = target.contract(None).queues
    assert queues is not None and queues.job_template is not None
    body = queues.job_template.build(tenant="t1", notification="N1")
    assert json.loads(body) == {"v": 1, "job": {"org": "t1", "nid": "N1"}}
    assert queues.read_job(json.dumps({"job": {"org": "t1", "nid": "N1", "to": "u"}})) == (
        "t1", "N1", "u",
    )  # fmt: skip
    assert target.payload_paths("apns") == {"tenant_id": "tenant_id", "notification_id": "n.id"}
    assert target.payload_paths("fcm")["notification_id"] == "message.data.notification_id"
    # Job fields of its own and no template: the harness cannot write its jobs.
    bare = parse({**GOOD, "sqs_endpoint": "http://127.0.0.1:9324",
                  "job_fields": {"notification": "nid"}}, "t.yaml")  # fmt: skip
    assert bare.contract(None).queues.job_template is None  # type: ignore[union-attr]
    # Neither: the reference's schema, and its template.
    plain = parse({**GOOD, "sqs_endpoint": "http://127.0.0.1:9324"}, "t.yaml")
    assert plain.contract(None).queues.job_template is not None  # type: ignore[union-attr]


def test_ttl_tables_name_what_ttl_attributes_reads_and_are_optional():
    table = {"purpose": "inbox", "table": "s-inbox", "attribute": "ttl", "id_attribute": "sk"}
    target = parse({**GOOD, "ttl_tables": [table]}, "t")
    assert target.ttl_tables == [table]
    assert parse(GOOD, "t").ttl_tables is None


def test_a_remote_system_needs_allow_remote():
    target = parse({**GOOD, "event_api": "https://staging.example.com", "allow_remote": True}, "t")
    assert target.event_api == "https://staging.example.com"


def test_a_bad_target_file_is_a_clear_cli_error(tmp_path):
    result = run_cli("run", "smoke", "--target", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "no target file" in result.stderr


@pytest.mark.integration
@pytest.mark.wholerun
def test_a_chaos_scenario_runs_against_a_system_named_by_a_target_file(tmp_path):
    proxy, apns, fcm = free_port(), free_port(), free_port()
    team_key = TeamKey.write(tmp_path / "apns")
    # The system under test: a second reference instance, its own Redis and AWS endpoints,
    # configured to find its dedup store and providers where the target file says.
    system = Stack(
        tmp_path / "system",
        parts=("redis", "dynamodb", "kinesis", "sqs", "event-api", "fanout-worker",
               "push-consumer"),
        reference_overrides={
            "redis_url": f"redis://127.0.0.1:{proxy}/0",
            "apns_url": f"http://127.0.0.1:{apns}",
            "fcm_url": f"http://127.0.0.1:{fcm}",
            "queue_prefix": "staging",
            **team_key.config,
            # its own service account, its token_uri where the target's FCM is
            "fcm_credentials_file": str(write_service_account_file(
                tmp_path / "sa.json", f"http://127.0.0.1:{fcm}/token", "fanout-sender")),
        },
    )  # fmt: skip
    with system:
        info = system.info
        target = {
            "name": "second-reference",
            "event_api": info.url("event-api"),
            "sqs_endpoint": info.url("sqs"),
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "queue_prefix": "staging",
            "dedup_redis": f"127.0.0.1:{info.parts['redis'].port}",
            "dedup_listen": f"127.0.0.1:{proxy}",
            "apns_listen": f"127.0.0.1:{apns}",
            "fcm_listen": f"127.0.0.1:{fcm}",
            **team_key.target,
        }
        path = tmp_path / "target.yaml"
        path.write_text(yaml.safe_dump(target))
        out = tmp_path / "runs"
        result = run_cli(
            "run", "memorydb-outage", "--seed", "3", "--target", str(path), "--out", str(out),
            timeout=400,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["target"] == "second-reference" and summary["verdict"] == "pass"
        once = summary["checkers"]["effectively_once"]
        assert once["expected"] > 0 and once["delivered"] == once["expected"]
        # The outage went through the harness's proxy in front of the target's Redis.
        fail_closed = summary["checkers"]["fail_closed"]
        assert fail_closed["outage_windows"] == 1
        assert fail_closed["decided_during_outage"] == fail_closed["backlog_sent_late"] == 0
        # The harness started no reference workers of its own: only proxy and simulators.
        stack_up = json.loads(_first_phase(run_dir))["stack_up"]
        assert set(stack_up) == {"toxiproxy", "apns", "fcm"}
        # The system's own push queue carried the jobs (the target's queue prefix).
        sqs = info.aws_client("sqs")
        assert sqs.get_queue_url(QueueName="staging-push")["QueueUrl"]


@dataclass(frozen=True)
class TeamKey:
    """The second reference's own APNs signing key, as its team registered it with Apple."""

    path: Path
    key: ApnsSigningKey

    @classmethod
    def write(cls, directory: Path) -> TeamKey:
        key = new_signing_key(team_id="STAGINGTM1", key_id="STAGINGK01")
        return cls(key.write(directory), key)

    @property
    def config(self) -> dict[str, str]:
        return {"apns_key_file": str(self.path), "apns_key_id": self.key.key_id,
                "apns_team_id": self.key.team_id}  # fmt: skip

    @property
    def target(self) -> dict[str, object]:
        keys = [{"file": str(self.path), "key_id": self.key.key_id, "team_id": self.key.team_id}]
        return {"apns_topic": "com.example.fanout", "apns_keys": keys}


def _first_phase(run_dir: Path) -> str:
    import pandas as pd

    history = pd.read_parquet(run_dir / "history.parquet")
    return history[history["kind"] == "phase"]["detail"].iloc[0]


def test_a_system_publishing_through_sns_is_verified_at_the_sns_endpoint_it_names(tmp_path):
    """A second reference on SNS mobile push, beside an SNS endpoint of the harness's that the
    team runs (the target's ``sns_endpoint``): its devices become platform endpoints there, the
    run's deliveries reach the simulators through it, and SNS's own ledger is in the history."""
    apns, fcm, sns_port = free_port(), free_port(), free_port()
    team_key = TeamKey.write(tmp_path / "apns")
    system = Stack(
        tmp_path / "system",
        parts=("redis", "dynamodb", "kinesis", "sqs", "event-api", "fanout-worker",
               "push-consumer"),
        with_workers=False,
        reference_overrides={"queue_prefix": "staging", "push_transport": "direct"},
    )  # fmt: skip
    sns: subprocess.Popen[bytes] | None = None
    with system:
        info = system.info
        sns_url = f"http://127.0.0.1:{sns_port}"
        sns = subprocess.Popen(
            [sys.executable, "-m", "emulators.sns", "--host", "127.0.0.1", "--port",
             str(sns_port), "--apns-url", f"http://127.0.0.1:{apns}", "--fcm-url",
             f"http://127.0.0.1:{fcm}", "--sqs-url", info.url("sqs")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            wait_until(lambda: _ok(f"{sns_url}/_sns/health"), 20, "the SNS endpoint")
            # The system's own deploy: its config names SNS, its provisioning makes the apps.
            system.reference_overrides.update(
                push_transport="sns",
                sns_endpoint=sns_url,
                apns_url=f"http://127.0.0.1:{apns}",
                fcm_url=f"http://127.0.0.1:{fcm}",
                **team_key.config,
            )
            system.write_reference_config()
            config = system.reference_config()
            provision_sns(config, client(config, "sqs"))
            for part in ("event-api", "fanout-worker", "push-consumer"):
                system.start_part(part)
            target = {
                "name": "sns-reference",
                "event_api": info.url("event-api"),
                "sqs_endpoint": info.url("sqs"),
                "aws_access_key_id": "testing",
                "aws_secret_access_key": "testing",
                "queue_prefix": "staging",
                "apns_listen": f"127.0.0.1:{apns}",
                "fcm_listen": f"127.0.0.1:{fcm}",
                "sns_endpoint": sns_url,
                **team_key.target,
            }
            path = tmp_path / "target.yaml"
            path.write_text(yaml.safe_dump(target))
            out = tmp_path / "runs"
            result = run_cli(
                "run", "smoke", "--seed", "3", "--target", str(path), "--out", str(out),
                "--no-report", timeout=400,
            )  # fmt: skip
            (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
            summary = json.loads((run_dir / "summary.json").read_text())
            assert summary["target"] == "sns-reference", result.stdout + result.stderr
            once = summary["checkers"]["effectively_once"]
            assert once["expected"] > 0 and once["delivered"] == once["expected"], once
            dead = summary["checkers"]["dead_tokens"]
            # SNS's own logs reached the checker: the endpoints it turned off on dead answers.
            assert dead["valid"] and dead["endpoints_turned_off"] > 0, dead
            import pandas as pd

            history = pd.read_parquet(run_dir / "history.parquet")
            publishes = history[history["kind"] == "sns_publish"]
            assert len(publishes) >= once["delivered"]
            assert publishes["detail"].str.contains(":endpoint/GCM/|:endpoint/APNS/").all()
        finally:
            if sns is not None:
                stop_process(sns)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def audit_records() -> list:
    return [
        {"outcome": "sent", "tenant_id": "t1", "notification_id": "n1", "token": "k",
         "at": "2026-11-28T10:00:00+00:00", "recipient_user_id": "u1"},
        '{"outcome": "deferred", "tenant_id": "t1", "notification_id": "n2"}',
        "not a record",
    ]  # fmt: skip


WRITES: list = []


def write_preferences(tenant: str, user: str, preferences: dict) -> None:
    WRITES.append((tenant, user, preferences))


def test_a_team_supplies_its_audit_reader_table_writer_and_erasure_probe():
    from harness.model.history import History

    target = parse(
        {**GOOD, "hooks": {
            "audit_trail": "test_target:audit_records",
            "table_writer": "test_target:write_preferences",
            "erasure_done": "test_target:audit_records",
        }},
        "target.yaml",
    )  # fmt: skip
    contract = target.contract(None)
    assert {"audit_trail", "table_writes"} <= contract.capabilities()
    history = History()
    assert contract.audit is not None and contract.audit.read(history) == 2
    rows = history.frame().query("kind == 'audit'")
    assert list(rows["reason"]) == ["sent", "deferred", "unreadable"]
    assert rows["time"].iloc[0] == 1795860000.0  # the record's own 'at'
    assert contract.table_writer is not None and contract.erasure_done is not None
    contract.table_writer("t", "u", {"zone": "UTC"})
    assert WRITES[-1] == ("t", "u", {"zone": "UTC"})
    for bad, message in (
        ({"hooks": {"audit": "x:y"}}, "hooks names audit_trail, table_writer, erasure_done"),
        ({"hooks": {"audit_trail": "nowhere:f"}}, "hooks.audit_trail nowhere:f: cannot import"),
    ):
        with pytest.raises(TargetError, match=re.escape(message)):
            parse({**GOOD, **bad}, "target.yaml")


def test_an_erasure_job_is_acknowledged_when_its_probe_says_done():
    import threading

    from harness.run import actions

    answers = iter([False, False, True])
    ctx = actions.ActionContext.__new__(actions.ActionContext)
    ctx.stop = threading.Event()
    ctx.erasure_done = lambda tenant, user: next(answers)
    assert actions._completed(ctx, "t", "u") is True
    ctx.erasure_done = lambda tenant, user: False
    ctx.stop.set()  # a run that stops does not wait out the job
    assert actions._completed(ctx, "t", "u") is False
