"""The nemesis runs faults in schedule order, records each window, and always rolls back."""

from __future__ import annotations

import json
import time

import pytest

from chaos import faults as catalogue
from chaos.faults import ChaosTargets, FaultError, FaultSpec, make_fault
from chaos.nemesis import Nemesis, ScheduledAction, ScheduledFault
from harness.checkers.windows import fault_windows
from harness.model.history import History


@pytest.fixture
def recording_fault(monkeypatch):
    """A catalogue entry that records start/undo calls instead of touching a server."""
    calls: list[str] = []

    def start(targets, params):
        calls.append(f"start {params['tag']}")
        return lambda: calls.append(f"stop {params['tag']}")

    monkeypatch.setitem(
        catalogue.CATALOGUE, "test-fault", FaultSpec("records calls", start, ("tag",))
    )
    return calls


def test_schedule_runs_in_order_and_records_windows(recording_fault):
    history = History()
    nemesis = Nemesis(
        [
            ScheduledFault(make_fault("test-fault", {"tag": "b"}), 0.2, 0.1),
            ScheduledFault(make_fault("test-fault", {"tag": "a"}), 0.0, 0.1),
        ],
        ChaosTargets(),
        history,
        log=lambda line: None,
        actions=[ScheduledAction("note", 0.25, lambda: "done")],
    )
    nemesis.start()
    assert nemesis.wait(10)
    assert recording_fault == ["start a", "stop a", "start b", "stop b"]
    frame = history.frame()
    windows = fault_windows(frame)
    assert [w.fault for w in windows] == ["test-fault", "test-fault"]
    assert all(w.stop >= w.start for w in windows)
    assert windows[0].stop <= windows[1].start
    assert frame[frame["kind"] == "action"]["detail"].tolist() == ["note: done"]
    assert nemesis.rollback() == []


def test_rollback_undoes_active_faults_and_records_the_stop(recording_fault):
    history = History()
    nemesis = Nemesis(
        [ScheduledFault(make_fault("test-fault", {"tag": "long"}), 0.0, 3600)],
        ChaosTargets(),
        history,
        log=lambda line: None,
    )
    nemesis.start()
    from harness.stack.supervisor import wait_until

    wait_until(lambda: recording_fault == ["start long"], 5, "the fault to start")
    assert nemesis.rollback() == ["test-fault"]
    assert recording_fault == ["start long", "stop long"]
    phases = [json.loads(d)["phase"] for d in history.frame().query("kind == 'fault'")["detail"]]
    assert phases == ["start", "stop"]


def test_a_window_closes_when_its_undo_began_not_when_it_returned(monkeypatch):
    """The dependency may be back from the moment the undo starts: the window judged is the
    span surely out, so a slow undo does not stretch it over sends made with the store back."""
    calls: list[float] = []

    def start(targets, params):
        def undo() -> None:
            calls.append(time.time())
            time.sleep(0.3)

        return undo

    monkeypatch.setitem(catalogue.CATALOGUE, "slow-undo", FaultSpec("slow undo", start))
    history = History()
    fault = make_fault("slow-undo", {})
    fault.start(ChaosTargets(), history)
    fault.stop(ChaosTargets(), history)
    [window] = fault_windows(history.frame())
    assert window.stop <= calls[0] + 0.01
    assert window.stop >= window.start


def test_a_failing_fault_is_reported_not_swallowed(monkeypatch):
    def start(targets, params):
        raise FaultError("no proxy here")

    monkeypatch.setitem(catalogue.CATALOGUE, "test-broken", FaultSpec("fails", start))
    nemesis = Nemesis(
        [ScheduledFault(make_fault("test-broken"), 0, 1)],
        ChaosTargets(),
        None,
        log=lambda line: None,
    )
    nemesis.start()
    assert nemesis.wait(10)
    assert nemesis.errors and "no proxy here" in nemesis.errors[0]


def test_unknown_fault_and_missing_params():
    with pytest.raises(FaultError, match="unknown fault 'nope'"):
        make_fault("nope")
    with pytest.raises(FaultError, match="needs parameter"):
        make_fault("fcm-quota", {})


@pytest.mark.integration
def test_the_worked_fault_in_extending_md_runs_against_the_real_fault_proxy(tmp_path):
    """docs/EXTENDING.md's fault, exactly as printed, registers itself, is refused without its
    parameter or on a target without a fault proxy, and installs and removes its toxic."""
    import re
    import sys
    import types
    from pathlib import Path

    import httpx
    from test_toxiproxy_api import spawn_toxiproxy

    from chaos.faults import unavailable
    from harness.stack.supervisor import stop_process

    text = (Path(__file__).resolve().parents[1] / "docs" / "EXTENDING.md").read_text()
    source = re.search(r"```python\n(# chaos/faults/dedup_trickle.py.*?)```", text, re.S)
    assert source is not None
    name = "chaos.faults.dedup_trickle"
    module = types.ModuleType(name)
    sys.modules[name] = module
    proc, port = spawn_toxiproxy()
    try:
        exec(compile(source.group(1), "EXTENDING.md", "exec"), module.__dict__)
        with pytest.raises(FaultError, match="rate_kb"):
            make_fault("dedup-trickle")
        assert "no fault proxy in front of its dedup store" in unavailable(
            "dedup-trickle", ChaosTargets()
        )
        api = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=api, timeout=10) as http:
            created = http.post(
                "/proxies", json={"name": "dedup", "listen": "127.0.0.1:0", "upstream": "x:1"}
            )
            assert created.status_code == 201, created.text
            history = History()
            fault = make_fault("dedup-trickle", {"rate_kb": 1})
            fault.start(ChaosTargets(toxiproxy_url=api), history)
            toxics = http.get("/proxies/dedup/toxics").json()
            assert [(t["type"], t["attributes"]["rate"]) for t in toxics] == [("bandwidth", 1)]
            fault.stop(ChaosTargets(toxiproxy_url=api), history)
            assert http.get("/proxies/dedup/toxics").json() == []
        windows = fault_windows(history.frame())
        assert [w.fault for w in windows] == ["dedup-trickle"]
    finally:
        stop_process(proc)  # type: ignore[arg-type]
        sys.modules.pop(name, None)
        catalogue.CATALOGUE.pop("dedup-trickle", None)


def test_what_a_fault_takes_away_is_a_property_of_the_fault_recorded_with_its_window(monkeypatch):
    """Every fault that leaves the dedup store unanswering (refused, black-holed until the
    client's own timeout, killed) records ``unavailable: dedup`` with its window, whatever its
    name; a proxy fault names what its proxy stands for; a slow store takes nothing away.
    fail_closed reads its outage windows from this record (harness/checkers/windows.py)."""
    targets = ChaosTargets(dedup_proxy="memorydb")
    takes = {
        ("dedup-outage", None): "dedup",
        ("dedup-blackhole", None): "dedup",
        ("dedup-crash", None): "dedup",
        ("proxy-down", "memorydb"): "dedup",
        ("proxy-timeout", "memorydb"): "dedup",
        ("proxy-down", "datastore"): "datastore",
        ("proxy-timeout", "datastore"): "datastore",
        ("proxy-latency", "memorydb"): None,
        ("dedup-slow", None): None,
        ("consumer-crash", None): None,
        ("consumer-restart", None): None,
        ("apns-status", None): None,
        # The stream invalidator killed: the preferences table's stream reaches no cache
        # (preference_changes then bounds table writes by the cache's TTL, API changes not).
        ("invalidator-stop", None): "preferences_stream",
    }
    for (name, proxy), expected in takes.items():
        params = {"proxy": proxy} if proxy else {}
        assert catalogue.taken_away(catalogue.CATALOGUE[name], targets, params) == expected, name
    # Recorded with the window: the undo of a fault that touches nothing here.
    spec = catalogue.CATALOGUE["proxy-timeout"]
    monkeypatch.setitem(
        catalogue.CATALOGUE,
        "proxy-timeout",
        FaultSpec(spec.description, lambda t, p: None, spec.required, takes_away=spec.takes_away),
    )
    history = History()
    fault = make_fault("proxy-timeout", {"proxy": "memorydb", "timeout_ms": 0})
    fault.start(targets, history)
    fault.stop(targets, history)
    details = [json.loads(d) for d in history.frame()["detail"]]
    assert [(d["phase"], d["unavailable"]) for d in details] == [
        ("start", "dedup"),
        ("stop", "dedup"),
    ]
    assert "stopped_part" not in details[0]  # it stops none of the system's processes
    # A process fault names the part it stopped (quiet_hours' releases wait for it).
    spec = catalogue.CATALOGUE["consumer-crash"]
    monkeypatch.setitem(
        catalogue.CATALOGUE,
        "consumer-crash",
        FaultSpec(spec.description, lambda t, p: None, part=spec.part, actions=spec.actions),
    )
    history = History()
    crash = make_fault("consumer-crash", {})
    crash.start(ChaosTargets(), history)
    crash.stop(ChaosTargets(), history)
    parts = [json.loads(d).get("stopped_part") for d in history.frame()["detail"]]
    assert parts == ["push-consumer", "push-consumer"]
