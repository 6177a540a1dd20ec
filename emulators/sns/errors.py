"""SNS's error answers: code, HTTP status and fault side, as botocore's SNS model declares them.

The codes are the ``error.code`` of the model's error shapes (``InvalidParameter`` 400,
``ParameterValueInvalid`` 400 for ``InvalidParameterValueException``, ``NotFound`` 404,
``EndpointDisabled`` 400, ``AuthorizationError`` 403, ``Throttled`` 429, ``InternalError`` 500),
so botocore raises the modelled exception class (``client.exceptions.EndpointDisabledException``
...). Two are not in the model: ``Throttling`` (HTTP 400, "Rate exceeded"), what SNS answers a
throttled Publish with, which the SDKs classify as throttling and retry with back-off, and
``ServiceUnavailable`` (HTTP 503), AWS's common error for a transient outage, retried likewise.
"""

from __future__ import annotations


class SnsError(Exception):
    """An SNS error answer."""

    def __init__(
        self,
        code: str,
        message: str,
        status: int = 400,
        sender: bool = True,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.sender = sender
        #: seconds, sent as ``Retry-After`` (our extension: the provider's own hint, when it gave one)
        self.retry_after = retry_after


def invalid_parameter(message: str) -> SnsError:
    return SnsError("InvalidParameter", message)


def parameter_value_invalid(message: str) -> SnsError:
    return SnsError("ParameterValueInvalid", message)


def validation_error(member: str) -> SnsError:
    return SnsError(
        "ValidationError",
        f"1 validation error detected: Value null at '{member}' failed to satisfy constraint: "
        "Member must not be null",
    )


def not_found(message: str) -> SnsError:
    return SnsError("NotFound", message, 404)


def endpoint_disabled() -> SnsError:
    return SnsError("EndpointDisabled", "Endpoint is disabled")


def authorization_error(message: str) -> SnsError:
    return SnsError("AuthorizationError", message, 403)


def throttling(retry_after: float | None = None) -> SnsError:
    return SnsError("Throttling", "Rate exceeded", 400, retry_after=retry_after)


def throttled() -> SnsError:
    """The SMS operations' throttling error (``ThrottledException`` in the model)."""
    return SnsError(
        "Throttled",
        "The rate at which requests have been submitted for this action exceeds the limit for "
        "your account.",
        429,
    )


def internal_error(message: str = "Internal Error") -> SnsError:
    return SnsError("InternalError", message, 500, sender=False)


def service_unavailable(message: str = "Service is unavailable") -> SnsError:
    return SnsError("ServiceUnavailable", message, 503, sender=False)
