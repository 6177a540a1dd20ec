"""The poison_queue checker over hand-made histories (what the harness injected malformed, what
the dead-letter and poison queues held at the end), and the malformed jobs themselves: each is
one the reference's own parser refuses, and its id is found again in any body that carries it."""

from __future__ import annotations

import json

import pytest

from harness.checkers import poison_queue, registry
from harness.checkers.evidence import evidence_from
from harness.checkers.store import HistoryStore
from harness.contract.driver import FanoutApiDriver
from harness.contract.system import (
    DEFAULT_JOB_TEMPLATE,
    JobTemplate,
    Queues,
    SystemContract,
    job_reader,
)
from harness.model.history import History
from harness.model.oracle import Expectation
from harness.run.actions import MALFORMED_FORMS, malformed_id_in, malformed_job
from reference_impl.job_consumer import PoisonJob, parse_job

IDS = [f"malformed-{i:032x}" for i in range(3)]
WELL_FORMED = "01JD0000000000000000000000"


def _history(poison=IDS, dead=(), delivered=(), well_formed_in_poison=0, unidentified=0):
    history = History()
    for i, marker in enumerate(IDS):
        history.append("malformed", tenant_id="t1", user_id="u1", notification_id=marker,
                       detail=json.dumps({"channel": "push", "form": MALFORMED_FORMS[i]}))  # fmt: skip
    for marker in poison:
        history.append("dlq", detail=json.dumps({"queue": "fanout-push-poison", "kind": "poison",
                                                 "malformed_id": marker}))  # fmt: skip
    for marker in dead:
        history.append("dlq", detail=json.dumps({"queue": "fanout-push-dlq", "kind": "dead",
                                                 "malformed_id": marker}))  # fmt: skip
    for marker in delivered:
        history.append("provider", tenant_id="t1", notification_id=marker, token="tok",
                       status=200, delivered=True)  # fmt: skip
    for _ in range(well_formed_in_poison):
        history.append("dlq", tenant_id="t1", notification_id=WELL_FORMED,
                       detail=json.dumps({"queue": "fanout-push-poison", "kind": "poison",
                                          "malformed_id": None}))  # fmt: skip
    for _ in range(unidentified):
        history.append("dlq", detail=json.dumps({"queue": "fanout-push-poison", "kind": "poison",
                                                 "malformed_id": None}))  # fmt: skip
    return history.frame()


def test_every_malformed_job_in_the_poison_queue_passes():
    # Twice for one of them: SQS handed the copy out twice, both parked.
    verdict = poison_queue.check(_history(poison=[*IDS, IDS[0]], unidentified=1))
    assert verdict.valid, verdict.counts
    assert verdict.counts == {
        "injected": 3, "in_poison": 3, "redriven_to_dead": 0, "dropped": 0, "delivered": 0,
        "well_formed_in_poison": 0, "unidentified_in_poison": 1,
    }  # fmt: skip


def test_a_copy_also_in_the_retry_dlq_after_its_poisoning_is_not_a_failure():
    # A lost delete can bring a poisoned copy back until SQS dead-letters it: parked, not lost.
    assert poison_queue.check(_history(dead=[IDS[1]])).valid


@pytest.mark.parametrize(
    ("history", "count"),
    [
        (_history(poison=IDS[1:], dead=IDS[:1]), "redriven_to_dead"),
        (_history(poison=IDS[1:]), "dropped"),
        (_history(delivered=IDS[2:]), "delivered"),
        (_history(well_formed_in_poison=1), "well_formed_in_poison"),
    ],
)
def test_each_way_a_malformed_job_goes_wrong_is_caught(history, count):
    verdict = poison_queue.check(history)
    assert verdict.valid is False and verdict.counts[count] == 1
    assert verdict.details["examples"]


@pytest.mark.parametrize("poison", [IDS, IDS[1:]])
def test_the_history_on_disk_reads_the_same(tmp_path, poison):
    frame = _history(poison=poison, delivered=IDS[:1])
    store = HistoryStore.from_frame(frame, Expectation(frame.iloc[0:0]), workdir=tmp_path)
    try:
        assert poison_queue.check_store(store) == poison_queue.check(frame)
    finally:
        store.close()


def test_a_run_that_injected_nothing_is_not_judged_never_a_pass():
    verdict = poison_queue.check(History().frame())
    assert verdict.valid is None and not verdict.applies


def test_a_system_without_poison_queues_is_not_judged(tmp_path):
    contract = SystemContract("t", "http://127.0.0.1:1", FanoutApiDriver(),
                              queues=Queues(work={"push": "w"}, dead={"push": "d"}))  # fmt: skip
    assert "poison_queue" not in contract.capabilities()
    verdict = registry.run_probe(
        "poison_queue", {}, evidence_from_history(_history(poison=())), contract.capabilities()
    )
    assert verdict.valid is None and "poison_queue" in json.dumps(verdict.details)
    with_poison = SystemContract("t", "http://127.0.0.1:1", FanoutApiDriver(),
                                 queues=Queues(work={"push": "w"}, poison={"push": "p"}))  # fmt: skip
    assert "poison_queue" in with_poison.capabilities()


def evidence_from_history(frame):
    from fake_run import population

    return evidence_from(population(), frame)


@pytest.mark.parametrize("form", MALFORMED_FORMS)
def test_each_malformed_form_is_refused_by_a_parser_that_checks_and_carries_its_id(form):
    values = {"tenant": "tenant-1", "recipient": "user-1", "author": "user-2", "token": "k",
              "platform": "apns"}  # fmt: skip
    job = malformed_job(form, IDS[0], values, DEFAULT_JOB_TEMPLATE)
    assert job is not None
    body, attributes = job
    record = {
        "body": body,
        "messageAttributes": {"tenant_id": {"stringValue": attributes["tenant_id"]["StringValue"]}},
    }
    with pytest.raises(PoisonJob):
        parse_job(record)
    assert malformed_id_in(body) == IDS[0]


def test_a_well_formed_job_carries_no_malformed_id():
    job = {"tenant_id": "t", "notification_id": WELL_FORMED, "recipient_user_id": "u"}
    assert malformed_id_in(json.dumps(job)) is None


def test_the_bad_id_job_is_written_in_the_systems_own_schema():
    """A team's nested job schema: the job the harness writes is that schema, every field
    filled (its platform in the team's own words), wrong in its id alone; with no template the
    form is not written at all (a job lacking fields would prove nothing about the id check)."""
    template = JobTemplate(
        {"v": 1, "job": {"org": "${tenant}", "nid": "${notification}", "to": "${recipient}",
                         "by": "${author}", "device": "${token}", "os": "${platform}"}},
        platforms={"apns": "ios", "fcm": "android"},
    )  # fmt: skip
    values = {"tenant": "t1", "recipient": "u1", "author": "u2", "token": "tok", "platform": "apns"}
    job = malformed_job("bad_notification_id", IDS[0], values, template)
    assert job is not None
    body = json.loads(job[0])
    assert body == {"v": 1, "job": {"org": "t1", "nid": IDS[0], "to": "u1", "by": "u2",
                                    "device": "tok", "os": "ios"}}  # fmt: skip
    read = job_reader({"tenant": "job.org", "notification": "job.nid", "recipient": "job.to"})
    assert read(job[0]) == ("t1", IDS[0], "u1")
    assert malformed_id_in(job[0]) == IDS[0]
    assert malformed_job("bad_notification_id", IDS[0], values, None) is None
    assert malformed_job("not_json", IDS[0], values, None) is not None
