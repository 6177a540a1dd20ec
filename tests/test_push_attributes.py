"""push_attributes over hand-made histories: each violation it names is counted with its
examples, a correct history passes, only deliveries of required pushes are judged, the policy
states what is expected, and nothing judged is never a pass. Every test runs on both engines
(the history in memory, and on disk in DuckDB)."""

from __future__ import annotations

import pandas as pd
import pytest
from engines import on_store

from harness.checkers import push_attributes, registry
from harness.checkers.evidence import Evidence
from harness.model.history import History
from harness.model.oracle import EXPECTED_COLUMNS, OPTIONAL_COLUMNS, Expectation
from harness.model.population import Population, PopulationSpec
from harness.model.system import SystemPolicy

AT = 1_800_000_000.0  # when the pushes arrive (epoch seconds)
TEXT = "New activity\nu1 like"
# What the reference sends: an alert, every other header left to the providers' defaults.
APNS_OK = {"push_type": "alert", "text": TEXT}
FCM_OK = {"text": TEXT}


@pytest.fixture(params=("pandas", "duckdb"), autouse=True)
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "duckdb":
        check = on_store(push_attributes.check, push_attributes.check_store)
        monkeypatch.setattr(push_attributes, "check", check)
    return request.param


def _push(history, nid, token, provider="apns", status=200, delivered=None, **attributes):
    history.extend_provider(
        [
            {
                "received_at": AT,
                "tenant_id": "acme",
                "notification_id": nid,
                "token": token,
                "provider": provider,
                "status": status,
                "delivered": status == 200 if delivered is None else delivered,
                **attributes,
            }
        ]
    )


def _expect(*keys, optional=()):
    """(nid, token) per required delivery, tenant acme."""
    deliveries = pd.DataFrame(
        [("acme", nid, token, "u1", None) for nid, token in keys], columns=EXPECTED_COLUMNS
    )
    maybe = pd.DataFrame(
        [("acme", nid, token, "u1", "limited") for nid, token in optional], columns=OPTIONAL_COLUMNS
    )
    return Expectation(deliveries, optional=maybe)


def _check(expectation, history, **kwargs):
    return push_attributes.check(expectation, history.frame(), **kwargs)


def _violations(verdict):
    return {k: verdict.counts[k] for k in push_attributes.KINDS}


NONE = dict.fromkeys(push_attributes.KINDS, 0)


def test_what_the_reference_sends_passes_on_both_providers():
    history = History()
    _push(history, "n1", "a1", **APNS_OK)
    _push(history, "n1", "f1", "fcm", **FCM_OK)
    # stated outright, as a careful sender would: the same
    _push(history, "n2", "a1", push_type="alert", priority="10",
          expiration=str(int(AT) + 86_400), text="plain")  # fmt: skip
    _push(history, "n2", "f1", "fcm", priority="HIGH", expiration="86400s", text=TEXT)
    verdict = _check(_expect(("n1", "a1"), ("n1", "f1"), ("n2", "a1"), ("n2", "f1")), history)
    assert verdict.valid is True
    assert verdict.counts == {
        "expected": 4, "judged": 4, "judged_apns": 2, "judged_fcm": 2, **NONE,
    }  # fmt: skip
    assert verdict.details["examples"] == []
    assert verdict.details["expected_attributes"] == {
        "apns_push_type": "alert", "apns_priority": 10, "fcm_priority": "high",
        "push_min_ttl_s": 1.0, "push_text_required": True, "push_text": None,
    }  # fmt: skip


def test_a_background_push_type_at_priority_5_is_counted_with_its_examples():
    history = History()
    _push(history, "n1", "a1", **APNS_OK)
    _push(history, "n2", "a1", push_type="background", priority="5", text=TEXT)
    _push(history, "n3", "a1", priority="10", text=TEXT)  # no push type: Apple requires one
    verdict = _check(_expect(("n1", "a1"), ("n2", "a1"), ("n3", "a1")), history)
    assert verdict.valid is False
    assert _violations(verdict) == {**NONE, "wrong_push_type": 2, "wrong_priority": 1}
    assert verdict.details["examples"] == [
        {"violation": "wrong_push_type", "provider": "apns", "tenant_id": "acme",
         "notification_id": "n2", "token": "a1", "value": "background", "judged_as": "background"},
        {"violation": "wrong_push_type", "provider": "apns", "tenant_id": "acme",
         "notification_id": "n3", "token": "a1", "value": None, "judged_as": None},
        {"violation": "wrong_priority", "provider": "apns", "tenant_id": "acme",
         "notification_id": "n2", "token": "a1", "value": "5", "judged_as": "5"},
    ]  # fmt: skip


def test_an_expiration_of_zero_or_in_the_past_and_a_ttl_of_zero_are_not_stored():
    history = History()
    _push(history, "n1", "a1", expiration="0", **APNS_OK)  # deliver once, never stored
    _push(history, "n2", "a1", expiration="3600", **APNS_OK)  # a duration: 1970, expired
    _push(history, "n3", "a1", expiration=str(int(AT) + 60), **APNS_OK)  # a minute: kept
    _push(history, "n1", "f1", "fcm", expiration="0s", **FCM_OK)
    _push(history, "n2", "f1", "fcm", expiration="0.000000000s", **FCM_OK)
    _push(history, "n3", "f1", "fcm", expiration="2.5s", **FCM_OK)
    _push(history, "n4", "f1", "fcm", expiration="a week", **FCM_OK)  # Google would refuse it
    keys = [(n, "a1") for n in ("n1", "n2", "n3")] + [(n, "f1") for n in ("n1", "n2", "n3", "n4")]
    verdict = _check(_expect(*keys), history)
    assert verdict.valid is False
    assert _violations(verdict) == {**NONE, "not_stored": 5}
    shown = [(e["provider"], e["value"], e["judged_as"]) for e in verdict.details["examples"]]
    assert shown == [
        ("apns", "0", 0.0),
        ("apns", "3600", 3600.0 - AT),
        ("fcm", "0s", 0.0),
        ("fcm", "0.000000000s", 0.0),
        ("fcm", "a week", float("-inf")),
    ]


def test_fcm_priority_normal_or_a_data_message_without_one_is_not_high():
    history = History()
    _push(history, "n1", "f1", "fcm", priority="normal", **FCM_OK)
    _push(history, "n2", "f1", "fcm", priority="NORMAL", **FCM_OK)
    _push(history, "n3", "f1", "fcm")  # a data message: normal by default, and no text
    _push(history, "n4", "f1", "fcm", priority="5", **FCM_OK)  # the APNs priority FCM forwards
    _push(history, "n5", "f1", "fcm", priority="10", **FCM_OK)
    _push(history, "n6", "f1", "fcm", text="")  # a notification message, empty: high
    verdict = _check(_expect(*[(f"n{i}", "f1") for i in range(1, 7)]), history)
    assert _violations(verdict) == {**NONE, "wrong_priority": 4, "empty_text": 2}
    priorities = [
        (e["notification_id"], e["value"], e["judged_as"])
        for e in verdict.details["examples"]
        if e["violation"] == "wrong_priority"
    ]
    assert priorities == [
        ("n1", "normal", "normal"), ("n2", "NORMAL", "normal"), ("n3", None, "normal"),
        ("n4", "5", "normal"),
    ]  # fmt: skip


def test_an_alert_without_text_is_counted():
    history = History()
    _push(history, "n1", "a1", push_type="alert", text="")
    _push(history, "n2", "a1", push_type="alert", text=" \n ")
    _push(history, "n3", "a1", push_type="alert")  # no alert at all
    _push(history, "n4", "a1", push_type="alert", text="x")
    verdict = _check(_expect(*[(f"n{i}", "a1") for i in range(1, 5)]), history)
    assert _violations(verdict) == {**NONE, "empty_text": 3}
    assert [e["value"] for e in verdict.details["examples"]] == ["", " \n ", None]


def test_only_deliveries_of_required_pushes_are_judged():
    history = History()
    bad = {"push_type": "background", "priority": "5", "expiration": "0", "text": ""}
    _push(history, "n1", "a1", status=429, **bad)  # refused: the device got nothing
    _push(history, "n1", "a1", **APNS_OK)
    _push(history, "n2", "a1", status=503, delivered=True, **bad)  # accepted, then an error
    _push(history, "n3", "a1", **bad)  # optional (rate-limited): not judged
    _push(history, "n9", "a1", **bad)  # no part of the oracle: effectively_once's (unexpected)
    _push(history, "n1", "s1", provider="ses", **bad)  # another channel's ledger
    verdict = _check(_expect(("n1", "a1"), ("n2", "a1"), optional=[("n3", "a1")]), history)
    assert verdict.counts["judged"] == 2
    assert _violations(verdict) == {
        "wrong_push_type": 1, "wrong_priority": 1, "not_stored": 1, "empty_text": 1, "wrong_text": 0,
    }  # fmt: skip
    assert {e["notification_id"] for e in verdict.details["examples"]} == {"n2"}


def test_nothing_judged_is_unknown_never_a_pass():
    history = History()
    verdict = _check(_expect(), history)
    assert verdict.valid is None and verdict.details["unknown"] == "the oracle expected no push"
    _push(history, "n1", "a1", status=429, **APNS_OK)
    verdict = _check(_expect(("n1", "a1")), history)
    assert verdict.valid is None and "no required push was delivered" in verdict.details["unknown"]
    assert verdict.counts["expected"] == 1 and verdict.counts["judged"] == 0


def test_the_system_states_what_its_pushes_ask_for():
    """A team whose pushes are silent, deliver-once data messages says so; a key set to null
    is not judged; a longer lifetime is held to."""
    history = History()
    _push(history, "n1", "a1", push_type="background", priority="5", expiration="0")
    _push(history, "n1", "f1", "fcm", priority="normal", expiration="0s")
    keys = _expect(("n1", "a1"), ("n1", "f1"))
    assert _violations(_check(keys, history)) == {
        "wrong_push_type": 1, "wrong_priority": 2, "not_stored": 2, "empty_text": 2, "wrong_text": 0,
    }  # fmt: skip
    silent = SystemPolicy.from_mapping(
        {"apns_push_type": "background", "apns_priority": 5, "fcm_priority": "NORMAL",
         "push_min_ttl_s": 0, "push_text_required": False}
    )  # fmt: skip
    assert _check(keys, history, policy=silent).valid is True
    unjudged = SystemPolicy.from_mapping(
        {"apns_push_type": None, "apns_priority": None, "fcm_priority": None,
         "push_min_ttl_s": None, "push_text_required": False}
    )  # fmt: skip
    assert _check(keys, history, policy=unjudged).valid is True
    history = History()
    _push(history, "n1", "a1", expiration=str(int(AT) + 60), **APNS_OK)
    _push(history, "n1", "f1", "fcm", expiration="3600s", **FCM_OK)
    day = SystemPolicy.from_mapping({"push_min_ttl_s": 86_400})
    assert _violations(_check(keys, history, policy=day)) == {**NONE, "not_stored": 2}


def test_an_expiration_is_read_on_the_systems_clock():
    """A system whose clock a scenario moved an hour ahead writes its expirations an hour
    later: judged in its own time, a minute's expiration is a minute."""
    history = History()
    _push(history, "n1", "a1", expiration=str(int(AT) + 3600 + 60), **APNS_OK)
    keys = _expect(("n1", "a1"))
    policy = SystemPolicy.from_mapping({"push_min_ttl_s": 120})
    assert _check(keys, history, policy=policy).valid is True  # 3,660 s in real time
    moved = _check(keys, history, policy=policy, clock_offset_s=3600.0)
    assert moved.counts["not_stored"] == 1
    assert moved.details["examples"][0]["judged_as"] == 60.0


def test_the_probe_reads_the_systems_policy():
    population = Population(0, 0.0, PopulationSpec())
    history = History()
    _push(history, "n1", "a1", push_type="background", text=TEXT)
    evidence = Evidence(population, _expect(("n1", "a1")), history.frame())
    assert registry.run_probe("push_attributes", {}, evidence).counts["wrong_push_type"] == 1
    policy = SystemPolicy.from_mapping({"apns_push_type": "background"})
    evidence = Evidence(population, _expect(("n1", "a1")), history.frame(), policy)
    assert registry.run_probe("push_attributes", {}, evidence).valid is True


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("apns_priority", 7),
        ("apns_priority", True),
        ("fcm_priority", "urgent"),
        ("push_min_ttl_s", -1),
        ("push_min_ttl_s", "1h"),
        ("apns_push_type", ""),
        ("push_text_required", "yes"),
    ],
)
def test_a_policy_value_no_provider_has_is_refused(key, value):
    with pytest.raises(ValueError, match=key):
        SystemPolicy.from_mapping({key: value})
    assert SystemPolicy.from_mapping({}).to_dict()[key] is not None


# -- the text the event asked for ----------------------------------------------------------

TEMPLATE = SystemPolicy.from_mapping({"push_text": "New activity\n{author_id} {kind}"})


def _post(history, nid, author, kind="post", tenant="acme", object_id="o1"):
    history.append("inject", time=AT - 5, end=AT - 4.9, tenant_id=tenant, notification_id=nid,
                   author_id=author, detail=kind, object_id=object_id)  # fmt: skip


def test_a_push_carrying_another_notifications_text_is_wrong_text():
    """Judged against the template rendered over the harness's own record of each event: the
    right text passes, another notification's (or one made of the wrong field) is counted with
    what was expected, whichever provider carried it."""
    history = History()
    _post(history, "n1", "u1", "like")
    _post(history, "n2", "u2", "post")
    _push(history, "n1", "a1", push_type="alert", text="New activity\nu1 like")
    _push(history, "n2", "a1", push_type="alert", text="New activity\nu1 like")  # n1's text
    _push(history, "n2", "f1", "fcm", text="New activity\nr9 post")  # the recipient's name
    keys = _expect(("n1", "a1"), ("n2", "a1"), ("n2", "f1"))
    verdict = _check(keys, history, policy=TEMPLATE)
    assert verdict.valid is False
    assert _violations(verdict) == {**NONE, "wrong_text": 2}
    assert [(e["notification_id"], e["token"], e["value"], e["judged_as"])
            for e in verdict.details["examples"]] == [
        ("n2", "a1", "New activity\nu1 like", "New activity\nu2 post"),
        ("n2", "f1", "New activity\nr9 post", "New activity\nu2 post"),
    ]  # fmt: skip
    assert verdict.details["expected_attributes"]["push_text"] == TEMPLATE.push_text
    # Without a template, which text is not judged (only that there is one).
    assert _check(keys, history).valid is True


def test_wrong_text_reads_each_tenants_event_and_every_post_of_an_id():
    """Two tenants' events may share an id (each its own author), and an id posted twice may
    carry either post's text; a push whose event the harness never posted is not judged."""
    history = History()
    _post(history, "n1", "u1", tenant="acme")
    _post(history, "n1", "u7", tenant="globex")
    _post(history, "n2", "u2", object_id="o2")
    _post(history, "n2", "u3", object_id="o3")
    for tenant, author in (("acme", "u1"), ("globex", "u7")):
        history.extend_provider([{
            "received_at": AT, "tenant_id": tenant, "notification_id": "n1", "token": "a1",
            "provider": "apns", "status": 200, "delivered": True, "push_type": "alert",
            "text": f"New activity\n{author} post",
        }])  # fmt: skip
    _push(history, "n2", "a1", push_type="alert", text="New activity\nu3 post")
    _push(history, "n3", "a1", push_type="alert", text="anything")  # no event recorded
    deliveries = pd.DataFrame(
        [("acme", "n1", "a1", "u1", None), ("globex", "n1", "a1", "u1", None),
         ("acme", "n2", "a1", "u1", None), ("acme", "n3", "a1", "u1", None)],
        columns=EXPECTED_COLUMNS,
    )  # fmt: skip
    verdict = _check(Expectation(deliveries), history, policy=TEMPLATE)
    assert verdict.valid is True, verdict.details
    assert verdict.counts["judged"] == 4
    # The globex push with acme's text is wrong: the tenant is part of the event's key.
    history = History()
    _post(history, "n1", "u1", tenant="acme")
    _post(history, "n1", "u7", tenant="globex")
    history.extend_provider([{
        "received_at": AT, "tenant_id": "globex", "notification_id": "n1", "token": "a1",
        "provider": "apns", "status": 200, "delivered": True, "push_type": "alert",
        "text": "New activity\nu1 post",
    }])  # fmt: skip
    one = pd.DataFrame([("globex", "n1", "a1", "u1", None)], columns=EXPECTED_COLUMNS)
    assert _violations(_check(Expectation(one), history, policy=TEMPLATE))["wrong_text"] == 1


@pytest.mark.parametrize(
    "template",
    ["{author_id} {kind}", "New {kind}\n{author_id} {kind}", "{author_id} {kind}\n{object_id}",
     "{tenant_id}/{notification_id}: {kind}", "static text"],
)  # fmt: skip
def test_the_sql_rendering_is_render_push_text(template):
    """The checker's SQL and harness.model.system.render_push_text make the same text: a push
    carrying the Python rendering passes, one character more fails."""
    from harness.model.system import render_push_text

    event = {"tenant_id": "acme", "notification_id": "n1", "author_id": "u{kind}", "kind": "like",
             "object_id": "o-1"}  # fmt: skip
    policy = SystemPolicy.from_mapping({"push_text": template})
    rendered = render_push_text(template, event)
    for text, wrong in ((rendered, 0), (rendered + ".", 1)):
        history = History()
        _post(history, "n1", event["author_id"], event["kind"], object_id=event["object_id"])
        _push(history, "n1", "a1", push_type="alert", text=text)
        verdict = _check(_expect(("n1", "a1")), history, policy=policy)
        assert verdict.counts["wrong_text"] == wrong, (template, text)


@pytest.mark.parametrize(
    "template", ["{recipient} {kind}", "{kind!r}", "{kind:>9}", "a {{brace}}", "{kind", "", 7]
)
def test_a_push_text_template_the_harness_cannot_render_is_refused(template):
    with pytest.raises(ValueError, match="push_text"):
        SystemPolicy.from_mapping({"push_text": template})
