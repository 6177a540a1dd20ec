"""The ttl_attributes checker over hand-made histories (the harness's own send and answer times
against the expiries a Scan read), and the Scan itself against a real DynamoDB endpoint
(dynalite), through boto3."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from harness.checkers import ttl_attributes
from harness.contract.system import TtlTable
from harness.model.history import History
from harness.run.ttl_items import (
    TtlScan,
    TtlStatus,
    describe_ttl,
    expiry_of,
    record_scan,
    scan_expiries,
)
from reference_impl.aws import batch_write
from reference_impl.config import Config

DAY = 86_400
TTLS = {"inbox": 90 * DAY, "dedup_fallback": 30 * DAY}
SENT, ANSWERED, END = 1_764_000_000.0, 1_764_000_000.4, 1_764_000_060.0
ON = TtlStatus("ENABLED", "expires_at")


def _history(inbox=None, fallback=None, missing=0, inbox_ttl=ON, fallback_ttl=ON):
    """One notification n1 sent at SENT, answered at ANSWERED; a scan at END."""
    history = History()
    history.append("inject", time=SENT, end=ANSWERED, tenant_id="t", notification_id="n1")
    inbox_scan = TtlScan(missing=missing)
    for expiry in inbox if inbox is not None else [int(SENT + 0.2) + 90 * DAY]:
        inbox_scan.expiries["n1"][expiry] += 3
        inbox_scan.items += 3
    inbox_scan.items += missing
    history.append("ttl_sample", time=END, detail=_detail("inbox", inbox_scan, inbox_ttl))
    fallback_scan = TtlScan()
    for expiry in fallback if fallback is not None else [int(SENT + 30) + 30 * DAY]:
        fallback_scan.expiries[""][expiry] += 1
        fallback_scan.items += 1
    history.append(
        "ttl_sample", time=END, detail=_detail("dedup_fallback", fallback_scan, fallback_ttl)
    )
    return history.frame()


def _detail(purpose, scan, status=ON):
    history = History()
    table = TtlTable(purpose, f"fanout-{purpose}", "expires_at", "sk")
    record_scan(history, table, scan, status)
    return history.frame()["detail"].iloc[0]


def test_expiries_from_the_acceptance_plus_the_design_ttls_pass():
    verdict = ttl_attributes.check(_history(), TTLS, 5.0)
    assert verdict.valid, verdict.details
    assert verdict.counts["inbox_items"] == verdict.counts["inbox_by_notification"] == 3
    assert verdict.counts["dedup_fallback_items"] == 1
    assert verdict.counts["ttl_not_enabled"] == 0
    # ENABLING is AWS's state for up to an hour after UpdateTimeToLive: on.
    enabling = TtlStatus("ENABLING", "expires_at")
    assert ttl_attributes.check(_history(inbox_ttl=enabling), TTLS, 5.0).valid


def test_ttl_judged_on_is_enabled_on_the_attribute_the_items_carry():
    assert not ttl_attributes.ttl_not_enabled("ENABLED", "expires_at", "expires_at")
    assert not ttl_attributes.ttl_not_enabled("ENABLING", "expires_at", "expires_at")
    assert ttl_attributes.ttl_not_enabled("DISABLED", None, "expires_at")
    assert ttl_attributes.ttl_not_enabled("DISABLING", "expires_at", "expires_at")
    assert ttl_attributes.ttl_not_enabled("ENABLED", "ttl", "expires_at")


@pytest.mark.parametrize(
    "status",
    [TtlStatus("DISABLED"), TtlStatus("ENABLED", "ttl"), TtlStatus("DISABLING", "expires_at")],
)
def test_a_table_whose_ttl_is_off_fails_though_its_attributes_are_right(status):
    verdict = ttl_attributes.check(_history(inbox_ttl=status), TTLS, 5.0)
    assert verdict.valid is False, verdict.details
    assert verdict.counts["ttl_not_enabled"] == 1
    assert verdict.details["ttl_status"]["fanout-inbox"]["status"] == status.status
    # Off, on a table that holds no item yet, fails as well: nothing written later expires.
    history = History()
    history.append("ttl_sample", time=END, detail=_detail("inbox", TtlScan(), status))
    assert ttl_attributes.check(history.frame(), TTLS, 5.0).valid is False


def test_an_endpoint_without_describe_time_to_live_switches_the_count_off_not_on():
    unsupported = TtlStatus(None, unsupported=True, error="UnknownOperationException: ...")
    verdict = ttl_attributes.check(
        _history(inbox_ttl=unsupported, fallback_ttl=unsupported), TTLS, 5.0
    )
    assert "ttl_not_enabled" not in verdict.counts
    assert "does not implement DescribeTimeToLive" in verdict.details["ttl_status"]
    assert verdict.valid  # the attributes are still judged, and are right
    wrong = _history(inbox=[int(SENT) + 3600], inbox_ttl=unsupported, fallback_ttl=unsupported)
    assert ttl_attributes.check(wrong, TTLS, 5.0).valid is False


def test_a_status_that_could_not_be_read_is_unknown_never_pass():
    unread = TtlStatus(None, error="ThrottlingException: slow down")
    verdict = ttl_attributes.check(_history(fallback_ttl=unread), TTLS, 5.0)
    assert verdict.valid is None and verdict.details["counts"]["ttl_status_unread"] == 1
    assert "ThrottlingException" in verdict.details["ttl_status"]["fanout-dedup_fallback"]["error"]


@pytest.mark.parametrize(
    ("history", "count", "n"),
    [
        # Epoch milliseconds: DynamoDB reads a date tens of thousands of years away.
        (_history(inbox=[int(SENT + 90 * DAY) * 1000]), "inbox_late", 3),
        (_history(inbox=[int(SENT) + 30 * DAY]), "inbox_early", 3),  # the dedup window's
        (_history(inbox=[int(SENT) + 90 * DAY - 3600]), "inbox_early", 3),  # an hour short
        (_history(inbox=[int(END) + 90 * DAY]), "inbox_late", 3),  # the scan's clock, not the
        (_history(missing=2), "inbox_missing_attribute", 2),
        (_history(fallback=[int(SENT) + 3600]), "dedup_fallback_early", 1),
        (_history(fallback=[int(END) + 31 * DAY]), "dedup_fallback_late", 1),
    ],
)
def test_each_wrong_expiry_is_caught(history, count, n):
    verdict = ttl_attributes.check(history, TTLS, 5.0)
    assert verdict.valid is False and verdict.counts[count] == n, verdict.counts
    assert verdict.details["examples"]


def test_no_table_read_or_no_item_is_unknown_never_pass():
    assert ttl_attributes.check(History().frame(), TTLS, 5.0).valid is None
    history = History()
    history.append("ttl_sample", time=END, detail=_detail("inbox", TtlScan()))
    assert ttl_attributes.check(history.frame(), TTLS, 5.0).valid is None


def test_only_a_number_is_an_expiry():
    assert expiry_of({"expires_at": {"N": "1764000000"}}, "expires_at") == 1_764_000_000
    assert expiry_of({"expires_at": {"S": "1764000000"}}, "expires_at") is None
    assert expiry_of({}, "expires_at") is None


@pytest.mark.integration
def test_a_scan_reads_every_items_expiry_by_notification(stack):
    ddb = stack.info.aws_client("dynamodb")
    table = "ttl-scan-test"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                   {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                              {"AttributeName": "sk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )  # fmt: skip
    try:
        items = []
        for i in range(2100):  # three pages
            item = {"pk": {"S": f"t#u{i}"}, "sk": {"S": f"n{i % 2}"}}
            if i % 500:  # five without the attribute
                item["expires_at"] = {"N": str(1000 + i % 2)}
            items.append({"PutRequest": {"Item": item}})
        batch_write(ddb, table, items)
        scan = scan_expiries(ddb, TtlTable("inbox", table, "expires_at", "sk"))
        assert scan.complete and scan.items == 2100 and scan.missing == 5
        assert scan.expiries == {"n0": Counter({1000: 1045}), "n1": Counter({1001: 1050})}
        capped = scan_expiries(ddb, TtlTable("inbox", table), cap=1000)
        assert not capped.complete and capped.items == 1000
        assert json.loads(_detail("inbox", scan))["expiries"]["n1"] == {"1001": 1050}
        assert describe_ttl(ddb, TtlTable("inbox", table)) == TtlStatus("DISABLED")
        ddb.update_time_to_live(
            TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"}
        )
        assert describe_ttl(ddb, TtlTable("inbox", table)) == TtlStatus("ENABLED", "ttl")
        # The reference's own tables, as provisioning left them.
        config = Config.load(stack.info.reference_config)
        for name in ("inbox", "celebrity_posts", "dedup_fallback", "event_registry"):
            on = describe_ttl(ddb, TtlTable("inbox", config.table(name)))
            assert on == TtlStatus("ENABLED", "expires_at"), name
        gone = describe_ttl(ddb, TtlTable("inbox", "ttl-no-such-table"))
        assert gone.status is None and "ResourceNotFoundException" in (gone.error or "")
    finally:
        ddb.delete_table(TableName=table)


def test_a_moved_clock_writes_its_expiries_on_the_systems_time():
    """A system whose clock ran 17 hours ahead wrote expiries 17 hours later than real time
    plus the TTL: right on its clock, so they pass less the offset; a real-clock 90 days is
    then 17 hours early."""
    offset = 17 * 3600
    moved = _history(
        inbox=[int(SENT + 0.2) + 90 * DAY + offset], fallback=[int(SENT + 30) + 30 * DAY + offset]
    )
    assert ttl_attributes.check(moved, TTLS, 5.0, offset).valid
    assert ttl_attributes.check(moved, TTLS, 5.0).counts["inbox_late"] == 3
    verdict = ttl_attributes.check(_history(), TTLS, 5.0, offset)
    assert verdict.counts["inbox_early"] == 3 and verdict.counts["dedup_fallback_early"] == 1
