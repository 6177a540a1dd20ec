"""The audit_fields checker over hand-made histories: a deferral's ``until`` against the end of
the recipient's window in their IANA zone (the oracle's local_time), and each record's time
against the instant the harness sent its event."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from engines import engine  # noqa: F401 - the fixture, pandas and DuckDB
from fake_run import population

from harness.checkers import audit_fields
from harness.model import local_time
from harness.model.history import History

pytestmark = pytest.mark.usefixtures("engine")

POP = population(quiet_zone="Asia/Kathmandu")
QUIET = next(u for u in POP.users if u.quiet_hours and u.zone == "Asia/Kathmandu")
NID = "01JD0000000000000000000000"


def _inside(user) -> float:
    """An instant inside the user's window (scanned minute by minute over a day)."""
    start = datetime(2026, 11, 24, tzinfo=UTC).timestamp()
    return next(
        t
        for t in (start + 60 * m for m in range(24 * 60))
        if local_time.inside(user.quiet_hours, user.zone, t)
    )


AT = _inside(QUIET)
END = local_time.window_end(QUIET.quiet_hours, QUIET.zone, AT)


def _history(until=None, at=AT, sent=AT - 2.0, reason="inside_window", user=QUIET.user_id):
    history = History()
    history.append("inject", time=sent, end=sent + 0.1, tenant_id=QUIET.tenant_id,
                   notification_id=NID)  # fmt: skip
    until = until if until is not None else datetime.fromtimestamp(END, UTC).isoformat()
    history.append(
        "audit", time=at, tenant_id=QUIET.tenant_id, notification_id=NID, reason="deferred",
        detail=json.dumps({"reason": reason, "until": until,
                           "decrypted": {"recipient_user_id": user}}),
    )  # fmt: skip
    history.append("audit", time=at, tenant_id=QUIET.tenant_id, notification_id="digest-x",
                   reason="sent", detail="{}")  # fmt: skip
    return history.frame()


def test_a_deferral_until_the_windows_end_in_the_users_zone_passes():
    verdict = audit_fields.check(_history(), POP, set(), 1.0)
    assert verdict.valid, verdict.details
    assert verdict.counts["deferrals"] == 1 and verdict.counts["deferrals_not_judged"] == 0
    assert verdict.counts["records"] == 2 and verdict.counts["records_judged"] == 1


@pytest.mark.parametrize(
    ("history", "count"),
    [
        # The end as a wall-clock time without its offset: no instant at all.
        (_history(until=datetime.fromtimestamp(END, UTC).replace(tzinfo=None).isoformat()),
         "until_not_an_instant"),
        (_history(until="tomorrow morning"), "until_not_an_instant"),
        # The end in UTC wall-clock time, read as if it were the zone's (+05:45 off).
        (_history(until=datetime.fromtimestamp(END + 20_700, UTC).isoformat()), "until_wrong"),
        (_history(until=datetime.fromtimestamp(END - 60, UTC).isoformat()), "until_wrong"),
        (_history(at=AT, sent=AT + 30), "records_before_injection"),
        (_history(at=float("nan")), "records_without_time"),
    ],
)  # fmt: skip
def test_each_wrong_field_is_caught(history, count):
    verdict = audit_fields.check(history, POP, set(), 1.0)
    assert verdict.valid is False and verdict.counts[count] == 1, verdict.counts


def test_deferrals_the_oracle_cannot_place_are_counted_not_judged():
    changed = {(QUIET.tenant_id, QUIET.user_id)}
    for verdict in (
        audit_fields.check(_history(until="x"), POP, changed, 1.0),
        audit_fields.check(_history(until="x", user="nobody"), POP, set(), 1.0),
        audit_fields.check(_history(until="x", reason="digest_window_open"), POP, set(), 1.0),
    ):
        assert verdict.valid, verdict.counts
    assert verdict.counts["deferrals"] == 0  # a digest's deferral is not a quiet-hours one


def test_no_audit_record_is_unknown_never_pass():
    assert audit_fields.check(History().frame(), POP, set(), 1.0).valid is None


def test_a_moved_clock_stamps_records_on_the_systems_time():
    """The system's clock an hour ahead: its record of an event the harness sent 2 s before
    (real time) is stamped an hour later, and the deferral's window is the one its clock
    shows. Judged less the offset it passes; a record stamped, on the system's clock, before
    its event was sent is still caught (on the real clock it would look an hour late)."""
    offset = 3600.0
    verdict = audit_fields.check(_history(at=AT, sent=AT - offset - 2.0), POP, set(), 1.0, offset)
    assert verdict.valid, verdict.counts
    assert verdict.counts["deferrals"] == 1 and verdict.counts["deferrals_not_judged"] == 0
    early = audit_fields.check(_history(at=AT, sent=AT - offset + 30), POP, set(), 1.0, offset)
    assert early.counts["records_before_injection"] == 1
