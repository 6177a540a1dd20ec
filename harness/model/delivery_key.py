"""One (tenant, notification, token) key per delivery, its strings held once.

While a run waits, a key per delivery stands in several places (the collector's set of
deliveries seen, the live metrics, the online checks), each built from rows parsed afresh: the
same notification id and token stood in memory once per key and per place, a few hundred bytes a
delivery each (2.3 GB at the end of a million's await). Interned, each distinct string is held
once, whoever built the key.
"""

from __future__ import annotations

import sys
from typing import Any


def delivery_key(tenant: Any, notification: Any, token: Any) -> tuple[str, str, str]:
    """The key, each part as text (a missing one reads ``"None"``), interned."""
    return (sys.intern(str(tenant)), sys.intern(str(notification)), sys.intern(str(token)))
