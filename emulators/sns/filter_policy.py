"""Subscription filter policies: checked as SNS checks them, applied as SNS applies them. Pure.

:func:`parse` takes the ``FilterPolicy`` text and the ``FilterPolicyScope`` and returns the
policy (None when the text is empty: no filtering), or raises ``InvalidParameter`` with SNS's
own reason; :func:`matches` says whether one published message passes it.

What AWS documents (Amazon SNS Developer Guide, "Amazon SNS message filtering" and "Filter policy
constraints"), and what this module does:

* A policy is a JSON object: each key must match (AND); each key's array lists conditions, any
  of which may match (OR). ``"$or": [{...}, {...}]`` matches when any of its policies does.
* Scope ``MessageAttributes`` (the default) matches message attributes by name; nested policies
  are refused. Strings match ``String`` attributes (and custom ``String.x`` types), numbers match
  ``Number`` attributes, and a ``String.Array`` attribute matches when any of its elements does
  (strings, numbers, ``true``, ``false``, ``null``; a value that is JSON but not an array counts
  as a one-element array, text that is not JSON matches nothing but ``exists``). ``Binary``
  attributes match only ``exists``.
* Scope ``MessageBody`` matches the message, which must be a JSON object, by property paths
  (nested policies); an array anywhere on the path is searched element by element, and each
  path is matched on its own.
* Conditions: an exact string, number (five digits of precision after the point), ``true``,
  ``false`` or ``null``; ``{"prefix"}``, ``{"suffix"}``, ``{"equals-ignore-case"}`` (strings);
  ``{"anything-but": value | [values] | {"prefix": p}}`` (the key must be present);
  ``{"numeric": ["=", n]}`` or a range (``">"``/``">="`` then ``"<"``/``"<="``);
  ``{"exists": true | false}``; ``{"cidr": "10.0.0.0/24"}`` (an IP address string in the block).
* Limits: at most five top-level keys; the product of the arrays' lengths (weighted by nesting
  depth; alternatives of ``$or`` add up) at most 150.

The reasons are AWS's words as its API answers them (recorded against AWS in LocalStack's
snapshot tests): ``Invalid parameter: Attributes Reason: FilterPolicy: <reason>`` from Subscribe,
``Invalid parameter: FilterPolicy: <reason>`` from SetSubscriptionAttributes. AWS appends its
JSON parser's position (``\\n at [Source: ...; line: 1, column: N]``) to some; we do not. AWS's
guide bounds numbers to ±10^9 but AWS accepts larger ones, and so do we.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from emulators.sns.errors import SnsError, invalid_parameter

ATTRIBUTES = "MessageAttributes"
BODY = "MessageBody"
SCOPES = (ATTRIBUTES, BODY)
MAX_KEYS = 5
MAX_COMBINATIONS = 150
MAX_POLICY_BYTES = 256 * 1024
PRECISION = 5  # digits after the decimal point that numeric matching honours
NUMERIC_OPERATORS = ("<", "<=", "=", ">", ">=")


@dataclass(frozen=True)
class FilterPolicy:
    """A checked policy: its scope and its alternatives, each a map of path -> conditions
    (one alternative unless the policy uses ``$or``)."""

    scope: str
    alternatives: tuple[dict[tuple[str, ...], list[Any]], ...]


def check_scope(value: object) -> str:
    if value not in SCOPES:
        raise invalid_parameter(
            f"Invalid parameter: FilterPolicyScope: Invalid value [{value}]. Please use either "
            "MessageBody or MessageAttributes"
        )
    return str(value)


def parse(
    text: str | None, scope: str = ATTRIBUTES, *, subscribe: bool = False
) -> FilterPolicy | None:
    """The policy ``text`` says, checked; None when it is empty or ``{}`` (no filtering)."""
    if text is None or text.strip() == "":
        return None
    prefix = "Invalid parameter: Attributes Reason: " if subscribe else "Invalid parameter: "
    if len(text.encode("utf-8")) > MAX_POLICY_BYTES:
        raise invalid_parameter(f"{prefix}FilterPolicy: Filter policy is too long")
    try:
        policy = json.loads(text)
    except ValueError as exc:
        raise invalid_parameter(f"{prefix}FilterPolicy: failed to parse JSON. {exc}") from None
    if not isinstance(policy, dict):
        raise invalid_parameter(f"{prefix}FilterPolicy: filter policy must be a JSON object")
    _Checker(scope, prefix).check(policy)
    if not policy:
        return None  # an empty policy filters nothing
    return FilterPolicy(scope, tuple(_alternatives(policy, ())))


# ---------------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------------
def _is_or(key: str, value: object) -> bool:
    """``$or`` is an operator when it holds policies; otherwise it is just a key's name."""
    return key == "$or" and isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Checker:
    def __init__(self, scope: str, prefix: str) -> None:
        self.scope = scope
        self.prefix = prefix

    def fail(self, reason: str) -> SnsError:
        return invalid_parameter(f"{self.prefix}FilterPolicy: {reason}")

    def check(self, policy: dict[str, Any]) -> None:
        if len(policy) > MAX_KEYS:
            raise self.fail(f"Filter policy can not have more than {MAX_KEYS} keys")
        conditions, combinations = self._walk(policy, 1, 1)
        if combinations > MAX_COMBINATIONS:
            raise self.fail("Filter policy is too complex")
        for condition in conditions:
            self._condition(condition)

    def _walk(self, policy: dict[str, Any], depth: int, combinations: int) -> tuple[list, int]:
        """Every condition in ``policy`` and the combinations so far (AWS's count: each array's
        length times its depth, multiplied; the alternatives of ``$or`` added)."""
        conditions: list[Any] = []
        for key, value in policy.items():
            if isinstance(value, dict):
                inner, combinations = self._walk(value, depth + 1, combinations)
                conditions += inner
            elif isinstance(value, list):
                if not value:
                    raise self.fail("Empty arrays are not allowed")
                if _is_or(key, value):
                    total = 0
                    for alternative in value:
                        inner, counted = self._walk(alternative, depth, combinations)
                        conditions += inner
                        total += counted
                    combinations = total
                else:
                    conditions += value
                    combinations *= len(value) * depth
            else:
                raise self.fail(f'"{key}" must be an object or an array')
        if self.scope == ATTRIBUTES and depth > 1:
            raise invalid_parameter(
                f"{self.prefix}Filter policy scope MessageAttributes does not support nested "
                "filter policy"
            )
        return conditions, combinations

    def _condition(self, condition: Any) -> None:
        if condition is None or isinstance(condition, str | bool) or _is_number(condition):
            return
        if not isinstance(condition, dict):
            raise self.fail("Match value must be String, number, true, false, or null")
        if len(condition) != 1:
            raise self.fail("Only one key allowed in match expression")
        ((operator, value),) = condition.items()
        if operator in ("prefix", "suffix", "equals-ignore-case"):
            if not isinstance(value, str):
                raise self.fail(f"{operator} match pattern must be a string")
        elif operator == "anything-but":
            self._anything_but(value)
        elif operator == "exists":
            if not isinstance(value, bool):
                raise self.fail("exists match pattern must be either true or false.")
        elif operator == "numeric":
            self._numeric(value)
        elif operator == "cidr":
            self._cidr(value)
        else:
            raise self.fail(f"Unrecognized match type {operator}")

    def _anything_but(self, value: Any) -> None:
        if isinstance(value, dict):
            for inner in value:
                if inner != "prefix":
                    raise self.fail(f"Unsupported anything-but pattern: {inner}")
            self._condition(value)
        elif isinstance(value, list):
            for item in value:
                if not (isinstance(item, str) or _is_number(item)):
                    raise self.fail("Match value must be String, number, true, false, or null")
        elif not (isinstance(value, str) or _is_number(value)):
            raise self.fail("Match value must be String, number, true, false, or null")

    def _numeric(self, value: Any) -> None:
        if not isinstance(value, list) or not value:
            raise self.fail("Invalid member in numeric match: ]")
        terms = list(value)
        operator = terms.pop(0)
        if not isinstance(operator, str):
            raise self.fail(f"Invalid member in numeric match: {_text(operator)}")
        if operator not in NUMERIC_OPERATORS:
            raise self.fail(f"Unrecognized numeric range operator: {operator}")
        bottom = terms.pop(0) if terms else None
        if not _is_number(bottom):
            raise self.fail(f"Value of {'equals' if operator == '=' else operator} must be numeric")
        if not terms:
            return
        if operator not in (">", ">="):
            raise self.fail("Too many elements in numeric expression")
        second = terms.pop(0)
        if not isinstance(second, str):
            raise self.fail(f"Bad value in numeric range: {_text(second)}")
        if second not in ("<", "<="):
            raise self.fail(f"Bad numeric range operator: {second}")
        top = terms.pop(0) if terms else None
        if not _is_number(top):
            raise self.fail(f"Value of {second} must be numeric")
        if top <= bottom:
            raise self.fail("Bottom must be less than top")
        if terms:
            raise self.fail("Too many terms in numeric range expression")

    def _cidr(self, value: Any) -> None:
        if not isinstance(value, str):
            raise self.fail("prefix match pattern must be a string")  # AWS's words for cidr too
        address, slash, mask = value.partition("/")
        if not slash or "/" in mask:
            raise self.fail("Malformed CIDR, one '/' required")
        if not mask.isdigit():
            raise self.fail("Malformed CIDR, mask bits must be an integer")
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise self.fail(f"Nonstandard IP address: {address}") from None


def _text(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _alternatives(
    policy: dict[str, Any], path: tuple[str, ...]
) -> Iterator[dict[tuple[str, ...], list[Any]]]:
    """The policy as flat alternatives (``$or`` multiplies them): path -> conditions."""
    alternatives: list[dict[tuple[str, ...], list[Any]]] = [{}]
    for key, value in policy.items():
        if _is_or(key, value):
            choices = [alt for option in value for alt in _alternatives(option, path)]
            alternatives = [{**a, **c} for a in alternatives for c in choices]
        elif isinstance(value, dict):
            inner = list(_alternatives(value, (*path, key)))
            alternatives = [{**a, **c} for a in alternatives for c in inner]
        else:
            alternatives = [{**a, (*path, key): value} for a in alternatives]
    yield from alternatives


# ---------------------------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------------------------
def matches(policy: FilterPolicy | None, attributes: dict[str, Any], message: str) -> bool:
    """Whether a message passes ``policy``. ``attributes``: name -> object with ``data_type``
    and ``value`` (str, or bytes for Binary), as :mod:`emulators.sns.messages` parses them."""
    if policy is None:
        return True
    if policy.scope == ATTRIBUTES:
        lookup = _attribute_lookup(attributes)
    else:
        try:
            body = json.loads(message)
        except ValueError:
            return False  # SNS filters a body only when it is a JSON object
        if not isinstance(body, dict):
            return False
        lookup = _body_lookup(body)
    return any(
        all(_key_matches(conditions, *lookup(path)) for path, conditions in alternative.items())
        for alternative in policy.alternatives
    )


def _attribute_lookup(attributes: dict[str, Any]) -> Any:
    def lookup(path: tuple[str, ...]) -> tuple[bool, list[Any]]:
        attr = attributes.get(path[0]) if len(path) == 1 else None
        if attr is None:
            return False, []
        return True, attribute_values(attr.data_type, attr.value)

    return lookup


def attribute_values(data_type: str, value: str | bytes) -> list[Any]:
    """What a message attribute offers to matching: strings, numbers, booleans, nulls."""
    if isinstance(value, bytes) or data_type.startswith("Binary"):
        return []
    if data_type.startswith("String.Array"):
        try:
            parsed = json.loads(value)
        except ValueError:
            return []
        return parsed if isinstance(parsed, list) else [parsed]
    if data_type.startswith("Number"):
        try:
            return [float(value)]
        except ValueError:
            return []
    return [value]


def _body_lookup(body: dict[str, Any]) -> Any:
    def lookup(path: tuple[str, ...]) -> tuple[bool, list[Any]]:
        present = False
        found: list[Any] = []
        for value in _walk_path(body, path):
            present = True  # an object or an empty array is there, though it matches no value
            items = _flatten(value) if isinstance(value, list) else [value]
            found += [v for v in items if not isinstance(v, dict)]
        return present, found

    return lookup


def _walk_path(node: Any, path: tuple[str, ...]) -> Iterator[Any]:
    """The values at ``path`` under ``node``, searching every element of arrays on the way."""
    if isinstance(node, list):
        for item in node:
            yield from _walk_path(item, path)
        return
    if not isinstance(node, dict) or path[0] not in node:
        return
    value = node[path[0]]
    if len(path) == 1:
        yield value
    else:
        yield from _walk_path(value, path[1:])


def _flatten(values: list[Any]) -> Iterator[Any]:
    for value in values:
        if isinstance(value, list):
            yield from _flatten(value)
        else:
            yield value


def _key_matches(conditions: list[Any], present: bool, values: list[Any]) -> bool:
    for condition in conditions:
        if isinstance(condition, dict) and "exists" in condition:
            if condition["exists"] == present:
                return True
        elif present and any(_condition_matches(condition, v) for v in values):
            return True
    return False


def _rounded(value: float) -> float:
    return round(float(value), PRECISION)


def _equal(condition: Any, value: Any) -> bool:
    """Exact matching: strings to strings, numbers to numbers (five decimals), and the
    keywords to themselves; never across types."""
    if condition is None or isinstance(condition, bool):
        return value is condition
    if isinstance(condition, str):
        return isinstance(value, str) and value == condition
    return _is_number(value) and _rounded(value) == _rounded(condition)


def _condition_matches(condition: Any, value: Any) -> bool:
    if not isinstance(condition, dict):
        return _equal(condition, value)
    ((operator, operand),) = condition.items()
    if operator == "anything-but":
        if isinstance(operand, dict):
            return isinstance(value, str) and not value.startswith(operand["prefix"])
        excluded = operand if isinstance(operand, list) else [operand]
        return not any(_equal(item, value) for item in excluded)
    if operator == "numeric":
        return _is_number(value) and _in_range(operand, _rounded(value))
    if not isinstance(value, str):
        return False
    if operator == "prefix":
        return value.startswith(operand)
    if operator == "suffix":
        return value.endswith(operand)
    if operator == "equals-ignore-case":
        return value.casefold() == operand.casefold()
    if operator == "cidr":
        try:
            return ipaddress.ip_address(value) in ipaddress.ip_network(operand, strict=False)
        except ValueError:
            return False
    return False


def _in_range(terms: list[Any], value: float) -> bool:
    for operator, bound in zip(terms[0::2], terms[1::2], strict=False):
        bound = _rounded(bound)
        ok = {
            "=": value == bound,
            ">": value > bound,
            ">=": value >= bound,
            "<": value < bound,
            "<=": value <= bound,
        }[operator]
        if not ok:
            return False
    return True
