from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ulid import ULID

from reference_impl.dedup_key import DEDUP_TTL_SECONDS, dedup_key

ULID_ID = "01HZX3V8Q2M4N6P8R0T2V4X6Z8"
RECIPIENT = "user_42#device_7"
KEY_RE = re.compile(r"dedup:[0-9a-f]{64}")


def test_known_vector() -> None:
    assert dedup_key("tenant_a", ULID_ID, RECIPIENT) == (
        "dedup:31ef66fcd1a70c3b6b243c893d9f09c73fe7f37afc59113c905877411ae0eabb"
    )


def test_matches_documented_formula() -> None:
    expected = hashlib.sha256(f"tenant_b:{ULID_ID}:{RECIPIENT}".encode()).hexdigest()
    assert dedup_key("tenant_b", ULID_ID, RECIPIENT) == "dedup:" + expected


def test_ttl_is_30_days() -> None:
    assert DEDUP_TTL_SECONDS == 2_592_000 == 30 * 24 * 3600


def test_stable_across_calls() -> None:
    first = dedup_key("tenant_a", ULID_ID, RECIPIENT)
    assert [dedup_key("tenant_a", ULID_ID, RECIPIENT) for _ in range(3)] == [first] * 3


def test_tenant_separation() -> None:
    a = dedup_key("tenant_a", ULID_ID, RECIPIENT)
    b = dedup_key("tenant_b", ULID_ID, RECIPIENT)
    assert a != b
    assert KEY_RE.fullmatch(a) and KEY_RE.fullmatch(b)


def test_each_part_matters() -> None:
    keys = {
        dedup_key("t", ULID_ID, RECIPIENT),
        dedup_key("t", "01HZX3V8Q2M4N6P8R0T2V4X6Z9", RECIPIENT),
        dedup_key("t", ULID_ID, "user_42#device_8"),
        dedup_key("t", ULID_ID, "user_43#device_7"),
    }
    assert len(keys) == 4


def test_recipient_may_contain_colon() -> None:
    key = dedup_key("t", ULID_ID, "user:42#device:7")
    assert key == "dedup:" + hashlib.sha256(f"t:{ULID_ID}:user:42#device:7".encode()).hexdigest()


@pytest.mark.parametrize(
    ("tenant_id", "notification_id", "recipient", "field"),
    [
        ("", ULID_ID, RECIPIENT, "tenant_id"),
        ("   ", ULID_ID, RECIPIENT, "tenant_id"),
        ("t", "", RECIPIENT, "notification_id"),
        ("t", ULID_ID, "", "recipient"),
        ("t", ULID_ID, " \t", "recipient"),
        ("a:b", "c", RECIPIENT, "tenant_id"),
        ("a", "b:c", RECIPIENT, "notification_id"),
        (None, ULID_ID, RECIPIENT, "tenant_id"),
        ("t", 123, RECIPIENT, "notification_id"),
        ("t", ULID_ID, b"user#dev", "recipient"),
    ],
)
def test_rejects_bad_parts(
    tenant_id: object, notification_id: object, recipient: object, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        dedup_key(tenant_id, notification_id, recipient)  # type: ignore[arg-type]


part = st.text(
    st.characters(blacklist_characters=":", blacklist_categories=("Cs",)), min_size=1
).filter(str.strip)


@given(
    tenant=part,
    recipient=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1).filter(str.strip),
)
def test_property_format_and_formula(tenant: str, recipient: str) -> None:
    notification_id = str(ULID())
    key = dedup_key(tenant, notification_id, recipient)
    assert KEY_RE.fullmatch(key)
    assert key == dedup_key(tenant, notification_id, recipient)
    digest = hashlib.sha256(f"{tenant}:{notification_id}:{recipient}".encode()).hexdigest()
    assert key == "dedup:" + digest


@given(t1=part, n1=part, r1=part, t2=part, n2=part, r2=part)
def test_property_distinct_triples_distinct_keys(
    t1: str, n1: str, r1: str, t2: str, n2: str, r2: str
) -> None:
    if (t1, n1, r1) != (t2, n2, r2):
        assert dedup_key(t1, n1, r1) != dedup_key(t2, n2, r2)
    else:
        assert dedup_key(t1, n1, r1) == dedup_key(t2, n2, r2)


def test_lone_surrogates_are_refused_not_crashed_on():
    with pytest.raises(ValueError, match="recipient is not valid Unicode"):
        dedup_key("t", "01JD5V3KX9B9Q0ZC4S6Y2M8N7P", "user#\ud800")
