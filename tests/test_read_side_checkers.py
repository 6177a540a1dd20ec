"""The read-side checkers over hand-made histories: each must pass what a correct system shows
and fail each kind of violation it names, with counts."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from engines import engine  # noqa: F401 - the fixture, pandas and DuckDB
from ulid import ULID

from harness.checkers import author_order, fcm_stickiness, inbox, unread
from harness.checkers.evidence import evidence_from
from harness.model.fcm_mapping import project_function
from harness.model.history import History
from harness.model.population import PopulationSpec, generate

START = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
T0 = START.timestamp()
SPEC = PopulationSpec(tenants=2, users_per_tenant=30, celebrity_followers=20, regular_authors=2)


def _population():
    return generate(3, START, SPEC)


def _reader(population, tenant="tenant-0"):
    """A follower of both the celebrity and the first regular author of ``tenant``."""
    celebrity = next(a for a in population.authors if a.tenant_id == tenant and a.celebrity)
    regular = next(a for a in population.authors if a.tenant_id == tenant and not a.celebrity)
    both = sorted(set(celebrity.followers) & set(regular.followers))
    return celebrity, regular, both[0]


def _ulid_at(instant: float) -> str:
    return str(ULID.from_timestamp(instant))


def _post(history, author, at, end=None):
    nid = _ulid_at(at)
    history.append("inject", time=at, end=end if end is not None else at + 0.01,
                   tenant_id=author.tenant_id, author_id=author.user_id, notification_id=nid,
                   detail="post")  # fmt: skip
    return nid


def _page(history, tenant, user, walk, page, ids, authors, at, cursor=None, next_cursor=None):
    detail = {"walk": walk, "page": page, "limit": 3, "cursor": cursor,
              "next_cursor": next_cursor, "ids": ids, "authors": authors,
              "read": [False] * len(ids)}  # fmt: skip
    history.append("read", time=at, end=at + 0.01, tenant_id=tenant, user_id=user, status=200,
                   reason="page", detail=json.dumps(detail))  # fmt: skip


def _walk(history, tenant, user, posts, at, limit=3, walk="w1"):
    """A correct walk: newest first, ``limit`` a page, every page's cursor its last id."""
    ordered = sorted(posts, key=lambda p: p[0], reverse=True)
    cursor = None
    for n, start in enumerate(range(0, len(ordered), limit)):
        chunk = ordered[start : start + limit]
        nxt = chunk[-1][0] if start + limit < len(ordered) else None
        _page(history, tenant, user, walk, n, [c[0] for c in chunk], [c[1] for c in chunk],
              at + n * 0.1, cursor, nxt)  # fmt: skip
        cursor = nxt


def _scene():
    population = _population()
    celebrity, regular, reader = _reader(population)
    history = History()
    posts = []
    for i in range(4):
        posts.append((_post(history, regular, T0 + i, T0 + i + 0.01), regular.user_id))
        posts.append((_post(history, celebrity, T0 + i + 0.5, T0 + i + 0.51), celebrity.user_id))
    return population, history, posts, reader


def test_a_correct_walk_over_several_pages_passes():
    population, history, posts, reader = _scene()
    _walk(history, "tenant-0", reader, posts, T0 + 60)
    verdict = inbox.check(evidence_from(population, history.frame()), lag_s=10, min_pages=1)
    assert verdict.valid, verdict.details
    assert verdict.counts["pages"] == 3 and verdict.counts["items_seen"] == 8
    assert author_order.check(evidence_from(population, history.frame())).valid


def test_a_skipped_item_at_a_page_boundary_is_a_gap():
    population, history, posts, reader = _scene()
    ordered = sorted(posts, reverse=True)
    _page(history, "tenant-0", reader, "w", 0, [p[0] for p in ordered[:3]],
          [p[1] for p in ordered[:3]], T0 + 60, None, ordered[3][0])  # fmt: skip
    # The next page starts one item too far: ordered[3] never shows.
    _page(history, "tenant-0", reader, "w", 1, [p[0] for p in ordered[4:7]],
          [p[1] for p in ordered[4:7]], T0 + 60.1, ordered[3][0], None)  # fmt: skip
    verdict = inbox.check(evidence_from(population, history.frame()))
    assert not verdict.valid
    assert verdict.counts["gap_at_boundary"] == 1 and verdict.counts["missing"] == 1
    assert verdict.details["examples"]["gap_at_boundary"][0]["id"] == ordered[3][0]


def test_repeats_order_and_foreign_items_are_named():
    population, history, posts, reader = _scene()
    other = next(a for a in population.authors if a.tenant_id == "tenant-1" and a.celebrity)
    foreign = _post(history, other, T0 + 2)
    ordered = sorted(posts, reverse=True)
    ids = [ordered[1][0], ordered[0][0], ordered[0][0], foreign]
    _page(history, "tenant-0", reader, "w", 0, ids, [None] * 4, T0 + 60)
    verdict = inbox.check(evidence_from(population, history.frame()))
    assert not verdict.valid
    assert verdict.counts["out_of_order"] >= 1 and verdict.counts["repeated"] == 1
    assert verdict.counts["foreign"] == 1


def test_a_post_within_the_lag_may_be_missing_and_an_unknown_one_is_never_required():
    population, history, posts, reader = _scene()
    regular = next(a for a in population.authors if a.tenant_id == "tenant-0" and not a.celebrity)
    _post(history, regular, T0 + 59.5)  # accepted half a second before the walk
    history.append("inject_info", time=T0 + 10, tenant_id="tenant-0", author_id=regular.user_id,
                   notification_id=_ulid_at(T0 + 10), detail="post")  # fmt: skip
    _walk(history, "tenant-0", reader, posts, T0 + 60, limit=20)
    verdict = inbox.check(evidence_from(population, history.frame()), lag_s=2)
    assert verdict.valid, verdict.details
    late = inbox.check(evidence_from(population, history.frame()), lag_s=0.1)
    assert not late.valid and late.counts["missing"] == 1


def test_too_few_multi_page_walks_is_not_a_pass():
    population, history, posts, reader = _scene()
    _walk(history, "tenant-0", reader, posts, T0 + 60, limit=20)
    verdict = inbox.check(evidence_from(population, history.frame()), min_pages=1)
    assert not verdict.valid and verdict.counts["too_few_multi_page_walks"] == 1


def test_a_later_post_seen_without_an_earlier_one_breaks_author_order():
    population, history, posts, reader = _scene()
    _, regular, _ = _reader(population)
    mine = sorted(p[0] for p in posts if p[1] == regular.user_id)
    # The author's newest post is seen, the one before it is not. The walk comes soon after
    # (inside the lag, so the inbox checker forgives the absence; the order checker does not).
    seen = [p for p in posts if p[0] != mine[-2]]
    _walk(history, "tenant-0", reader, seen, T0 + 4.6, limit=20)
    evidence = evidence_from(population, history.frame())
    assert inbox.check(evidence, lag_s=10).valid
    verdict = author_order.check(evidence)
    assert not verdict.valid and verdict.counts["later_seen_earlier_missing"] == 1
    assert verdict.details["examples"][0]["missing_earlier"] == mine[-2]


def _unread(history, tenant, user, at, count):
    history.append("read", time=at, end=at + 0.01, tenant_id=tenant, user_id=user, status=200,
                   reason="unread", detail=json.dumps({"unread": count, "capped": False}))  # fmt: skip


def _op(history, op, tenant, user, at, nid=None):
    history.append("read", time=at, end=at + 0.01, tenant_id=tenant, user_id=user, status=200,
                   reason=op, notification_id=nid, detail="{}")  # fmt: skip


def test_unread_after_read_all_counts_only_newer_less_items_read():
    population, history, posts, reader = _scene()  # 8 posts between T0 and T0+4
    _op(history, "read_all", "tenant-0", reader, T0 + 2.2)  # 4 posts after it
    newer = sorted(p[0] for p in posts if ULID.from_str(p[0]).timestamp > T0 + 2.3)
    _op(history, "mark_read", "tenant-0", reader, T0 + 30, newer[0])
    _unread(history, "tenant-0", reader, T0 + 40, len(newer) - 1)
    evidence = evidence_from(population, history.frame())
    assert unread.check(evidence).valid
    _unread(history, "tenant-0", reader, T0 + 41, len(newer))  # forgot the item read
    _unread(history, "tenant-0", reader, T0 + 42, len(posts))  # forgot the read-all
    _unread(history, "tenant-0", reader, T0 + 43, 0)  # forgot the new posts
    verdict = unread.check(evidence_from(population, history.frame()))
    assert not verdict.valid
    assert verdict.counts["overcount"] == 2 and verdict.counts["undercount"] == 1


def _flagged_page(history, tenant, user, walk, ids, read, at):
    detail = {"walk": walk, "page": 0, "limit": 20, "cursor": None, "next_cursor": None,
              "ids": ids, "authors": [None] * len(ids), "read": read}  # fmt: skip
    history.append("read", time=at, end=at + 0.01, tenant_id=tenant, user_id=user, status=200,
                   reason="page", detail=json.dumps(detail))  # fmt: skip


def test_page_read_flags_follow_the_read_all_and_the_items_read():
    population, history, posts, reader = _scene()  # 8 posts between T0 and T0+4
    _op(history, "read_all", "tenant-0", reader, T0 + 2.2)  # the 5 older ones are read
    ids = sorted((p[0] for p in posts), reverse=True)
    newer = [i for i in ids if ULID.from_str(i).timestamp > T0 + 2.3]
    _op(history, "mark_read", "tenant-0", reader, T0 + 30, newer[0])
    right = [i not in newer or i == newer[0] for i in ids]
    _flagged_page(history, "tenant-0", reader, "right", ids, right, T0 + 60)
    verdict = unread.check(evidence_from(population, history.frame()))
    assert verdict.valid, verdict.details
    assert verdict.counts["page_items_judged"] == 8
    # A page that forgets the read-all and the item read (all unread), and one that shows
    # everything read (the newer posts nothing covered included).
    _flagged_page(history, "tenant-0", reader, "unread", ids, [False] * 8, T0 + 61)
    _flagged_page(history, "tenant-0", reader, "read", ids, [True] * 8, T0 + 62)
    verdict = unread.check(evidence_from(population, history.frame()))
    assert not verdict.valid
    assert verdict.counts["read_shown_unread"] == (8 - len(newer)) + 1
    assert verdict.counts["unread_shown_read"] == len(newer) - 1
    # A read-all still in flight when the page was answered may or may not cover the rest.
    _op(history, "read_all", "tenant-0", reader, T0 + 62.005)
    verdict = unread.check(evidence_from(population, history.frame()))
    assert verdict.counts["unread_shown_read"] == 0


def _fcm(history, tenant, token, project, at=T0):
    history.extend_provider([{"received_at": at, "tenant_id": tenant, "notification_id": "n",
                              "token": token, "provider": "fcm", "project": project,
                              "status": 200, "reason": None}])  # fmt: skip


@pytest.mark.usefixtures("engine")
def test_fcm_sends_stick_to_the_project_user_mod_k_names():
    population = _population()
    device = next(d for d in population.devices if d.platform == "fcm")
    number = int(device.user_id[1:])
    projects = ("p0", "p1", "p2")
    mod_k = project_function("digits-mod", projects)
    history = History()
    _fcm(history, device.tenant_id, device.token, projects[number % 3])
    _fcm(history, device.tenant_id, device.token, projects[number % 3])
    assert fcm_stickiness.check(population, history.frame(), projects, mod_k).valid
    _fcm(history, device.tenant_id, device.token, projects[(number + 1) % 3])
    verdict = fcm_stickiness.check(population, history.frame(), projects, mod_k)
    assert not verdict.valid
    assert verdict.counts["users_on_several_projects"] == 1 and verdict.counts["wrong_project"] == 1


@pytest.mark.usefixtures("engine")
def test_fcm_stickiness_judges_the_stated_mapping_not_user_mod_k():
    """A team's sticky crc32 mapping passes when each user stays on the project it names,
    though user mod K would name another; no mapping stated judges stickiness only."""
    population = _population()
    devices = [d for d in population.devices if d.platform == "fcm"][:6]
    projects = ("p0", "p1")
    crc = project_function("projects[crc32(user_id) % len(projects)]", projects)
    mod_k = project_function("digits-mod", projects)
    history = History()
    for d in devices:
        _fcm(history, d.tenant_id, d.token, crc(d.tenant_id, d.user_id))
    assert any(crc(d.tenant_id, d.user_id) != mod_k(d.tenant_id, d.user_id) for d in devices)
    assert fcm_stickiness.check(population, history.frame(), projects, crc).valid
    assert not fcm_stickiness.check(population, history.frame(), projects, mod_k).valid
    unstated = fcm_stickiness.check(population, history.frame(), projects)
    assert unstated.valid and unstated.details["mapping"].startswith("no fcm_mapping stated")
    d = devices[0]
    _fcm(history, d.tenant_id, d.token, "p1" if crc(d.tenant_id, d.user_id) == "p0" else "p0")
    verdict = fcm_stickiness.check(population, history.frame(), projects)
    assert not verdict.valid and verdict.counts["users_on_several_projects"] == 1


@pytest.mark.usefixtures("engine")
def test_fcm_stickiness_with_no_fcm_request_is_unknown_not_pass():
    verdict = fcm_stickiness.check(_population(), History().frame(), ("p0",))
    assert verdict.valid is None and "no FCM request" in verdict.details["unknown"]
