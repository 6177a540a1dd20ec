"""SNS state for one account in one region, pure: platform applications and endpoints, SMS
settings, and the topics (:mod:`emulators.sns.topics`).

No I/O here (delivery is :mod:`emulators.sns.delivery`'s). Every call is O(1) or O(log n) in
the number of endpoints, except listing pages (O(page)).

Behaviour follows AWS's API reference where it says something; where it does not, the choice is
said here:

* CreatePlatformEndpoint is idempotent for the same token in the same application: it returns
  the existing endpoint when the request's ``CustomUserData`` (absent = empty) and every
  attribute it names (``Enabled``, ``CustomUserData``) match the endpoint's; otherwise
  ``InvalidParameter: Invalid parameter: Token Reason: Endpoint <arn> already exists with the same
  Token, but different attributes.``. A disabled endpoint is returned as it is when the request
  does not name ``Enabled`` (the caller re-enables it with SetEndpointAttributes, as AWS's token
  management guide does).
* Listing pages hold 100 items; ``NextToken`` is opaque and survives deletions between pages.
* DeleteEndpoint of an unknown endpoint succeeds (AWS documents it as idempotent).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from emulators.sns.common import (
    ACCOUNT_ID,
    PAGE_SIZE,
    REGION,
    ArnParts,
    OrderedPages,
    SqsTarget,
    bool_text,
    parse_sns_arn,
    sns_arn,
)
from emulators.sns.credentials import Credential, parse_credentials
from emulators.sns.errors import (
    SnsError,
    authorization_error,
    invalid_parameter,
    not_found,
)
from emulators.sns.topics import Topics

PLATFORMS = ("APNS", "APNS_SANDBOX", "GCM")
ALL_PLATFORMS = ("ADM", "APNS", "APNS_SANDBOX", "BAIDU", "GCM", "MPNS", "WNS")
EVENT_ATTRIBUTES = (
    "EventEndpointCreated",
    "EventEndpointDeleted",
    "EventEndpointUpdated",
    "EventDeliveryFailure",
)
APP_ATTRIBUTES = frozenset(
    {
        "PlatformCredential",
        "PlatformPrincipal",
        "ApplePlatformTeamID",
        "ApplePlatformBundleID",
        "SuccessFeedbackRoleArn",
        "FailureFeedbackRoleArn",
        "SuccessFeedbackSampleRate",
        *EVENT_ATTRIBUTES,
    }
)
CREDENTIAL_ATTRIBUTES = ("PlatformCredential", "PlatformPrincipal")
ENDPOINT_ATTRIBUTES = frozenset({"CustomUserData", "Enabled", "Token"})
SMS_ATTRIBUTES = frozenset(
    {
        "MonthlySpendLimit",
        "DeliveryStatusIAMRole",
        "DeliveryStatusSuccessSamplingRate",
        "DefaultSenderID",
        "DefaultSMSType",
        "UsageReportS3Bucket",
    }
)
SMS_TYPES = ("Promotional", "Transactional")
OPT_IN_INTERVAL = 30 * 24 * 3600  # AWS: a number can be opted in once every 30 days
MAX_CUSTOM_USER_DATA = 2048
_APP_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,256}$")
_HEX = re.compile(r"^[0-9a-fA-F]+$")
E164 = re.compile(r"^\+[1-9][0-9]{1,14}$")


def valid_phone_number(number: object) -> str:
    """An E.164 number (``+`` and up to 15 digits); InvalidParameter otherwise."""
    if not isinstance(number, str) or not E164.match(number):
        raise invalid_parameter(
            f"Invalid parameter: PhoneNumber Reason: {number} is not valid to publish to"
        )
    return number


@dataclass
class PlatformApplication:
    arn: str
    name: str
    platform: str
    attributes: dict[str, str]  # as set, credentials included (never answered back)
    credential: Credential
    endpoints: OrderedPages = field(default_factory=OrderedPages)
    tokens: dict[str, str] = field(default_factory=dict)  # token -> endpoint ARN

    def public_attributes(self) -> dict[str, str]:
        out = {"Enabled": "true"}
        out.update({k: v for k, v in self.attributes.items() if k not in CREDENTIAL_ATTRIBUTES})
        out.update(self.credential.public_attributes())
        for key in ("ApplePlatformTeamID", "ApplePlatformBundleID"):
            if key in out and not out[key]:
                del out[key]
        return out

    def event_topic(self, event: str) -> str | None:
        topic = self.attributes.get(event)
        return topic or None


@dataclass
class Endpoint:
    arn: str
    application_arn: str
    token: str
    enabled: bool = True
    custom_user_data: str | None = None

    def attributes(self) -> dict[str, str]:
        out = {"Enabled": "true" if self.enabled else "false", "Token": self.token}
        if self.custom_user_data is not None:
            out["CustomUserData"] = self.custom_user_data
        return out


@dataclass
class EndpointChange:
    """What an endpoint operation changed, for the application's event notifications."""

    event: str  # one of EVENT_ATTRIBUTES
    endpoint: Endpoint
    changed: dict[str, str] = field(default_factory=dict)


class SnsModel:
    """Everything one account and region of SNS holds."""

    def __init__(
        self,
        region: str = REGION,
        clock: Callable[[], float] = time.time,
        account_id: str = ACCOUNT_ID,
    ) -> None:
        self.region = region
        self.clock = clock
        self.account_id = account_id
        self.reset()

    def reset(self) -> None:
        self.applications: dict[str, PlatformApplication] = {}
        self.app_pages = OrderedPages()
        self.endpoints: dict[str, Endpoint] = {}
        self.topics = Topics(self.region, self.account_id, self.clock)
        self.sms_attributes: dict[str, str] = {}
        self.opted_out: dict[str, float] = {}  # number -> when it opted out
        self.opted_out_pages = OrderedPages()
        self.opted_in_at: dict[str, float] = {}

    # -- ARNs ------------------------------------------------------------------------------------
    def _own(self, arn: object, parameter: str) -> ArnParts:
        parts = parse_sns_arn(arn, parameter)
        if parts.account != self.account_id:
            raise authorization_error(
                f"User: arn:aws:iam::{self.account_id}:root is not authorized to access {arn}"
            )
        return parts

    # -- platform applications -----------------------------------------------------------------
    def create_platform_application(
        self, name: object, platform: object, attributes: dict[str, str]
    ) -> PlatformApplication:
        if not isinstance(name, str) or not _APP_NAME.match(name):
            raise invalid_parameter(
                "Invalid parameter: Name Reason: Application names must be made up of only "
                "uppercase and lowercase ASCII letters, numbers, underscores, hyphens, and "
                "periods, and must be between 1 and 256 characters long."
            )
        if platform not in ALL_PLATFORMS:
            raise invalid_parameter(
                f"Invalid parameter: Platform Reason: {platform} is not supported"
            )
        if platform not in PLATFORMS:
            raise invalid_parameter(
                f"Invalid parameter: Platform Reason: {platform} is not delivered by this "
                f"endpoint (it delivers {', '.join(PLATFORMS)})"
            )
        self._check_app_attributes(attributes)
        credential = parse_credentials(platform, attributes)
        arn = sns_arn(self.region, f"app/{platform}/{name}", self.account_id)
        existing = self.applications.get(arn)
        if existing is not None:
            existing.attributes = dict(attributes)
            existing.credential = credential
            return existing
        app = PlatformApplication(arn, name, platform, dict(attributes), credential)
        self.applications[arn] = app
        self.app_pages.add(arn)
        return app

    def _check_app_attributes(self, attributes: dict[str, str]) -> None:
        for key, value in attributes.items():
            if key not in APP_ATTRIBUTES:
                raise invalid_parameter(
                    f"Invalid parameter: Attributes Reason: Invalid attribute name: {key}"
                )
            if key in EVENT_ATTRIBUTES and value:
                parts = self._own(value, key)
                if not parts.resource or ":" in parts.resource or "/" in parts.resource:
                    raise invalid_parameter(
                        f"Invalid parameter: {key} Reason: not a topic ARN: {value}"
                    )

    def application(self, arn: object) -> PlatformApplication:
        self._own(arn, "PlatformApplicationArn")
        app = self.applications.get(arn)  # type: ignore[arg-type]
        if app is None:
            raise not_found("PlatformApplication does not exist")
        return app

    def set_platform_application_attributes(
        self, arn: object, attributes: dict[str, str]
    ) -> PlatformApplication:
        app = self.application(arn)
        self._check_app_attributes(attributes)
        merged = {**app.attributes, **attributes}
        if any(
            k in attributes
            for k in (*CREDENTIAL_ATTRIBUTES, "ApplePlatformTeamID", "ApplePlatformBundleID")
        ):
            app.credential = parse_credentials(app.platform, merged)
        app.attributes = merged
        return app

    def delete_platform_application(self, arn: object) -> None:
        self._own(arn, "PlatformApplicationArn")
        app = self.applications.pop(arn, None)  # type: ignore[arg-type]
        if app is None:
            return
        self.app_pages.remove(app.arn)
        for endpoint_arn in list(app.tokens.values()):
            self.endpoints.pop(endpoint_arn, None)

    def list_platform_applications(
        self, next_token: str | None
    ) -> tuple[list[PlatformApplication], str | None]:
        arns, token = self.app_pages.page(next_token)
        return [self.applications[a] for a in arns], token

    # -- endpoints -----------------------------------------------------------------------------
    def create_platform_endpoint(
        self,
        application_arn: object,
        token: object,
        custom_user_data: str | None,
        attributes: dict[str, str],
    ) -> tuple[Endpoint, bool]:
        """(endpoint, created); the existing endpoint when the call repeats an earlier one."""
        app = self.application(application_arn)
        token = self._valid_token(app, token)
        for key in attributes:
            if key not in ENDPOINT_ATTRIBUTES:
                raise invalid_parameter(
                    f"Invalid parameter: Attributes Reason: Invalid attribute name: {key}"
                )
        if "Token" in attributes and attributes["Token"] != token:
            raise invalid_parameter(
                "Invalid parameter: Token Reason: differs from Attributes.Token"
            )
        user_data = attributes.get("CustomUserData", custom_user_data)
        if user_data is not None and len(user_data.encode()) > MAX_CUSTOM_USER_DATA:
            raise invalid_parameter(
                "Invalid parameter: CustomUserData Reason: must be less than 2KB of UTF-8"
            )
        enabled = bool_text(attributes["Enabled"], "Enabled") if "Enabled" in attributes else None
        existing_arn = app.tokens.get(token)
        if existing_arn is not None:
            existing = self.endpoints[existing_arn]
            same = (existing.custom_user_data or "") == (user_data or "") and (
                enabled is None or (enabled == "true") == existing.enabled
            )
            if not same:
                raise invalid_parameter(
                    f"Invalid parameter: Token Reason: Endpoint {existing.arn} already exists "
                    "with the same Token, but different attributes."
                )
            return existing, False
        arn = sns_arn(
            self.region, f"endpoint/{app.platform}/{app.name}/{uuid.uuid4()}", self.account_id
        )
        endpoint = Endpoint(arn, app.arn, token, enabled != "false", user_data)
        self.endpoints[arn] = endpoint
        app.tokens[token] = arn
        app.endpoints.add(arn)
        return endpoint, True

    def _valid_token(self, app: PlatformApplication, token: object) -> str:
        if not isinstance(token, str) or not token.strip():
            raise invalid_parameter("Invalid parameter: Token Reason: must not be empty")
        if app.platform in ("APNS", "APNS_SANDBOX") and (
            not _HEX.match(token) or len(token) > 400 or len(token) % 2
        ):
            raise invalid_parameter(
                "Invalid parameter: Token Reason: iOS device tokens must be no more than 400 "
                "hexadecimal characters"
            )
        if len(token) > 4096:
            raise invalid_parameter("Invalid parameter: Token Reason: too long")
        return token

    def endpoint(self, arn: object, parameter: str = "EndpointArn") -> Endpoint:
        self._own(arn, parameter)
        endpoint = self.endpoints.get(arn)  # type: ignore[arg-type]
        if endpoint is None:
            raise not_found("Endpoint does not exist")
        return endpoint

    def set_endpoint_attributes(self, arn: object, attributes: dict[str, str]) -> EndpointChange:
        endpoint = self.endpoint(arn)
        app = self.applications[endpoint.application_arn]
        for key in attributes:
            if key not in ENDPOINT_ATTRIBUTES:
                raise invalid_parameter(
                    f"Invalid parameter: Attributes Reason: Invalid attribute name: {key}"
                )
        changed: dict[str, str] = {}
        new_token = endpoint.token
        if "Token" in attributes:
            new_token = self._valid_token(app, attributes["Token"])
        enabled = endpoint.enabled
        if "Enabled" in attributes:
            enabled = bool_text(attributes["Enabled"], "Enabled") == "true"
        user_data = attributes.get("CustomUserData", endpoint.custom_user_data)
        if user_data is not None and len(user_data.encode()) > MAX_CUSTOM_USER_DATA:
            raise invalid_parameter(
                "Invalid parameter: CustomUserData Reason: must be less than 2KB of UTF-8"
            )
        if new_token != endpoint.token:
            if app.tokens.get(endpoint.token) == endpoint.arn:
                del app.tokens[endpoint.token]
            app.tokens[new_token] = endpoint.arn
            endpoint.token = new_token
            changed["Token"] = new_token
        if enabled != endpoint.enabled:
            endpoint.enabled = enabled
            changed["Enabled"] = "true" if enabled else "false"
        if user_data != endpoint.custom_user_data:
            endpoint.custom_user_data = user_data
            changed["CustomUserData"] = user_data or ""
        return EndpointChange("EventEndpointUpdated", endpoint, changed)

    def disable_endpoint(self, endpoint: Endpoint) -> EndpointChange | None:
        """A provider said the token is dead: ``Enabled`` becomes false (None: it already was)."""
        if not endpoint.enabled or endpoint.arn not in self.endpoints:
            return None
        endpoint.enabled = False
        return EndpointChange("EventEndpointUpdated", endpoint, {"Enabled": "false"})

    def delete_endpoint(self, arn: object) -> EndpointChange | None:
        self._own(arn, "EndpointArn")
        endpoint = self.endpoints.pop(arn, None)  # type: ignore[arg-type]
        if endpoint is None:
            return None
        app = self.applications.get(endpoint.application_arn)
        if app is not None:
            if app.tokens.get(endpoint.token) == endpoint.arn:
                del app.tokens[endpoint.token]
            app.endpoints.remove(endpoint.arn)
        return EndpointChange("EventEndpointDeleted", endpoint)

    def list_endpoints(
        self, application_arn: object, next_token: str | None
    ) -> tuple[list[Endpoint], str | None]:
        app = self.application(application_arn)
        arns, token = app.endpoints.page(next_token)
        return [self.endpoints[a] for a in arns], token

    # -- SMS -----------------------------------------------------------------------------------
    def set_sms_attributes(self, attributes: dict[str, str]) -> None:
        for key, value in attributes.items():
            if key not in SMS_ATTRIBUTES:
                raise invalid_parameter(f"Invalid parameter: {key}")
            if key == "DefaultSMSType" and value not in SMS_TYPES:
                raise invalid_parameter(
                    f"Invalid parameter: DefaultSMSType Reason: {value} is not one of "
                    f"{', '.join(SMS_TYPES)}"
                )
            if key == "MonthlySpendLimit" and not value.isdigit():
                raise invalid_parameter("Invalid parameter: MonthlySpendLimit")
            if key == "DefaultSenderID":
                check_sender_id(value, "DefaultSenderID")
        self.sms_attributes.update(attributes)

    def get_sms_attributes(self, names: list[str]) -> dict[str, str]:
        if not names:
            return dict(self.sms_attributes)
        return {k: v for k, v in self.sms_attributes.items() if k in names}

    def opt_out(self, number: str) -> bool:
        """Mark ``number`` opted out (a STOP reply); False when it already was."""
        number = valid_phone_number(number)
        if number in self.opted_out:
            return False
        self.opted_out[number] = self.clock()
        self.opted_out_pages.add(number)
        return True

    def is_opted_out(self, number: object) -> bool:
        if not isinstance(number, str) or not E164.match(number):
            raise invalid_parameter(
                "Invalid parameter: PhoneNumber Reason: input incorrectly formatted"
            )
        return number in self.opted_out

    def list_opted_out(self, next_token: str | None) -> tuple[list[str], str | None]:
        return self.opted_out_pages.page(next_token)

    def opt_in(self, number: object) -> None:
        if not isinstance(number, str) or not E164.match(number):
            raise invalid_parameter(
                "Invalid parameter: PhoneNumber Reason: input incorrectly formatted"
            )
        if number not in self.opted_out:
            return
        now = self.clock()
        last = self.opted_in_at.get(number)
        if last is not None and now - last < OPT_IN_INTERVAL:
            raise invalid_parameter(
                "Invalid parameter: PhoneNumber Reason: a phone number can be opted in only once "
                "every 30 days"
            )
        del self.opted_out[number]
        self.opted_out_pages.remove(number)
        self.opted_in_at[number] = now


_SENDER_ID = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9]{1,11}$")


def check_sender_id(value: str, name: str) -> str:
    """AWS: 1-11 alphanumeric characters, at least one letter, no spaces."""
    if not _SENDER_ID.match(value):
        raise invalid_parameter(
            f"Invalid parameter: {name} Reason: a sender ID has 1 to 11 letters and digits, at "
            "least one of them a letter"
        )
    return value


__all__ = [
    "ACCOUNT_ID",
    "PAGE_SIZE",
    "REGION",
    "ArnParts",
    "Endpoint",
    "EndpointChange",
    "OrderedPages",
    "PlatformApplication",
    "SnsError",
    "SnsModel",
    "SqsTarget",
]
