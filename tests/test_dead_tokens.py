"""What one poller learns and every poller of the consumer must honour at once (threads and
forked worker processes): recently dead tokens (reference_impl/dead_tokens.py) and Retry-After
pauses (ProviderGate over reference_impl/shared_deadlines.py)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from reference_impl.dead_tokens import DeadTokens
from reference_impl.providers import ProviderGate, fcm_send_interval
from reference_impl.shared_deadlines import SharedDeadlines


def test_a_dead_token_is_remembered_for_a_while_then_forgotten():
    now = [100.0]
    table = DeadTokens(remember_seconds=60, clock=lambda: now[0])
    assert not table.dead("t0", "u1#d1")
    table.add("t0", "u1#d1")
    assert table.dead("t0", "u1#d1")
    assert not table.dead("t1", "u1#d1")  # per tenant
    assert not table.dead("t0", "u1#d2")
    now[0] += 59
    assert table.dead("t0", "u1#d1")
    now[0] += 2
    assert not table.dead("t0", "u1#d1")  # the deactivated record decides from here on
    table.add("t0", "u1#d1")
    assert table.dead("t0", "u1#d1")


def test_many_dead_tokens_are_all_remembered():
    table = DeadTokens()
    for n in range(5000):
        table.add("t0", f"u{n}#d")
    assert all(table.dead("t0", f"u{n}#d") for n in range(5000))
    assert not any(table.dead("t0", f"v{n}#d") for n in range(5000))


def _add_in_child(table: DeadTokens) -> None:
    table.add("t0", "child#d")


def test_a_forked_worker_sees_what_another_added():
    table = DeadTokens()
    child = multiprocessing.get_context("fork").Process(target=_add_in_child, args=(table,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert table.dead("t0", "child#d")


def _pause_in_child(gate: ProviderGate) -> None:
    gate.pause("apns", 30)


def test_a_retry_after_in_one_worker_process_pauses_the_scope_for_the_others():
    """The gate of each forked worker shares its pauses: a 429 in one holds every one."""
    pauses = SharedDeadlines(slots=1024)
    mine = ProviderGate(32, pauses=pauses)
    theirs = ProviderGate(32, pauses=pauses)
    child = multiprocessing.get_context("fork").Process(target=_pause_in_child, args=(theirs,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert 29 < mine.paused_for("apns") <= 30
    assert mine.paused_for("fcm/fanout-sender-0") == 0.0
    mine.pause("apns", 5)  # a shorter Retry-After never shortens a pause
    assert mine.paused_for("apns") > 29


def test_a_deadline_table_keeps_the_latest_and_forgets_what_passed():
    now = [10.0]
    table = SharedDeadlines(slots=16, clock=lambda: now[0])
    table.extend("a", 20.0)
    table.extend("a", 15.0)
    assert table.deadline("a") == 20.0 and table.left("a") == 10.0
    for n in range(40):  # more keys than slots: neighbourhoods fill, the earliest goes
        table.extend(f"k{n}", 100.0 + n)
    assert table.left("k39") == 129.0
    now[0] = 500.0
    assert table.left("k39") == 0.0


def _sends_in_child(gate: ProviderGate, times, n: int) -> None:
    for _ in range(n):
        with gate.slot("fcm/fanout-sender-0"):
            times.append(time.monotonic())


def test_every_worker_process_paces_one_fcm_project_to_its_quota_together():
    """The FCM quota is the consumer's, not each process's: two forked processes sending to one
    project as fast as they can keep, together, to 95% of it (a quota of 600 a minute: one
    send each 1/9.5 s); APNs states no quota and is not paced."""
    pauses = SharedDeadlines(slots=1024)
    gates = [ProviderGate(32, pauses=pauses, fcm_quota_per_minute=600) for _ in range(2)]
    with multiprocessing.get_context("fork").Manager() as manager:
        times = manager.list()
        children = [
            multiprocessing.get_context("fork").Process(
                target=_sends_in_child, args=(gate, times, 5)
            )
            for gate in gates
        ]
        for child in children:
            child.start()
        for child in children:
            child.join(30)
            assert child.exitcode == 0
        sent = sorted(times)
    assert len(sent) == 10
    # Ten sends at one each 60 / 570 s: at least nine gaps apart (a late wake-up may bring two
    # recorded instants closer, never the whole run shorter than the pace allows).
    assert sent[-1] - sent[0] >= 9 * 60 / (600 * 0.95) - 0.1
    with gates[0].slot("apns"):
        pass
    assert pauses.deadline("pace:apns") == 0.0  # only FCM projects are paced
    assert pauses.deadline("pace:fcm/fanout-sender-0") > 0.0
    assert fcm_send_interval(600, ("fcm_quota_unpaced",)) is None
    assert fcm_send_interval(600, ("fcm_quota_per_hour",)) == pytest.approx(60 * 60 / 570)
