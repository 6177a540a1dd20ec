"""The inbox read side: pure merge logic, then the API on the real stack."""

from __future__ import annotations

import httpx
import pytest
from helpers import TenantClient
from hypothesis import given
from hypothesis import strategies as st
from ulid import ULID

from harness.stack.supervisor import wait_until
from reference_impl.inbox import BadCursor, InboxItem, is_unread, merge_newest_first, parse_cursor


def _item(nid: str, source: str = "inbox") -> InboxItem:
    return InboxItem(nid, "a", "post", "o", source)


def test_merge_is_newest_first_across_sources_and_stops_at_the_limit():
    own = [_item("05"), _item("03"), _item("01")]
    celebrity = [_item("06", "celebrity"), _item("02", "celebrity")]
    merged = merge_newest_first([own, celebrity], 4)
    assert [i.notification_id for i in merged] == ["06", "05", "03", "02"]


def test_merge_drops_a_notification_seen_in_two_sources():
    merged = merge_newest_first([[_item("02"), _item("01")], [_item("02", "celebrity")]], 10)
    assert [i.notification_id for i in merged] == ["02", "01"]


@given(st.lists(st.lists(st.integers(0, 10_000), unique=True), max_size=5), st.integers(1, 30))
def test_paging_by_cursor_visits_every_item_once_in_order(sources, limit):
    """What the API does: each page is 'older than the last id of the previous page'."""
    lists = [[_item(f"{n:05d}") for n in sorted(s, reverse=True)] for s in sources]
    everything = sorted({f"{n:05d}" for s in sources for n in s}, reverse=True)
    seen: list[str] = []
    cursor = None
    for _ in range(len(everything) + 2):
        older = [[i for i in lst if cursor is None or i.notification_id < cursor] for lst in lists]
        page = merge_newest_first(older, limit)
        seen += [i.notification_id for i in page]
        if len(page) < limit:
            break
        cursor = page[-1].notification_id
    assert seen == everything


def test_unread_is_above_the_watermark_and_not_read_one_by_one():
    assert is_unread("05", None, set())
    assert not is_unread("05", "07", set())
    assert is_unread("08", "07", set())
    assert not is_unread("08", "07", {"08"})


def test_cursor_must_be_a_ulid():
    nid = str(ULID())
    assert parse_cursor(nid) == nid
    assert parse_cursor(None) is None
    with pytest.raises(BadCursor):
        parse_cursor("../../etc")


@pytest.mark.integration
def test_inbox_merges_celebrity_posts_pages_by_cursor_and_tracks_unread(stack):
    t = TenantClient(stack)
    fans = [f"fan{n}" for n in range(55)]  # above the stack's threshold of 50
    t.follow("celebrity", fans)
    t.follow("friend", ["fan0"])
    ids = []
    for author in ("friend", "celebrity", "friend", "celebrity", "friend"):
        ids.append(t.post(author))
    api = t.api
    base = f"/v1/tenants/{t.tenant}/users/fan0"

    def inbox(**params):
        response = api.get(f"{base}/inbox", params=params)
        assert response.status_code == 200, response.text
        return response.json()

    # The friend's rows are written by the fan-out worker, asynchronously.
    wait_until(lambda: len(inbox(limit=10)["items"]) == 5, 30, "five notifications in the inbox")
    first = inbox(limit=3)
    assert [i["notification_id"] for i in first["items"]] == ids[::-1][:3]
    assert {i["source"] for i in inbox(limit=10)["items"]} == {"inbox", "celebrity"}
    second = inbox(limit=3, cursor=first["next_cursor"])
    assert [i["notification_id"] for i in second["items"]] == ids[::-1][3:]
    assert second["next_cursor"] is None

    assert api.get(f"{base}/unread-count").json() == {"unread": 5, "capped": False}
    assert api.post(f"{base}/inbox/{ids[0]}/read").status_code == 200
    assert api.get(f"{base}/unread-count").json()["unread"] == 4
    assert api.post(f"{base}/inbox/read-all").status_code == 200
    assert api.get(f"{base}/unread-count").json()["unread"] == 0
    assert all(i["read"] for i in inbox(limit=10)["items"])
    newest = t.post("celebrity")
    wait_until(lambda: api.get(f"{base}/unread-count").json()["unread"] == 1, 30, "one unread")
    assert inbox(limit=1)["items"][0] == {
        "notification_id": newest,
        "author_id": "celebrity",
        "kind": "post",
        "object_id": "o1",
        "source": "celebrity",
        "read": False,
    }
    # Another tenant's user with the same id sees none of it.
    other = httpx.get(f"{stack.info.url('event-api')}/v1/tenants/other-{t.tenant}/users/fan0/inbox")
    assert other.json()["items"] == []


@pytest.mark.integration
def test_inbox_refuses_bad_paging_input(stack):
    api = httpx.Client(base_url=stack.info.url("event-api"))
    assert api.get("/v1/tenants/t/users/u/inbox", params={"limit": 0}).status_code == 400
    assert api.get("/v1/tenants/t/users/u/inbox", params={"limit": "x"}).status_code == 400
    response = api.get("/v1/tenants/t/users/u/inbox", params={"cursor": "nope"})
    assert response.status_code == 400 and "cursor" in response.json()["error"]
    assert api.post("/v1/tenants/t/users/u/inbox/nope/read").status_code == 400
