"""Push attributes: every push the oracle requires asks its provider for what the design needs.

The design's pushes are alerts a person sees ("a generic body when locked", seed 000), sent
when the system decides (quiet hours defer in the system) and kept by the provider for a device
that is offline: a deferred push is delivered, never dropped. No seed names a header value, so
what is expected is the system's stated policy (``harness/model/system.py``; null switches one
attribute off), with these defaults, Apple's and Google's meaning of each:

* ``wrong_push_type``: APNs ``apns-push-type`` other than ``policy.apns_push_type`` (``alert``;
  ``background`` is a silent push the device may drop or throttle). A missing header is wrong
  too: Apple requires it since iOS 13. FCM rows are not judged on it (Android has none).
* ``wrong_priority``: APNs ``apns-priority`` (absent: 10) other than ``policy.apns_priority``
  (10: now; 5 is delivered when the device's power allows, grouped and throttled); FCM
  ``android.priority`` (absent: high for a notification message, normal for a data one, as
  Google's ``AndroidConfig`` says; an ``apns-priority`` the message carries for iOS instead is
  read as 10 = high, 5 and 1 = normal) other than ``policy.fcm_priority`` (high: normal waits
  out Doze).
* ``not_stored``: the time the provider may keep the push for an offline device below
  ``policy.push_min_ttl_s`` (1 s): APNs ``apns-expiration`` ``0`` (deliver once, never stored)
  or an instant at most that far past its arrival (an expiration written as a duration, 3600,
  is 1970: expired on arrival), judged in the system's time (real time plus the offset a
  scenario moved its clock by); FCM ``android.ttl`` (``"0s"``). Absent: the provider's default
  (APNs stores it, FCM keeps it four weeks). A value no provider reads counts too.
* ``empty_text``: no alert, or one with nothing in it (APNs ``aps.alert``; FCM the
  notification's title and body), with ``policy.push_text_required``.
* ``wrong_text``: a text other than the one the system says it makes of this notification's
  event (``policy.push_text``, a template over the fields the harness posted: author, kind,
  object, tenant, id; title and body joined by a newline, as the simulators record them):
  another notification's text under the right id, a text made of the wrong field. The event is
  the harness's own ``inject`` row for the (tenant, notification); an id posted more than once
  may carry any of its posts' texts. Null (the default): which text is not judged.

Judged: every provider request that delivered (a 200, or accepted then an error) a push the
oracle requires (``Expectation.deliveries``; optional and rate-limited ones are not judged),
through either transport: the simulators record what arrives, whether the system or SNS built
it. A count is of requests. The first ``EXAMPLES`` of each kind are the ``examples`` (kind,
provider, tenant, notification, token, the value as sent and the value judged). Nothing judged
is *unknown*, never a pass.

One rule, in SQL, for both engines: over the judged rows in memory (a frame DuckDB reads in
place) or over the history on disk (:class:`~harness.checkers.store.HistoryStore`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from harness.checkers.evidence import Evidence
from harness.checkers.keys import joint_keys, member, sorted_unique
from harness.checkers.registry import checker
from harness.checkers.store import HistoryStore
from harness.checkers.verdict import Verdict
from harness.checkers.windows import delivery_rows
from harness.model.oracle import Expectation
from harness.model.system import PUSH_TEXT_FIELDS, SystemPolicy

NAME = "push_attributes"
KEY = ["tenant_id", "notification_id", "token"]
ATTRIBUTES = ["push_type", "priority", "expiration", "text"]
COLUMNS = ["pos", *KEY, "provider", "time", *ATTRIBUTES]
# The event each judged push's text is made of: the harness's inject rows.
EVENT_COLUMNS = ["tenant_id", "notification_id", "author_id", "kind", "object_id"]
KINDS = ("wrong_push_type", "wrong_priority", "not_stored", "empty_text", "wrong_text")
# what each kind shows of the row: the value as sent, and the value judged
SHOWN = {
    "wrong_push_type": ("push_type", "push_type"),
    "wrong_priority": ("priority", "effective_priority"),
    "not_stored": ("expiration", "lifetime_s"),
    "empty_text": ("text", "text"),
    "wrong_text": ("text", "expected_text"),
}
EXAMPLES = 5
PROVIDERS = ("apns", "fcm")


@dataclass(frozen=True)
class Rules:
    """What a push must ask of its provider (None: not judged)."""

    apns_push_type: str | None = "alert"
    apns_priority: int | None = 10
    fcm_priority: str | None = "high"
    min_ttl_s: float | None = 1.0
    text_required: bool = True
    text_template: str | None = None

    @classmethod
    def from_policy(cls, policy: SystemPolicy) -> Rules:
        return cls(
            policy.apns_push_type,
            policy.apns_priority,
            None if policy.fcm_priority is None else policy.fcm_priority.lower(),
            policy.push_min_ttl_s,
            policy.push_text_required,
            policy.push_text,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "apns_push_type": self.apns_push_type,
            "apns_priority": self.apns_priority,
            "fcm_priority": self.fcm_priority,
            "push_min_ttl_s": self.min_ttl_s,
            "push_text_required": self.text_required,
            "push_text": self.text_template,
        }


# The texts each (tenant, notification) may carry: $template rendered over each of its events
# ({events}: a relation with EVENT_COLUMNS), a replace per field in PUSH_TEXT_FIELDS' order
# (harness.model.system.render_push_text is the same rule).
_RENDERED = "$template"
for _field in PUSH_TEXT_FIELDS:
    _RENDERED = f"replace({_RENDERED}, '{{{_field}}}', coalesce(CAST({_field} AS VARCHAR), ''))"
_TEXTS = f"""
texts AS (
    SELECT tenant_id, notification_id, list(DISTINCT {_RENDERED} ORDER BY {_RENDERED}) AS texts
    FROM {{events}}
    WHERE $template IS NOT NULL
    GROUP BY tenant_id, notification_id)"""

# The rule, over a relation of judged rows (COLUMNS). Parameters: $push_type, $apns_priority,
# $fcm_priority, $min_ttl (NULL: not judged), $text_required, $template (NULL: not judged),
# $offset (the system's clock offset, seconds).
_FEATURES = (
    "WITH "
    + _TEXTS
    + r""",
f AS (
    SELECT *,
        CASE WHEN provider = 'apns' THEN coalesce(priority, '10')
             WHEN priority IS NULL THEN CASE WHEN text IS NULL THEN 'normal' ELSE 'high' END
             WHEN priority = '10' THEN 'high'
             WHEN priority IN ('5', '1') THEN 'normal'
             ELSE lower(priority) END AS effective_priority,
        CASE WHEN expiration IS NULL THEN NULL
             WHEN provider = 'fcm' AND regexp_full_match(expiration, '[0-9]+(\.[0-9]{1,9})?s')
                 THEN CAST(rtrim(expiration, 's') AS DOUBLE)
             WHEN regexp_full_match(expiration, '[0-9]{1,15}')
                 THEN CASE WHEN CAST(expiration AS DOUBLE) = 0 THEN 0.0
                           ELSE CAST(expiration AS DOUBLE) - (time + $offset) END
             ELSE '-inf'::DOUBLE END AS lifetime_s,
        t.texts[1] AS expected_text,
        t.texts AS texts
    FROM {source} s
    LEFT JOIN texts t USING (tenant_id, notification_id)
    WHERE provider IN ('apns', 'fcm'))
SELECT *,
    provider = 'apns' AND $push_type IS NOT NULL
        AND push_type IS DISTINCT FROM $push_type AS wrong_push_type,
    (provider = 'apns' AND $apns_priority IS NOT NULL
        AND effective_priority IS DISTINCT FROM $apns_priority)
    OR (provider = 'fcm' AND $fcm_priority IS NOT NULL
        AND effective_priority IS DISTINCT FROM $fcm_priority) AS wrong_priority,
    coalesce($min_ttl IS NOT NULL AND lifetime_s < $min_ttl, false) AS not_stored,
    $text_required AND regexp_full_match(coalesce(text, ''), '\s*') AS empty_text,
    coalesce(NOT list_contains(texts, coalesce(text, '')), false) AS wrong_text
FROM f
"""
)


def _parameters(rules: Rules, clock_offset_s: float) -> dict[str, Any]:
    return {
        "push_type": rules.apns_push_type,
        "apns_priority": None if rules.apns_priority is None else str(rules.apns_priority),
        "fcm_priority": rules.fcm_priority,
        "min_ttl": rules.min_ttl_s,
        "text_required": rules.text_required,
        "template": rules.text_template,
        "offset": float(clock_offset_s),
    }


def _example(kind: str, row: Mapping[str, Any]) -> dict[str, Any]:
    sent, judged = SHOWN[kind]
    value = row[judged]
    if isinstance(value, float):
        value = None if np.isnan(value) else round(value, 3)
    return {
        "violation": kind,
        "provider": row["provider"],
        **{k: row[k] for k in KEY},
        "value": row[sent],
        "judged_as": value,
    }


def _judge(
    con: duckdb.DuckDBPyConnection,
    source: str,
    events: str,
    rules: Rules,
    clock_offset_s: float,
    expected: int,
) -> Verdict:
    """The verdict over the judged rows in ``source`` (a relation with ``COLUMNS``)."""
    params = _parameters(rules, clock_offset_s)
    query = _FEATURES.replace("{source}", source).replace("{events}", events)
    con.execute(f"CREATE OR REPLACE TEMP TABLE push_attribute_rows AS {query}", params)
    filters = ", ".join(f"count(*) FILTER ({kind})" for kind in KINDS)
    found = con.execute(
        f"""SELECT count(*), count(*) FILTER (provider = 'apns'),
                   count(*) FILTER (provider = 'fcm'), {filters}
            FROM push_attribute_rows"""
    ).fetchone()
    assert found is not None
    judged, apns, fcm, *violations = (int(v) for v in found)
    counts = {
        "expected": int(expected),
        "judged": judged,
        "judged_apns": apns,
        "judged_fcm": fcm,
        **dict(zip(KINDS, violations, strict=True)),
    }
    examples: list[dict[str, Any]] = []
    for kind, n in zip(KINDS, violations, strict=True):
        if n:
            first = con.execute(
                f"SELECT * FROM push_attribute_rows WHERE {kind} ORDER BY pos LIMIT {EXAMPLES}"
            ).df()
            records = first.astype(object).where(first.notna(), None).to_dict("records")
            examples += [_example(kind, row) for row in records]
    con.execute("DROP TABLE push_attribute_rows")
    details: dict[str, Any] = {"expected_attributes": rules.to_dict(), "examples": examples}
    if expected == 0:
        return Verdict(NAME, None, counts, {**details, "unknown": "the oracle expected no push"})
    if judged == 0:
        why = "no required push was delivered: no push attribute to judge"
        return Verdict(NAME, None, counts, {**details, "unknown": why})
    return Verdict(NAME, not any(violations), counts, details)


def check(
    expectation: Expectation,
    history: pd.DataFrame,
    policy: SystemPolicy | None = None,
    clock_offset_s: float = 0.0,
) -> Verdict:
    """The verdict over a history in memory: its deliveries of required pushes."""
    rules = Rules.from_policy(policy or SystemPolicy())
    expected = expectation.deliveries
    rows = delivery_rows(history)
    expected_keys, history_keys = joint_keys([expected, history], KEY)
    judged = rows[member(history_keys[rows], sorted_unique(expected_keys))]
    found = history.iloc[judged]
    arrays = {"pos": pa.array(judged, pa.int64())}
    for column in COLUMNS[1:]:
        kind = pa.float64() if column == "time" else pa.string()
        if column not in found:
            arrays[column] = pa.nulls(len(found), kind)
        elif column == "time":
            times = found[column].to_numpy(dtype=float, na_value=np.nan)
            arrays[column] = pa.array(times, kind, from_pandas=True)
        else:
            values = found[column].astype(object)
            arrays[column] = pa.array(values.where(values.notna(), None).tolist(), kind)
    table = pa.table(arrays)
    with duckdb.connect() as con:
        con.register("judged_rows", table)
        con.register("judged_events", _events(history))
        return _judge(con, "judged_rows", "judged_events", rules, clock_offset_s, len(expected))


def _events(history: pd.DataFrame) -> pa.Table:
    """The history's accepted events (its ``inject`` rows) as EVENT_COLUMNS; ``kind`` is the
    row's ``detail``."""
    injected = history[history["kind"] == "inject"] if "kind" in history else history.iloc[:0]
    arrays = {}
    for column in EVENT_COLUMNS:
        source = "detail" if column == "kind" else column
        if source in injected:
            values = injected[source].astype(object)
            arrays[column] = pa.array(values.where(values.notna(), None).tolist(), pa.string())
        else:
            arrays[column] = pa.nulls(len(injected), pa.string())
    return pa.table(arrays)


def check_store(
    store: HistoryStore, policy: SystemPolicy | None = None, clock_offset_s: float = 0.0
) -> Verdict:
    """:func:`check` over a history on disk: the judged rows picked from the provider table (a
    delivery of an expected key), their attributes read from the file."""
    store.require_decided()
    rules = Rules.from_policy(policy or SystemPolicy())
    ekeys = store.expected_keys()
    store.run(
        f"""CREATE OR REPLACE TABLE push_attribute_judged AS
        SELECT pos FROM prov
        WHERE got AND provider IN ('apns', 'fcm') AND key IN (SELECT key FROM {ekeys})"""
    )
    path = "'" + str(store.history_path).replace("'", "''") + "'"
    history = f"read_parquet({path}, file_row_number=true)"
    present = {row[0] for row in store.sql(f"DESCRIBE SELECT * FROM {history}").fetchall()}
    select = ", ".join(
        f'h."{c}"' if c in present else f'NULL::VARCHAR AS "{c}"'
        for c in [*KEY, "provider", *ATTRIBUTES]
    )
    source = f"""(SELECT j.pos, {select}, nullif(h.time, 'NaN'::DOUBLE) AS time
        FROM {history} h JOIN push_attribute_judged j ON j.pos = h.file_row_number)"""
    events_select = ", ".join(
        f'h."{"detail" if c == "kind" else c}" AS "{c}"'
        if ("detail" if c == "kind" else c) in present
        else f'NULL::VARCHAR AS "{c}"'
        for c in EVENT_COLUMNS
    )
    events = f"(SELECT {events_select} FROM {history} h WHERE h.kind = 'inject')"
    (expected,) = store.one("SELECT count(*) FROM exp")
    verdict = _judge(store.con, source, events, rules, clock_offset_s, int(expected))
    store.run("DROP TABLE push_attribute_judged")
    return verdict


@checker(
    NAME,
    summary="every required push asks its provider for an alert, sent now, kept for an "
    "offline device, with text (the policy's push attributes)",
    out_of_core=True,
)
def probe(evidence: Evidence, tolerance: Mapping[str, Any]) -> Verdict:
    if evidence.store is not None:
        return check_store(evidence.store, evidence.policy, evidence.clock_offset_s)
    return check(evidence.expectation, evidence.history, evidence.policy, evidence.clock_offset_s)
