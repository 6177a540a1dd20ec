"""notification_ids: a ULID id carries its event's acceptance time (red team 3), and the load
can leave the id to the system."""

from __future__ import annotations

from ulid import ULID

from harness.checkers import notification_ids
from harness.contract.driver import Event, FanoutApiDriver
from harness.model.history import History

T = "tenant-0"


def _accepted(history: History, nid: str, sent: float, answered: float) -> None:
    history.append("inject", time=sent, end=answered, tenant_id=T, author_id="a",
                   notification_id=nid, detail="post")  # fmt: skip


def test_ids_minted_at_acceptance_pass_and_ids_off_their_time_fail() -> None:
    history = History()
    _accepted(history, str(ULID.from_timestamp(1_800_000_000.25)), 1_800_000_000.2, 1_800_000_000.3)
    _accepted(history, "evt-not-a-ulid", 1_800_000_001.0, 1_800_000_001.1)  # another format
    # Posted again 50 s later with the same id (an idempotent retry): its first acceptance holds.
    again = str(ULID.from_timestamp(1_800_000_002.0))
    _accepted(history, again, 1_800_000_001.9, 1_800_000_002.1)
    _accepted(history, again, 1_800_000_052.0, 1_800_000_052.1)
    verdict = notification_ids.check(history.frame(), skew_s=1.0)
    assert verdict.valid, verdict.details
    assert verdict.counts == {"ids": 3, "judged": 2, "not_judged": 1, "minted_off_acceptance": 0}
    # The planted bug: ULID.from_timestamp(int(seconds)), which python-ulid reads as ms (1970).
    _accepted(history, str(ULID.from_timestamp(1_800_000_003)), 1_800_000_003.0, 1_800_000_003.1)
    # And an id minted 3 s before its POST (a clock off by more than the skew).
    _accepted(history, str(ULID.from_timestamp(1_800_000_001.0)), 1_800_000_004.0, 1_800_000_004.1)
    verdict = notification_ids.check(history.frame(), skew_s=1.0)
    assert not verdict.valid
    assert verdict.counts["minted_off_acceptance"] == 2
    assert verdict.details["examples"][0]["id_time"] < 1_000_000_000


def test_a_run_without_accepted_events_is_unknown_not_a_pass() -> None:
    assert notification_ids.check(History().frame(), skew_s=1.0).valid is None


def test_an_event_without_an_id_leaves_the_id_to_the_system() -> None:
    driver = FanoutApiDriver()
    minted = driver.post_event(Event(T, "a", "post", "o", None))
    assert "event_id" not in minted.body
    chosen = driver.post_event(Event(T, "a", "post", "o", "01JD5V3KX9B9Q0ZC4S6Y2M8N7P"))
    assert chosen.body["event_id"] == "01JD5V3KX9B9Q0ZC4S6Y2M8N7P"


def test_ids_minted_on_a_moved_clock_are_read_back_in_real_time() -> None:
    """A scenario that moved the system's clock 17 h ahead: its ids carry that clock's time
    (day-boundary's moved smoke failed all 8 before the offset was taken off)."""
    offset = 17 * 3600.0
    history = History()
    _accepted(history, str(ULID.from_timestamp(1_800_000_000.25 + offset)), 1_800_000_000.2,
              1_800_000_000.3)  # fmt: skip
    assert notification_ids.check(history.frame(), 1.0, clock_offset_s=offset).valid
    assert not notification_ids.check(history.frame(), 1.0).valid
