"""AWS Signature Version 4 for the requests SNS makes to SQS.

SNS delivers to a queue in the queue's region; an SQS endpoint tells regions apart by the
credential scope of a request's signature (``Credential=<key>/<date>/<region>/sqs/aws4_request``),
so the deliveries are signed, with placeholder credentials (our SQS endpoint, like moto's, checks
no signature; a real one would refuse them, as it should).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from urllib.parse import urlsplit

ACCESS_KEY = "SNSDELIVERY"
SECRET_KEY = "sns-delivery-placeholder"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def sign(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    region: str,
    service: str = "sqs",
    now: datetime.datetime | None = None,
) -> dict[str, str]:
    """``headers`` plus ``host``, ``x-amz-date`` and the ``authorization`` of SigV4."""
    now = now or datetime.datetime.now(datetime.UTC)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    parts = urlsplit(url)
    signed = {k.lower(): v.strip() for k, v in headers.items()}
    signed["host"] = parts.netloc
    signed["x-amz-date"] = stamp
    names = sorted(signed)
    canonical = "\n".join(
        [
            method,
            parts.path or "/",
            parts.query,
            "".join(f"{n}:{signed[n]}\n" for n in names),
            ";".join(names),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _hmac(("AWS4" + SECRET_KEY).encode(), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    signed["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, SignedHeaders={';'.join(names)}, "
        f"Signature={signature}"
    )
    return signed
