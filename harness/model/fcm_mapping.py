"""Which FCM sender project a system sends a user's pushes to: the mapping a system states.

Seed 000 shards FCM over K sender projects and keeps "a given device sticky to one project" by
``recipient_user_id mod K``; a team's system may keep users sticky another way. A system states
its mapping (``policy.fcm_mapping``) as one of:

* ``digits-mod``: the digits of the user id, as a number, mod K (the reference's rule);
* an expression over ``user_id``, ``tenant_id`` and ``projects`` (the stated projects, in
  order), e.g. ``projects[crc32(user_id) % len(projects)]``, with the functions
  :data:`FUNCTIONS`;
* ``package.module:function``, called as ``function(tenant_id, user_id, projects)``.

None (not stated): only stickiness is judged (each user's pushes on one project), not which.

Why a small evaluator of our own: ``eval`` would run whatever a target file says, and no
well-kept package evaluates an arithmetic expression over a whitelist this small (simpleeval
would do, but adds a dependency for thirty lines); the grammar below is Python's own, parsed by
``ast`` and walked node by node.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import operator
import zlib
from collections.abc import Callable, Sequence
from typing import Any

# (tenant_id, user_id) -> project, or None when the mapping names none for that user.
ProjectOf = Callable[[str, str], str | None]

DIGITS_MOD = "digits-mod"


def _digits(text: str) -> int:
    found = "".join(c for c in str(text) if c.isdigit())
    if not found:
        raise ValueError(f"{text!r} carries no digits")
    return int(found)


def _md5(text: str) -> int:
    return int.from_bytes(hashlib.md5(str(text).encode()).digest(), "big")


def _sha256(text: str) -> int:
    return int.from_bytes(hashlib.sha256(str(text).encode()).digest(), "big")


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "crc32": lambda text: zlib.crc32(str(text).encode()),
    "md5": _md5,
    "sha256": _sha256,
    "digits": _digits,
    "int": int,
    "str": str,
    "len": len,
    "abs": abs,
}
_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
NAMES = ("user_id", "tenant_id", "projects")


class MappingError(ValueError):
    """A mapping that cannot be used, with what is wrong in it."""


def _check(node: ast.AST, text: str) -> None:
    """Refuse anything outside the grammar: names, constants, + - * // %, calls of
    :data:`FUNCTIONS`, subscripts."""
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            if child.id not in NAMES and child.id not in FUNCTIONS:
                raise MappingError(
                    f"fcm_mapping {text!r}: unknown name {child.id!r}; "
                    f"known: {', '.join((*NAMES, *FUNCTIONS))}"
                )
        elif isinstance(child, ast.Call):
            if not isinstance(child.func, ast.Name) or child.func.id not in FUNCTIONS:
                raise MappingError(f"fcm_mapping {text!r}: only {', '.join(FUNCTIONS)} are called")
            if child.keywords:
                raise MappingError(f"fcm_mapping {text!r}: no keyword arguments")
        elif isinstance(child, ast.BinOp):
            if type(child.op) not in _OPERATORS:
                raise MappingError(f"fcm_mapping {text!r}: only + - * // % are allowed")
        elif not isinstance(
            child,
            (ast.Expression, ast.Constant, ast.Subscript, ast.Load, ast.operator, ast.UnaryOp),
        ) or (isinstance(child, ast.UnaryOp) and not isinstance(child.op, ast.USub)):
            raise MappingError(f"fcm_mapping {text!r}: {type(child).__name__} is not allowed")


def _evaluate(node: ast.AST, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, names)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return names[node.id] if node.id in names else FUNCTIONS[node.id]
    if isinstance(node, ast.BinOp):
        op = _OPERATORS[type(node.op)]
        return op(_evaluate(node.left, names), _evaluate(node.right, names))
    if isinstance(node, ast.UnaryOp):
        return -_evaluate(node.operand, names)
    if isinstance(node, ast.Call):
        function = _evaluate(node.func, names)
        return function(*(_evaluate(a, names) for a in node.args))
    if isinstance(node, ast.Subscript):
        return _evaluate(node.value, names)[_evaluate(node.slice, names)]
    raise MappingError(f"cannot evaluate {type(node).__name__}")  # refused by _check already


def _digits_mod(projects: tuple[str, ...]) -> ProjectOf:
    def project_of(tenant_id: str, user_id: str) -> str | None:
        digits = "".join(c for c in user_id if c.isdigit())
        return projects[int(digits) % len(projects)] if digits else None

    return project_of


def _function(spec: str, projects: tuple[str, ...]) -> ProjectOf:
    module_name, _, name = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise MappingError(f"fcm_mapping {spec}: cannot import it ({exc})") from exc
    if not callable(function):
        raise MappingError(f"fcm_mapping {spec}: not a function")
    return lambda tenant_id, user_id: _as_project(function(tenant_id, user_id, projects))


def _as_project(value: Any) -> str | None:
    return None if value is None else str(value)


def _expression(text: str, projects: tuple[str, ...]) -> ProjectOf:
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise MappingError(f"fcm_mapping {text!r} is not an expression: {exc.msg}") from exc
    _check(tree, text)

    def project_of(tenant_id: str, user_id: str) -> str | None:
        names = {"user_id": user_id, "tenant_id": tenant_id, "projects": projects}
        try:
            return _as_project(_evaluate(tree, names))
        except (ValueError, TypeError, IndexError, ZeroDivisionError):
            return None  # the mapping names no project for this user: not judged

    return project_of


def project_function(spec: str | None, projects: Sequence[str]) -> ProjectOf | None:
    """The stated mapping as a function, None when none is stated (or no projects are).
    Raises :class:`MappingError` for a mapping that cannot be used (checked when a target file
    is read, before any load)."""
    names = tuple(projects)
    if spec is None or not names:
        return None
    spec = spec.strip()
    if spec == DIGITS_MOD:
        return _digits_mod(names)
    if ":" in spec and "[" not in spec and "(" not in spec:
        return _function(spec, names)
    return _expression(spec, names)
