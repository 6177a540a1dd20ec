"""Subscription filter policies (``emulators.sns.filter_policy``): the checks SNS makes, with its
reasons, and the matching it does, on attributes and on message bodies. Pure: no sockets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from emulators.sns import filter_policy as fp
from emulators.sns.errors import SnsError
from emulators.sns.messages import Attribute


def attrs(**values: tuple[str, str]) -> dict[str, Attribute]:
    return {name: Attribute(kind, value) for name, (kind, value) in values.items()}


def passes(policy: dict, message: str = "m", scope: str = fp.ATTRIBUTES, **attributes: Any) -> bool:
    return fp.matches(fp.parse(json.dumps(policy), scope), attrs(**attributes), message)


def body_passes(policy: dict, body: Any) -> bool:
    return fp.matches(fp.parse(json.dumps(policy), fp.BODY), {}, json.dumps(body))


def reason(policy: Any, scope: str = fp.ATTRIBUTES, subscribe: bool = False) -> str:
    text = policy if isinstance(policy, str) else json.dumps(policy)
    with pytest.raises(SnsError) as caught:
        fp.parse(text, scope, subscribe=subscribe)
    assert caught.value.code == "InvalidParameter"
    return caught.value.message


# -- checks ----------------------------------------------------------------------------------------
def test_reasons_are_aws_words_prefixed_as_each_call_answers() -> None:
    assert reason({"k": [["v"]]}, subscribe=True) == (
        "Invalid parameter: Attributes Reason: FilterPolicy: Match value must be String, number, "
        "true, false, or null"
    )
    assert reason({"k": [["v"]]}) == (
        "Invalid parameter: FilterPolicy: Match value must be String, number, true, false, or null"
    )


@pytest.mark.parametrize(
    ("policy", "why"),
    [
        ({"k": [{"exists": None}]}, "exists match pattern must be either true or false."),
        ({"k": [{"error": True}]}, "Unrecognized match type error"),
        ({"k": [{"suffix": "a", "prefix": "b"}]}, "Only one key allowed in match expression"),
        ({"k": []}, "Empty arrays are not allowed"),
        ({"k": [{"suffix": 100}]}, "suffix match pattern must be a string"),
        ({"k": "v"}, '"k" must be an object or an array'),
        ({"k": [{"anything-but": {"suffix": "x"}}]}, "Unsupported anything-but pattern: suffix"),
        ({"k": [{"anything-but": {"prefix": 1}}]}, "prefix match pattern must be a string"),
        ({"k": [{"numeric": []}]}, "Invalid member in numeric match: ]"),
        ({"k": [{"numeric": [50, "<=", 100]}]}, "Invalid member in numeric match: 50"),
        ({"k": [{"numeric": ["0"]}]}, "Unrecognized numeric range operator: 0"),
        ({"k": [{"numeric": ["<", "100"]}]}, "Value of < must be numeric"),
        ({"k": [{"numeric": ["=", "1"]}]}, "Value of equals must be numeric"),
        ({"k": [{"numeric": ["<"]}]}, "Value of < must be numeric"),
        ({"k": [{"numeric": ["<", 20, ">", 1]}]}, "Too many elements in numeric expression"),
        ({"k": [{"numeric": [">", 20, ">", 1]}]}, "Bad numeric range operator: >"),
        ({"k": [{"numeric": [">", 20, 30]}]}, "Bad value in numeric range: 30"),
        ({"k": [{"numeric": [">", 20, "<", 1]}]}, "Bottom must be less than top"),
        ({"k": [{"numeric": [">", 20, "<"]}]}, "Value of < must be numeric"),
        (
            {"k": [{"numeric": [">", 1, "<", 3, "<", 5]}]},
            "Too many terms in numeric range expression",
        ),
        ({"k": [{"cidr": "10.0.0.1"}]}, "Malformed CIDR, one '/' required"),
        ({"k": [{"cidr": "10.0.0.0/x"}]}, "Malformed CIDR, mask bits must be an integer"),
        ({"k": [{"cidr": "xx.11.xx/24"}]}, "Nonstandard IP address: xx.11.xx"),
        ({"k": [{"cidr": 10}]}, "prefix match pattern must be a string"),
        ({"k": [str(i) for i in range(151)]}, "Filter policy is too complex"),
        ({f"k{i}": ["v"] for i in range(6)}, "Filter policy can not have more than 5 keys"),
    ],
)
def test_invalid_policies(policy: dict, why: str) -> None:
    assert reason(policy) == f"Invalid parameter: FilterPolicy: {why}"


def test_nesting_is_for_the_message_body_only_and_counts_in_complexity() -> None:
    assert reason({"store": {"key": ["a"]}}) == (
        "Invalid parameter: Filter policy scope MessageAttributes does not support nested "
        "filter policy"
    )
    nested = {
        "a": {"b": {"c": ["1", "2", "3", "4"]}},  # 4 values three deep
        "d": {"e": ["1", "2", "3"]},  # 3 values two deep
        "f": ["1", "2", "3"],
    }  # 4*3 x 3*2 x 3*1 = 216 > 150
    assert (
        reason(nested, fp.BODY) == "Invalid parameter: FilterPolicy: Filter policy is too complex"
    )
    del nested["f"]
    assert fp.parse(json.dumps(nested), fp.BODY) is not None


def test_or_alternatives_add_up_in_complexity() -> None:
    ok = {"$or": [{"a": [str(i) for i in range(75)]}, {"b": [str(i) for i in range(75)]}]}
    assert fp.parse(json.dumps(ok)) is not None
    ok["$or"].append({"c": ["x"]})
    assert reason(ok).endswith("Filter policy is too complex")


def test_scope_json_and_empty_policy() -> None:
    assert fp.check_scope("MessageBody") == "MessageBody"
    with pytest.raises(SnsError) as caught:
        fp.check_scope("RandomValue")
    assert caught.value.message == (
        "Invalid parameter: FilterPolicyScope: Invalid value [RandomValue]. Please use either "
        "MessageBody or MessageAttributes"
    )
    assert reason("{invalid").startswith("Invalid parameter: FilterPolicy: failed to parse JSON.")
    assert fp.parse("", fp.ATTRIBUTES) is None
    assert fp.matches(fp.parse("{}"), {}, "anything")


# -- matching on attributes ---------------------------------------------------------------------
def test_exact_strings_and_numbers_never_match_across_types() -> None:
    assert passes({"store": ["example_corp"]}, store=("String", "example_corp"))
    assert not passes({"store": ["example_corp"]}, store=("String", "other"))
    assert not passes({"store": ["example_corp"]})
    assert passes({"price": [100]}, price=("Number", "100"))
    assert passes({"price": [301.5]}, price=("Number", "3.015e2"))
    assert not passes({"price": [100]}, price=("String", "100"))
    assert not passes({"price": ["100"]}, price=("Number", "100"))
    assert passes({"price": [100.123456789]}, price=("Number", "100.1234567"))  # five decimals
    assert not passes({"price": [100.12]}, price=("Number", "100.13"))
    assert passes({"s": ["x"]}, s=("String.custom", "x"))
    assert not passes({"b": ["AQ=="]}, b=("Binary", b"\x01"))
    assert passes({"b": [{"exists": True}]}, b=("Binary", b"\x01"))


def test_string_arrays_match_any_element() -> None:
    interests = ("String.Array", json.dumps(["basketball", "rugby"]))
    assert passes({"i": ["basketball", "baseball"]}, i=interests)
    assert not passes({"i": ["baseball"]}, i=interests)
    assert passes({"p": [100, 500]}, p=("String.Array", json.dumps([100, 50])))
    assert not passes({"p": [500]}, p=("String.Array", json.dumps([100, 50])))
    assert passes({"p": [100]}, p=("String.Array", "100"))  # JSON but not an array: one element
    assert not passes({"p": [100]}, p=("String.Array", "one hundred"))
    assert passes(
        {"f": [False], "n": [None]}, f=("String.Array", "[false]"), n=("String.Array", "[null]")
    )


def test_operators() -> None:
    def each(policy: dict, values: list[str], kind: str = "String") -> list[str]:
        return [v for v in values if passes({"k": [policy]}, k=(kind, v))]

    sports = ["basketball", "rugby", "baseball", "TeNnis"]
    assert each({"prefix": "bas"}, sports) == ["basketball", "baseball"]
    assert each({"suffix": "ball"}, sports) == ["basketball", "baseball"]
    assert each({"equals-ignore-case": "tennis"}, sports) == ["TeNnis"]
    assert each({"anything-but": "basketball"}, sports) == ["rugby", "baseball", "TeNnis"]
    assert each({"anything-but": ["basketball", "rugby"]}, sports) == ["baseball", "TeNnis"]
    assert each({"anything-but": {"prefix": "bas"}}, sports) == ["rugby", "TeNnis"]
    numbers = ["50", "100", "150"]
    assert each({"anything-but": [100]}, numbers, "Number") == ["50", "150"]
    assert each({"anything-but": ["100"]}, numbers, "Number") == numbers
    assert each({"numeric": ["=", 100]}, numbers, "Number") == ["100"]
    assert each({"numeric": [">", 49, "<=", 100]}, numbers, "Number") == ["50", "100"]
    assert each({"numeric": [">=", 100]}, numbers, "Number") == ["100", "150"]
    assert each({"numeric": ["<", 100]}, numbers, "String") == []
    ips = ["10.0.0.7", "10.0.1.7", "2001:db8::1", "nope"]
    assert each({"cidr": "10.0.0.0/24"}, ips) == ["10.0.0.7"]
    assert each({"cidr": "2001:db8::/32"}, ips) == ["2001:db8::1"]


def test_anything_but_and_exists_need_the_key_as_aws_says() -> None:
    assert not passes({"k": [{"anything-but": "x"}]})
    assert passes({"k": [{"exists": False}]}, other=("String", "1"))
    assert not passes({"k": [{"exists": False}]}, k=("String", "1"))
    assert passes({"k": [{"exists": True}]}, k=("String", "1"))


def test_every_key_must_match_and_or_offers_alternatives() -> None:
    policy = {"source": ["cw"], "$or": [{"metric": ["cpu"]}, {"ns": ["ec2"]}]}
    assert passes(policy, source=("String", "cw"), metric=("String", "cpu"))
    assert passes(policy, source=("String", "cw"), ns=("String", "ec2"))
    assert not passes(policy, source=("String", "cw"))
    assert not passes(policy, source=("String", "x"), ns=("String", "ec2"))


# -- matching on the body ------------------------------------------------------------------------
def test_body_paths_arrays_and_keywords() -> None:
    assert body_passes({"store": {"name": ["corp"]}}, {"store": {"name": "corp"}})
    assert not body_passes({"store": {"name": ["corp"]}}, {"store": {"name": "other"}})
    assert not body_passes({"store": {"name": ["corp"]}}, {"store": "corp"})
    records = {"Records": {"eventName": [{"prefix": "ObjectCreated:"}]}}
    assert body_passes(
        records, {"Records": [{"eventName": "ObjectCreated:Put"}, {"eventName": "Del"}]}
    )
    assert not body_passes(records, {"Records": [{"eventName": "Del"}]})
    assert body_passes({"price": [100, 500]}, {"price": [100, 50]})
    assert body_passes({"flag": [True], "none": [None]}, {"flag": True, "none": None})
    assert not body_passes({"none": [None]}, {})
    assert body_passes({"a": [{"exists": True}]}, {"a": {"b": 1}})
    assert body_passes({"a": [{"exists": False}]}, {"b": 1})
    assert not body_passes({"k": ["v"]}, ["not", "an", "object"])
    policy = fp.parse(json.dumps({"k": ["v"]}), fp.BODY)
    assert not fp.matches(policy, {}, '{"k": "v"')  # not JSON: filtered out
    assert fp.matches(fp.parse("{}", fp.BODY), {}, "not json")  # an empty policy filters nothing


def test_or_nested_in_the_body() -> None:
    policy = {"a": {"$or": [{"b": ["1"]}, {"c": ["2"]}]}}
    assert body_passes(policy, {"a": {"c": "2"}})
    assert not body_passes(policy, {"a": {"b": "2"}})
