"""The checkers benchmark's synthetic history, small: the generator agrees with the oracle, and
every checker finds exactly what was planted and what a slow row-by-row reference counts."""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import importlib.util
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from harness.checkers import Evidence, run_probe
from harness.checkers.registry import get
from harness.checkers.store import (
    HistoryStore,
    _dictionary_join,
    _Finishing,
)
from harness.model.history import COLUMNS
from harness.model.oracle import expected_deliveries

ROOT = Path(__file__).resolve().parent.parent
ROWS = 20_000
KEY = ("tenant_id", "notification_id", "token")
# Out-of-core checkers the synthetic history gives nothing to judge, and where both engines are
# held equal instead.
NOT_SYNTHESIZED = {
    "audit_per_copy": "no SQS receive log: tests/test_audit_per_copy.py, against a "
    "record-by-record reading, on both engines",
}


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_checkers", ROOT / "benchmarks/bench_checkers.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()


@pytest.fixture(scope="module")
def synthetic():
    return bench.synthesize(ROWS, seed=3)


@pytest.fixture(scope="module", params=["pandas", "duckdb"])
def engine(request):
    return request.param


@pytest.fixture(scope="module")
def verdicts(synthetic, engine):
    """Every checker's verdict, the history in memory (pandas) or on disk (DuckDB)."""
    evidence = synthetic.evidence()
    with HistoryStore.from_frame(synthetic.history, synthetic.expectation) as store:
        if engine == "duckdb":
            evidence = dataclasses.replace(evidence, store=store)
        return {
            name: run_probe(name, bench.TOLERANCES.get(name, {}), evidence)
            for name in synthetic.planted
        }


def _rows(history):
    return [
        {k: (None if v is pd.NA else v) for k, v in row.items()}
        for row in history.to_dict("records")
    ]


def _delivered(rows):
    return [
        r
        for r in rows
        if r["kind"] == "provider"
        and (r["delivered"] if r["delivered"] is not None else r["status"] == 200)
    ]


def _windows(rows, names):
    opened, windows = {}, []
    for r in rows:
        if r["kind"] != "fault":
            continue
        detail = json.loads(r["detail"])
        if detail["fault"] not in names:
            continue
        if detail["phase"] == "start":
            opened[detail["window"]] = r["time"]
        elif detail["window"] in opened:
            windows.append((opened.pop(detail["window"]), r["time"]))
    end = max(r["time"] for r in rows)
    return windows + [(start, end) for start in opened.values()]


# --- slow references: one Python loop over the rows each -------------------------------------


def ref_effectively_once(expectation, rows):
    per_key = defaultdict(list)
    for r in _delivered(rows):
        per_key[tuple(r[k] for k in KEY)].append(r["collapse_id"])
    expected = {tuple(e) for e in expectation.deliveries[list(KEY)].itertuples(index=False)}
    both = [k for k in per_key if k in expected]
    collapsed = sum(
        len(ids) - 1 for k in both if None not in (ids := per_key[k]) and len(set(ids)) == 1
    )
    duplicated = sum(len(ids) - 1 for ids in per_key.values())
    return {
        "expected": len(expected),
        "delivered": len(both),
        "duplicated": duplicated,
        "collapsed": collapsed,
        "visible_duplicates": duplicated - collapsed,
        "lost": len(expected - set(per_key)),
        "unexpected": sum(len(ids) for k, ids in per_key.items() if k not in expected),
    }


def ref_fail_closed(rows, grace_s):
    windows = _windows(rows, ("dedup-outage", "dedup-blackhole", "dedup-crash"))
    delivered = _delivered(rows)
    during = [r for r in delivered if any(a + grace_s < r["time"] < b for a, b in windows)]
    n = Counter(tuple(r[k] for k in KEY) for r in delivered)
    keys_during = {tuple(r[k] for k in KEY) for r in during}
    return {
        "outage_windows": len(windows),
        "deliveries_during_outage": len(during),
        "duplicated_across_outage": sum(n[k] - 1 for k in keys_during),
    }


def ref_backpressure(rows, slack_s):
    scopes = defaultdict(list)
    throttles = []
    for r in rows:
        if r["kind"] != "provider":
            continue
        scope = f"{r['provider']}/{r['project'] or ''}"
        scopes[scope].append(r["time"])
        if r["retry_after"] == r["retry_after"] and r["retry_after"] and r["retry_after"] > 0:
            throttles.append((scope, r["time"], r["retry_after"]))
    for times in scopes.values():
        times.sort()
    ignored = 0
    for scope, at, retry_after in throttles:
        times = scopes[scope]
        # The slack runs from the scope's first request after the answer when none came
        # within it (a burst read after a silence).
        after = bisect.bisect_right(times, at)
        first = times[after] if after < len(times) else at
        begin = first if first > at + slack_s else at
        lo = bisect.bisect_right(times, begin + slack_s)
        hi = bisect.bisect_left(times, at + retry_after)
        ignored += max(0, hi - lo)
    per_second = Counter(int(r["time"]) for r in rows if r["kind"] == "provider")
    return {
        "throttle_answers": len(throttles),
        "requests_inside_retry_after": ignored,
        "peak_requests_per_s": max(per_second.values()),
    }


def ref_dead_tokens(rows, transit_s):
    dead_at = {}
    for r in rows:
        if r["kind"] != "provider":
            continue
        apns = r["provider"] == "apns" and r["status"] == 410
        fcm = r["provider"] == "fcm" and r["reason"] == "UNREGISTERED"
        if apns or fcm:
            key = (r["tenant_id"], r["token"])
            told = r["time"] if pd.isna(r.get("end")) else r["end"]
            dead_at[key] = min(dead_at.get(key, told), told)
    after = sum(
        1
        for r in rows
        if r["kind"] == "provider"
        and (r["tenant_id"], r["token"]) in dead_at
        and r["time"] > dead_at[(r["tenant_id"], r["token"])] + transit_s
    )
    return {"dead_tokens": len(dead_at), "sends_after_dead": after}


def ref_consent(population, rows):
    consent = {(u.tenant_id, u.user_id): u.consent is not None for u in population.users}
    device_consent = {
        (d.tenant_id, d.token): consent[(d.tenant_id, d.user_id)] for d in population.devices
    }
    bad = sum(
        1 for r in _delivered(rows) if device_consent.get((r["tenant_id"], r["token"])) is False
    )
    return {
        "users_without_consent": sum(1 for u in population.users if u.consent is None),
        "deliveries_without_consent": bad,
    }


def ref_quiet_hours(population, expectation, rows, bound):
    state = {(u.tenant_id, u.user_id): u.quiet_state for u in population.users}
    whole = {
        (d.tenant_id, d.token)
        for d in population.devices
        if state[(d.tenant_id, d.user_id)] == "whole_run"
    }
    delivered = _delivered(rows)
    first = {}
    for r in delivered:
        key = tuple(r[k] for k in KEY)
        first[key] = min(first.get(key, r["time"]), r["time"])
    deferred = expectation.deliveries.dropna(subset=["quiet_until"])
    early = late = arrived = 0
    for e in deferred.itertuples(index=False):
        at = first.get((e.tenant_id, e.notification_id, e.token))
        if at is None:
            continue
        arrived += 1
        early += at < e.quiet_until
        late += at - e.quiet_until > bound
    inside_whole_run = sum(1 for r in delivered if (r["tenant_id"], r["token"]) in whole)
    return {
        "deferred_expected": len(deferred),
        "deferred_delivered": arrived,
        "delivered_inside_window": early + inside_whole_run,
        "released_late": late,
    }


def ref_tenant_isolation(population, expectation, rows):
    devices = {(d.tenant_id, d.token) for d in population.devices}
    delivered = _delivered(rows)
    tenants = defaultdict(set)
    for r in rows:
        if r["kind"] == "inject":
            tenants[r["notification_id"]].add(r["tenant_id"])
    shared = {nid for nid, ts in tenants.items() if len(ts) > 1}
    seen = {tuple(r[k] for k in KEY) for r in delivered}
    lost = sum(
        1
        for e in expectation.deliveries.itertuples(index=False)
        if e.notification_id in shared and (e.tenant_id, e.notification_id, e.token) not in seen
    )
    owners = Counter(token for _, token in devices)
    return {
        "ids_minted_by_several_tenants": len(shared),
        "devices_shared_by_tenants": sum(1 for n in owners.values() if n > 1),
        "deliveries_to_foreign_devices": sum(
            1 for r in delivered if (r["tenant_id"], r["token"]) not in devices
        ),
        "shared_id_deliveries_lost": lost,
    }


def ref_dlq_accountability(expectation, rows):
    seen = {tuple(r[k] for k in KEY) for r in _delivered(rows)}
    parked = {
        (r["tenant_id"], r["notification_id"], json.loads(r["detail"])["recipient_user_id"])
        for r in rows
        if r["kind"] == "dlq"
    }
    in_dlq = vanished = 0
    for e in expectation.deliveries.itertuples(index=False):
        if (e.tenant_id, e.notification_id, e.token) in seen:
            continue
        if (e.tenant_id, e.notification_id, e.user_id) in parked:
            in_dlq += 1
        else:
            vanished += 1
    return {
        "expected": len(expectation.deliveries),
        "in_dlq": in_dlq,
        "vanished": vanished,
        "dlq_messages": sum(1 for r in rows if r["kind"] == "dlq"),
    }


def ref_audit_outcomes(rows):
    records = {
        (r["tenant_id"], r["notification_id"], r["detail"])
        for r in rows
        if r["kind"] == "audit" and r["reason"] == "sent"
    }
    sent = Counter((t, n, json.loads(d)["decrypted"]["token_sha256"]) for t, n, d in records)
    accepted = Counter(
        (r["tenant_id"], r["notification_id"], hashlib.sha256(r["token"].encode()).hexdigest())
        for r in rows
        if (r["kind"] == "provider" and r["provider"] in ("apns", "fcm") and r["status"] == 200)
        or (r["kind"] == "sns_publish" and r["reason"] is None)
    )
    over = {k: n - accepted[k] for k, n in sent.items() if n > accepted[k]}
    return {
        "sent_records": sum(sent.values()),
        "devices_judged": len(sent),
        "sent_beyond_acceptance": sum(over.values()),
        "devices_over": len(over),
    }


def _references(synthetic):
    rows = _rows(synthetic.history)
    population, expectation = synthetic.population, synthetic.expectation
    tolerance = bench.TOLERANCES
    return {
        "effectively_once": ref_effectively_once(expectation, rows),
        "fail_closed": ref_fail_closed(rows, tolerance["fail_closed"]["grace_s"]),
        "backpressure": ref_backpressure(rows, tolerance["backpressure"]["slack_s"]),
        "dead_tokens": ref_dead_tokens(rows, tolerance["dead_tokens"]["transit_s"]),
        "consent": ref_consent(population, rows),
        "quiet_hours": ref_quiet_hours(
            population, expectation, rows, tolerance["quiet_hours"]["release_bound_s"]
        ),
        "tenant_isolation": ref_tenant_isolation(population, expectation, rows),
        "dlq_accountability": ref_dlq_accountability(expectation, rows),
        "audit_outcomes": ref_audit_outcomes(rows),
    }


# --- tests -----------------------------------------------------------------------------------


def test_history_has_the_requested_rows_and_the_runners_dtypes(synthetic):
    history = synthetic.history
    assert len(history) == ROWS
    assert list(history.columns) == list(COLUMNS)
    assert (
        history.dtypes.to_dict()
        == pd.DataFrame(columns=list(COLUMNS)).astype(COLUMNS).dtypes.to_dict()
    )
    kinds = history["kind"].value_counts()
    assert kinds["provider"] > 0.9 * ROWS
    assert {"inject", "fault", "dlq", "sample"} <= set(kinds.index)


def test_generated_expectation_is_the_oracles(synthetic):
    injected = synthetic.history[synthetic.history["kind"] == "inject"]
    oracle = expected_deliveries(synthetic.population, injected)
    pd.testing.assert_frame_equal(synthetic.expectation.deliveries, oracle.deliveries)
    assert synthetic.expectation.suppressed == oracle.suppressed


def test_every_planted_defect_is_found(synthetic, verdicts):
    planted = synthetic.planted
    assert planted["effectively_once"]["duplicated"] > planted["effectively_once"]["collapsed"] > 0
    assert planted["fail_closed"]["deliveries_during_outage"] > 0
    assert planted["backpressure"]["requests_inside_retry_after"] > 0
    assert planted["dead_tokens"]["sends_after_dead"] > 0
    assert planted["dlq_accountability"]["in_dlq"] > 0
    assert planted["audit_outcomes"]["sent_beyond_acceptance"] > 0
    for name, counts in planted.items():
        found = {k: verdicts[name].counts[k] for k in counts}
        assert found == counts, name
        assert not verdicts[name].valid, name


@pytest.fixture(scope="module")
def references(synthetic):
    return _references(synthetic)


@pytest.mark.parametrize(
    "name",
    [
        "effectively_once",
        "fail_closed",
        "backpressure",
        "dead_tokens",
        "consent",
        "quiet_hours",
        "tenant_isolation",
        "dlq_accountability",
        "audit_outcomes",
    ],
)
def test_checker_counts_equal_a_row_by_row_reference(verdicts, references, name):
    reference = references[name]
    assert {k: verdicts[name].counts[k] for k in reference} == reference


def test_both_engines_give_the_same_verdicts_and_details(synthetic):
    """Every registered checker, run on the history in memory and on disk: the same valid, the
    same counts and the same details (examples included)."""
    evidence = synthetic.evidence()
    with HistoryStore.from_frame(synthetic.history, synthetic.expectation) as store:
        on_disk = dataclasses.replace(evidence, store=store)
        for name in bench.known_checkers():
            tolerance = bench.TOLERANCES.get(name, {})
            in_memory, out_of_core = (run_probe(name, tolerance, e) for e in (evidence, on_disk))
            assert out_of_core.to_dict() == in_memory.to_dict(), name
            judged = "unknown" not in out_of_core.details
            assert judged or not get(name).out_of_core or name in NOT_SYNTHESIZED, name
            assert not (judged and name in NOT_SYNTHESIZED), name


def test_a_replaced_column_is_read_again(synthetic):
    """Checkers keep per-column encodings while a frame lives; replacing a column must not
    leave them reading the old one."""
    history = synthetic.history.copy()
    evidence = Evidence(synthetic.population, synthetic.expectation, history)
    before = run_probe("effectively_once", {}, evidence).counts
    delivered = history.index[(history["kind"] == "provider") & (history["status"] == 200)]
    tokens = history["token"].copy()
    tokens[delivered[:10]] = "replaced-token"
    history["token"] = tokens
    after = run_probe("effectively_once", {}, evidence).counts
    reference = ref_effectively_once(synthetic.expectation, _rows(history))
    assert {k: after[k] for k in reference} == reference
    assert after["unexpected"] >= before["unexpected"] + 1


def test_benchmark_writes_its_report(tmp_path):
    out = tmp_path / "checkers.json"
    argv = ["--rows", "5000", "--out", str(out), "--probes", "effectively_once,consent"]
    assert bench.main(argv) == 0
    report = json.loads(out.read_text())
    size = report["sizes"]["5000"]
    assert size["rows"] == 5000
    assert set(size["engines"]) == {"pandas", "duckdb"}
    for run in size["engines"].values():
        assert set(run["checker_seconds"]) == {"effectively_once", "consent"}
        assert run["under_limits"] is True
        assert run["peak_rss_mb"] > 0
        assert run["planted_found"] == {"effectively_once": True, "consent": True}
    assert size["engines_agree"] == {"effectively_once": True, "consent": True}
    assert "prepare_seconds" in size["engines"]["duckdb"]
    for run in size["engines"].values():
        assert 0 < run["checkers_cpu_seconds"] <= run["total_cpu_seconds"]
    assert size["engines"]["duckdb"]["prepare_cpu_seconds"] > 0


def _codes(con: duckdb.DuckDBPyConnection, join: str) -> list[int | None]:
    return [
        code
        for (code,) in con.execute(
            f"SELECT d.code FROM rows r {join.format(alias='d', column='r.v')} ORDER BY r.i"
        ).fetchall()
    ]


def test_a_dictionary_whose_hashes_clash_is_joined_on_its_strings():
    """The store joins values to their codes by hash only when no two entries of the
    dictionary share a hash; else on the strings, with the same codes (a null its own)."""
    con = duckdb.connect()
    finishing = _Finishing(con)
    con.execute(
        "CREATE TABLE tokens AS SELECT * FROM (VALUES ('a', 0), ('b', 1), (NULL, 2)) t(value, code)"
    )
    con.execute(
        "CREATE TABLE rows AS SELECT * FROM (VALUES (0, 'b'), (1, NULL), (2, 'a'), (3, 'b')) r(i, v)"
    )
    hashed = _dictionary_join(finishing, "tokens")("{alias}", "{column}")
    assert "hash(" in hashed
    assert _codes(con, hashed) == [1, 2, 0, 1]
    # Two entries with one hash (a value twice stands in for a clash): the strings decide.
    con.execute("INSERT INTO tokens VALUES ('a', 3)")
    by_string = _dictionary_join(finishing, "tokens")("{alias}", "{column}")
    assert "hash(" not in by_string
    assert sorted(_codes(con, by_string), key=str) == [0, 1, 1, 2, 3]


def test_the_checkers_tables_stay_out_of_the_history_file(synthetic):
    """The history's tables are in the store's file; what the checkers make (per-key tables)
    is in memory, spilling past the cap, and does not grow the file."""
    evidence = synthetic.evidence()
    with HistoryStore.from_frame(synthetic.history, synthetic.expectation) as store:
        run_probe("effectively_once", {}, dataclasses.replace(evidence, store=store))
        where = dict(store.sql("SELECT table_name, database_name FROM duckdb_tables()").fetchall())
    assert where["prov"] == where["exp"] == "history"
    assert where["dkeys"] == where["once_keys"] == "scratch"


def test_a_nan_in_a_float_column_reads_as_missing_on_both_engines(synthetic, tmp_path):
    """A file may hold NaN where pandas sees a missing value (dead_tokens falls back from
    ``end`` to ``time``): the store reads it as null."""
    table = pa.Table.from_pandas(synthetic.history, preserve_index=False)
    nan_end = pa.array(np.full(len(table), np.nan), pa.float64(), from_pandas=False)
    table = table.set_column(table.schema.get_field_index("end"), "end", nan_end)
    assert pc.is_nan(table["end"]).to_numpy().all()
    pq.write_table(table, tmp_path / "history.parquet")
    evidence = synthetic.evidence()
    with HistoryStore(
        tmp_path / "history.parquet", synthetic.expectation, workdir=tmp_path / "db"
    ) as store:
        on_disk = dataclasses.replace(evidence, store=store)
        for name in ("dead_tokens", "effectively_once"):
            tolerance = bench.TOLERANCES.get(name, {})
            expected = run_probe(name, tolerance, evidence).to_dict()
            assert run_probe(name, tolerance, on_disk).to_dict() == expected, name


def test_a_provider_row_that_says_nothing_is_unknown_on_both_engines(synthetic):
    """Neither delivered nor a status: the checkers that read deliveries cannot judge (both
    engines), the others still do."""
    history = synthetic.history.copy()
    row = history.index[history["kind"] == "provider"][0]
    history.loc[row, ["delivered", "status"]] = pd.NA
    evidence = Evidence(synthetic.population, synthetic.expectation, history)
    with HistoryStore.from_frame(history, synthetic.expectation) as store:
        on_disk = dataclasses.replace(evidence, store=store)
        for name in ("effectively_once", "quiet_hours", "backpressure"):
            tolerance = bench.TOLERANCES.get(name, {})
            in_memory, out_of_core = (run_probe(name, tolerance, e) for e in (evidence, on_disk))
            assert (in_memory.valid is None) == (out_of_core.valid is None), name
            assert (out_of_core.valid is None) == (name != "backpressure"), name


def test_judged_on_disk_every_checker_ignores_the_evidences_own_frame(synthetic, tmp_path):
    """What the runner does with a large history: the whole history on disk, the evidence's own
    frame without the rows only checkers read (and without, here, everything else a checker
    could read from it but the oracle's inputs): every checker still reaches the verdict it
    reaches in memory, so none reads ``evidence.history`` beside the store."""
    from harness.checkers.store import judged_on_disk
    from harness.model.history import CHECKER_ONLY_KINDS, SCHEMA

    full = synthetic.evidence()
    path = tmp_path / "history.parquet"
    pq.write_table(
        pa.Table.from_pandas(synthetic.history, schema=SCHEMA, preserve_index=False), path
    )
    kinds = synthetic.history["kind"]
    assert kinds.isin(CHECKER_ONLY_KINDS).any()  # the audit rows the slim frame leaves out
    slim = synthetic.history[kinds.isin(["inject", "inject_info"])]
    with judged_on_disk(dataclasses.replace(full, history=slim), path, tmp_path / "store") as disk:
        assert disk.store is not None
        for name in synthetic.planted:
            tolerance = bench.TOLERANCES.get(name, {})
            assert run_probe(name, tolerance, disk) == run_probe(name, tolerance, full), name
    assert not (tmp_path / "store").exists()
