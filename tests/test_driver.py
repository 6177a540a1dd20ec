"""The Event API driver: the calls it builds and the answers it reads, and target files naming a
driver class."""

from __future__ import annotations

import pytest

from harness.contract.driver import (
    Call,
    DriverError,
    Event,
    FanoutApiDriver,
    Unsupported,
    load_driver,
)


def test_calls_are_built_from_the_operations_arguments():
    driver = FanoutApiDriver()
    call = driver.post_event(Event("t-0", "a1", "post", "o1", "01JABCDEFGHJKMNPQRSTVWXYZ0"))
    assert (call.method, call.path) == ("POST", "/v1/events")
    assert call.body["event_id"] == "01JABCDEFGHJKMNPQRSTVWXYZ0"
    page = driver.inbox_page("t-0", "u1", 3, "01JCURSOR")
    assert page.url == "/v1/tenants/t-0/users/u1/inbox?limit=3&cursor=01JCURSOR"
    assert driver.inbox_page("t-0", "u1", 3, None).url == "/v1/tenants/t-0/users/u1/inbox?limit=3"
    token = "abc/def+g=="
    assert driver.register_device("t", "u", token, "fcm").path.endswith(
        "/devices/abc%2Fdef%2Bg%3D%3D"
    )


def test_answers_are_read_in_the_verifiers_terms():
    driver = FanoutApiDriver()
    page = driver.parse_inbox_page(
        200,
        {"items": [{"notification_id": "n2", "author_id": "a", "read": True}], "next_cursor": "n2"},
    )
    assert page.items[0].notification_id == "n2" and page.items[0].read and page.next_cursor == "n2"
    assert driver.parse_unread_count(200, {"unread": 4, "capped": False}) == (4, False)
    with pytest.raises(DriverError):
        driver.parse_post_event(202, {"accepted": True})


def test_a_system_without_a_bulk_path_loads_row_by_row():
    with pytest.raises(Unsupported):
        FanoutApiDriver({"bulk": False}).load_users("t", [])


def test_a_target_names_its_driver_class():
    assert isinstance(load_driver(None), FanoutApiDriver)
    named = load_driver("harness.contract.driver:FanoutApiDriver", {"bulk": False})
    assert isinstance(named, FanoutApiDriver) and not named.bulk
    for bad, message in [
        ("no_colon", "package.module:Class"),
        ("no.such.module:X", "cannot import"),
        ("harness.contract.driver:Nope", "has no Nope"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_driver(bad)
    assert Call("GET", "/x").url == "/x"
