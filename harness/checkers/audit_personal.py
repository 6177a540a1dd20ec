"""What of an erased user the audit trail still says in clear (GDPR Art. 17 against a WORM
trail; seed 000, issue 11).

The trail cannot be deleted (Object Lock, COMPLIANCE), so erasure must reach it some other way:
the reference seals personal fields under a per-user key and destroys the key. Whatever the
mechanism, what counts is what the STORED records still say: :func:`readable_personal_ids`
searches every audit row of an erased user's tenant, as stored (the fields the harness decrypted
with the auditor's privilege, ``decrypted``, are not part of the record and are not searched),
for that user's id, any of their device tokens, or a token's SHA-256 (hex), in any field, known
or not: a field named nowhere in the format leaks as much as ``recipient_user_id`` does.

A user id counts where it stands on its own: bounded by characters an id cannot hold (a quote, a
``:`` or ``#`` separator, a space), so ``u1`` is not found inside ``u12``, nor inside a
ciphertext (the reference's envelopes are base64url, every character of which an id may hold).
Tokens and their hashes are long enough to be searched as plain substrings. An id equal to a
value the format uses for something else (a user named ``sent``) would be reported: name users
so that cannot happen.

A pure function for the erasure checker, not a checker of its own (it takes the erased users as
an argument; the registry does not load it).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pandas as pd

# Fields the collector adds to a row's detail: not part of the stored record.
HARNESS_FIELDS = ("decrypted", "key_destroyed", "seal_broken", "object")
_ID_CHAR = r"[A-Za-z0-9_.\-]"  # what an id may hold (reference_impl/ids.py's rule)

User = tuple[str, str]  # tenant, user


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def stored_record(row: Any) -> dict[str, Any]:
    """An audit row as the system stored it: the detail without what the harness added, and
    the fields the collector moved into columns."""
    try:
        detail = json.loads(row.detail) if isinstance(row.detail, str) else {}
    except json.JSONDecodeError:
        detail = {"line": row.detail}
    if not isinstance(detail, dict):
        detail = {"line": row.detail}
    stored = {k: v for k, v in detail.items() if k not in HARNESS_FIELDS}
    for column, field in (
        ("reason", "outcome"),
        ("tenant_id", "tenant_id"),
        ("notification_id", "notification_id"),
        ("token", "token"),
    ):
        value = getattr(row, column)
        if isinstance(value, str):
            stored[field] = value
    return stored


def _strings(value: Any) -> Iterator[str]:
    """Every string value in a record (not the field names), nested ones included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _pattern(users: list[str], needles: list[str]) -> re.Pattern[str]:
    """One pattern per tenant: the tokens and hashes as substrings (tried first, longest
    first), then the user ids where they stand on their own."""
    ids = "|".join(re.escape(u) for u in sorted(users, key=len, reverse=True))
    bounded = f"(?<!{_ID_CHAR})(?:{ids})(?!{_ID_CHAR})" if ids else ""
    plain = "|".join(re.escape(n) for n in sorted(needles, key=len, reverse=True))
    return re.compile("|".join(p for p in (plain, bounded) if p))


def readable_personal_ids(
    history: pd.DataFrame,
    erased: set[User],
    tokens: Mapping[User, set[str]],
) -> list[dict[str, Any]]:
    """Every (audit row, erased user, what was found) where a row of the user's tenant holds, in
    clear in its stored record, the user's id (``found: user_id``), one of their tokens
    (``token``) or a token's SHA-256 (``token_sha256``)."""
    by_tenant: dict[str, dict[str, tuple[str, str]]] = {}  # tenant -> needle -> (user, found)
    for tenant, user in erased:
        needles = by_tenant.setdefault(tenant, {})
        for token in tokens.get((tenant, user), set()):
            needles[token] = (user, "token")
            needles[_sha256(token)] = (user, "token_sha256")
    users_of: dict[str, list[str]] = {}
    for tenant, user in erased:
        users_of.setdefault(tenant, []).append(user)
    patterns = {
        tenant: _pattern(users_of.get(tenant, []), list(by_tenant.get(tenant, {})))
        for tenant in users_of
    }
    rows = history[(history["kind"] == "audit") & history["tenant_id"].isin(list(patterns))]
    findings: list[dict[str, Any]] = []
    for row in rows.itertuples(index=False):
        tenant = str(row.tenant_id)
        needles = by_tenant.get(tenant, {})
        text = "\n".join(_strings(stored_record(row)))
        seen: set[tuple[str, str]] = set()
        for match in patterns[tenant].finditer(text):
            user, found = needles.get(match.group(0), (match.group(0), "user_id"))
            if (user, found) in seen:
                continue
            seen.add((user, found))
            findings.append(
                {
                    "seq": int(row.seq),
                    "tenant_id": tenant,
                    "user_id": user,
                    "found": found,
                    "outcome": None if pd.isna(row.reason) else str(row.reason),
                    "notification_id": None
                    if pd.isna(row.notification_id)
                    else str(row.notification_id),
                }
            )
    return findings
