"""The DynamoDB batch helpers against dynalite: any number of requests, split at the API's
per-call limits."""

from __future__ import annotations

import pytest

from reference_impl.aws import (
    BATCH_GET_MAX,
    BATCH_WRITE_MAX,
    batch_get,
    batch_get_tables,
    batch_write,
)

pytestmark = pytest.mark.integration


def test_batch_helpers_take_more_than_one_call_holds(stack):
    ddb = stack.info.aws_client("dynamodb")
    table = stack.reference_config().table("accounts")
    n = 2 * BATCH_WRITE_MAX + 3
    batch_write(
        ddb, table, [{"PutRequest": {"Item": {"pk": {"S": f"aws-b{i}"}}}} for i in range(n)]
    )
    wanted = [{"pk": {"S": f"aws-b{i}"}} for i in range(BATCH_GET_MAX + 20)]  # some absent
    found = batch_get(ddb, table, wanted)
    assert sorted(item["pk"]["S"] for item in found) == sorted(f"aws-b{i}" for i in range(n))
    batch_write(ddb, table, [{"DeleteRequest": {"Key": key}} for key in wanted[:n]])
    assert batch_get(ddb, table, wanted) == []
    batch_write(ddb, table, [])  # nothing to write: no call
    assert batch_get(ddb, table, []) == []


def test_one_batch_get_reads_several_tables_and_splits_at_the_call_limit(stack):
    ddb = stack.info.aws_client("dynamodb")
    config = stack.reference_config()
    tables = [config.table("accounts"), config.table("audit_keys")]
    for t, table in enumerate(tables):
        batch_write(
            ddb,
            table,
            [{"PutRequest": {"Item": {"pk": {"S": f"aws-m{t}-{i}"}}}} for i in range(60)],
        )
    wanted = {
        table: [{"pk": {"S": f"aws-m{t}-{i}"}} for i in range(70)] for t, table in enumerate(tables)
    }
    calls = []
    original = ddb.batch_get_item
    ddb.batch_get_item = lambda **kw: calls.append(kw) or original(**kw)
    found = batch_get_tables(ddb, wanted)
    assert [sum(len(v["Keys"]) for v in c["RequestItems"].values()) for c in calls] == [
        BATCH_GET_MAX,
        140 - BATCH_GET_MAX,
    ]
    for t, table in enumerate(tables):
        assert sorted(i["pk"]["S"] for i in found[table]) == sorted(
            f"aws-m{t}-{i}" for i in range(60)
        )
        batch_write(ddb, table, [{"DeleteRequest": {"Key": k}} for k in wanted[table]])
