"""A scenario activity that names any importable Python function, as Chaos Toolkit's do
(chaostoolkit-lib ``chaoslib/provider/python.py``): ``{type: python, module: pkg.mod, func:
name, arguments: {...}}``. ("Provider" is Chaos Toolkit's word for where an activity comes from;
it has nothing to do with APNs or FCM.)

The function is imported and its arguments bound to its signature when the scenario is parsed,
so a typo in a module, a function or an argument is a clear error before anything starts. As
Chaos Toolkit passes ``configuration`` and ``secrets`` only to functions that name them, the
harness passes what a run offers (a probe's ``tolerance``) only to functions that declare a
parameter of that name; the first positional argument is what the kind of activity works on
(the chaos targets, the action context, the evidence).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PROVIDER_KEYS = frozenset({"type", "module", "func", "arguments"})


class ProviderError(ValueError):
    """A python provider that cannot be called as written."""


@dataclass(frozen=True)
class PythonProvider:
    module: str
    func: str
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.module}.{self.func}"

    @classmethod
    def from_mapping(cls, value: Any) -> PythonProvider:
        if not isinstance(value, Mapping):
            raise ProviderError("provider must be a mapping {type: python, module, func}")
        unknown = sorted(set(value) - PROVIDER_KEYS)
        if unknown:
            raise ProviderError(
                f"provider: unknown key(s) {', '.join(map(str, unknown))}; "
                f"allowed: {', '.join(sorted(PROVIDER_KEYS))}"
            )
        if value.get("type") != "python":
            raise ProviderError(
                f"provider type must be python, not {value.get('type')!r} (the harness calls "
                "Python functions; process and http providers are Chaos Toolkit's own)"
            )
        module, func = value.get("module"), value.get("func")
        if not isinstance(module, str) or not module:
            raise ProviderError("a python provider needs a module (a dotted import path)")
        if not isinstance(func, str) or not func:
            raise ProviderError("a python provider needs a func (a function of its module)")
        arguments = value.get("arguments") or {}
        if not isinstance(arguments, Mapping):
            raise ProviderError("provider arguments must be a mapping")
        return cls(module, func, dict(arguments))

    def resolve(self) -> Callable[..., Any]:
        try:
            mod = importlib.import_module(self.module)
        except ImportError as exc:
            raise ProviderError(f"cannot import module {self.module!r}: {exc}") from exc
        except Exception as exc:  # a module that fails while importing: say so, not a traceback
            raise ProviderError(
                f"module {self.module!r} failed while importing: {type(exc).__name__}: {exc}"
            ) from exc
        found = getattr(mod, self.func, None)
        if found is None:
            raise ProviderError(f"module {self.module!r} has no function {self.func!r}")
        if not callable(found):
            raise ProviderError(f"{self.label} is not callable")
        return found

    def check(self, first: str, injectable: Iterable[str] = ()) -> Callable[..., Any]:
        """The function, after binding its arguments: ``first`` (the positional argument the
        harness passes, named for the message) and each of ``injectable`` it declares."""
        func = self.resolve()
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError):
            return func  # a builtin without a signature: the call itself will tell
        extra = {name: None for name in self._injected(signature, injectable)}
        try:
            signature.bind(None, **self.arguments, **extra)
        except TypeError as exc:
            raise ProviderError(
                f"{self.label}{signature} cannot be called with the {first} and arguments "
                f"{sorted(self.arguments)}: {exc}"
            ) from exc
        return func

    def declares(self, name: str) -> bool:
        """Whether the function has a parameter ``name`` that its arguments leave to the run."""
        try:
            return name in inspect.signature(self.resolve()).parameters
        except (TypeError, ValueError):
            return False

    def call(self, first: Any, **offered: Any) -> Any:
        """Call the function with ``first``, its arguments, and each of ``offered`` whose name
        it declares (and the arguments do not set)."""
        func = self.resolve()
        try:
            signature = inspect.signature(func)
            names = self._injected(signature, offered)
        except (TypeError, ValueError):
            names = []
        return func(first, **self.arguments, **{n: offered[n] for n in names})

    def _injected(self, signature: inspect.Signature, offered: Iterable[str]) -> list[str]:
        return [n for n in offered if n in signature.parameters and n not in self.arguments]
