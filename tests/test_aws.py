"""The DynamoDB batch helpers against dynalite: any number of requests, split at the API's
per-call limits."""

from __future__ import annotations

import pytest

from reference_impl.aws import BATCH_GET_MAX, BATCH_WRITE_MAX, batch_get, batch_write

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
