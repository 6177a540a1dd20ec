"""sustained_rate over hand-made histories: a backlog bled out at the stated quota passes; over
the quota, over a device's limit, and dawdling far below the quota each fail with counts; no
stated limit or no backlog lasting a window is unknown; providers without limits switch it off."""

from __future__ import annotations

import pandas as pd

from harness.checkers import sustained_rate
from harness.model.history import History
from harness.model.oracle import EXPECTED_COLUMNS, Expectation
from harness.model.population import Device, Population, PopulationSpec
from harness.model.provider_limits import KIND, ProviderLimits, recorded, sentence, summary
from harness.model.system import SystemPolicy

T = "acme"
QUOTA = 10  # per project per minute
POLICY = SystemPolicy(fcm_projects=("p0", "p1"), fcm_mapping="digits-mod")


def _population(n: int) -> Population:
    population = Population(seed=0, started_at=0.0, spec=PopulationSpec())
    population.devices = [Device(T, f"u{i:04d}", "fcm", f"tok-{i}", False) for i in range(n)]
    population.devices.append(Device(T, "u9999", "apns", "apns-tok", False))
    return population


def _limits(history: History, quota: int | None = QUOTA, enforced: bool = True) -> None:
    limits = ProviderLimits("fcm", quota, 240, 5000, enforced=enforced, set_by="scenario")
    history.append(KIND, time=0.0, detail=limits.to_detail())


def _backlog(history: History, n: int, at: float = 0.0) -> Expectation:
    """``n`` deliveries of one notification, accepted at ``at``, to users u0000.. (even ones
    on project p0, odd ones on p1 by digits-mod)."""
    history.append("inject", time=at, tenant_id=T, author_id="celeb", notification_id="n1")
    frame = pd.DataFrame(
        [(T, "n1", f"tok-{i}", f"u{i:04d}", None) for i in range(n)], columns=EXPECTED_COLUMNS
    )
    return Expectation(frame)


def _send(history: History, i: int, at: float, status: int = 200, nid: str = "n1") -> None:
    history.extend_provider(
        [
            {
                "received_at": at,
                "tenant_id": T,
                "notification_id": nid,
                "token": f"tok-{i}",
                "provider": "fcm",
                "project": "p0" if i % 2 == 0 else "p1",
                "status": status,
                "reason": "RESOURCE_EXHAUSTED" if status == 429 else None,
                "delivered": status == 200,
            }
        ]
    )


def _paced(history: History, n: int, start: float = 1.0, per_minute: float = QUOTA) -> None:
    """Each project's deliveries one every 60 / ``per_minute`` s, both projects side by side."""
    gap = 60.0 / per_minute
    for i in range(n):
        _send(history, i, start + (i // 2) * gap + (i % 2) * 0.01)


def _limited_backlog(n: int) -> tuple[History, Expectation]:
    """A history with the FCM limits stated and a backlog of ``n`` expected deliveries."""
    history = History()
    _limits(history)
    return history, _backlog(history, n)


def _check(history: History, expectation: Expectation, n: int, **kw):
    return sustained_rate.check(_population(n), expectation, history.frame(), POLICY, **kw)


def test_a_backlog_bled_out_at_the_quota_passes_and_states_the_fraction():
    history = History()
    _limits(history)
    expectation = _backlog(history, 60)  # 30 per project: three minutes of quota each
    _paced(history, 60)
    verdict = _check(history, expectation, 60)
    assert verdict.valid is True, verdict.to_dict()
    assert verdict.counts["backlog_windows"] > 100
    assert verdict.counts["windows_over_quota"] == 0
    assert verdict.counts["dawdling_windows"] == 0
    assert verdict.details["achieved_fraction"] >= 0.9
    assert verdict.details["limits"]["fcm"]["project_quota"] == QUOTA


def test_sends_over_the_quota_fail_with_the_requests_over_it():
    history, expectation = _limited_backlog(60)
    # The whole backlog at once: 30 requests per project in its first minute, 20 refused.
    for i in range(60):
        _send(history, i, 1.0 + i * 0.01, status=200 if i < 2 * QUOTA else 429)
    for i in range(2 * QUOTA, 60):  # the refused ones, retried a minute later at the quota
        _send(history, i, 62.0 + (i - 2 * QUOTA) * 3.0)
    verdict = _check(history, expectation, 60)
    assert verdict.valid is False
    assert verdict.counts["windows_over_quota"] == 2  # one per project
    assert verdict.counts["requests_over_quota"] == 40
    assert verdict.counts["quota_refusals"] == 40
    assert verdict.details["over_limit_examples"][0]["requests"] == 30


def test_a_backlog_left_waiting_far_below_the_quota_fails_as_dawdling():
    history, expectation = _limited_backlog(60)
    # A minute of quota in the first seconds, then nothing for three minutes (a pause far too
    # long after a 429), then the rest: never over the quota, far below it while work waited.
    for i in range(2 * QUOTA):
        _send(history, i, 1.0 + i * 0.1)
    for i in range(2 * QUOTA, 60):
        _send(history, i, 200.0 + (i - 2 * QUOTA) * 3.1)
    verdict = _check(history, expectation, 60)
    assert verdict.valid is False
    assert verdict.counts["windows_over_quota"] == 0
    assert verdict.counts["dawdling_windows"] > 100
    example = verdict.details["dawdling_examples"][0]
    assert example["accepted"] < 0.5 * example["allowed"]
    assert verdict.details["lowest_window_fraction"] == 0.0


def test_a_delivery_never_made_keeps_the_backlog_open_to_the_end():
    history, expectation = _limited_backlog(60)
    _paced(history, 58)  # the last two are never sent
    history.append("phase", time=400.0, detail="settled")
    verdict = _check(history, expectation, 60)
    assert verdict.counts["never_delivered"] == 2
    assert verdict.valid is False and verdict.counts["dawdling_windows"] > 0


def test_sends_over_a_devices_limit_fail():
    history = History()
    history.append(KIND, time=0.0, detail=ProviderLimits("fcm", 600_000, 240, 5000).to_detail())
    expectation = _backlog(history, 2)
    for k in range(250):  # one device, 250 requests in 25 s
        _send(history, 0, 1.0 + k * 0.1, nid=f"n{k}")
    _send(history, 1, 1.0)
    verdict = _check(history, expectation, 2)
    assert verdict.valid is False
    assert verdict.counts["device_windows_over_limit"] == 1
    assert verdict.counts["requests_over_device_limit"] == 10


def test_no_backlog_lasting_a_window_is_unknown():
    history, expectation = _limited_backlog(6)
    _paced(history, 6, per_minute=60)  # gone in 3 s: below a minute of quota
    verdict = _check(history, expectation, 6)
    assert verdict.valid is None
    assert "no backlog" in verdict.details["unknown"]
    assert verdict.counts["backlog_windows"] == 0


def test_no_stated_limit_is_unknown_and_providers_without_limits_switch_it_off():
    history = History()
    expectation = _backlog(history, 60)
    _paced(history, 60)
    verdict = _check(history, expectation, 60)
    assert verdict.valid is None and "no provider limits" in verdict.details["unknown"]
    _limits(history, enforced=False)
    verdict = _check(history, expectation, 60)
    assert verdict.valid is None and not verdict.applies


def test_without_a_stated_mapping_the_project_is_the_one_its_requests_went_to():
    history, expectation = _limited_backlog(60)
    for i in range(2 * QUOTA):
        _send(history, i, 1.0 + i * 0.1)
    for i in range(2 * QUOTA, 60):
        _send(history, i, 200.0 + (i - 2 * QUOTA) * 3.1)
    verdict = sustained_rate.check(_population(60), expectation, history.frame(), SystemPolicy())
    assert verdict.counts["unattributed_deliveries"] == 0
    assert verdict.valid is False and verdict.counts["dawdling_windows"] > 100


def test_the_limits_recorded_are_read_back_and_said_in_the_report():
    history = History()
    _limits(history, quota=120)
    found = recorded(history.frame())
    assert found["fcm"].project_quota == 120 and found["fcm"].set_by == "scenario"
    said = sentence(summary(history.frame()))
    assert "FCM project quota 120 messages per 60 s per project (set by the scenario)" in said
    assert "per device 240/min and 5000/h" in said
