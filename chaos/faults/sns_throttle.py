"""sns-throttle: SNS throttles Publish (``Throttling``, "Rate exceeded", HTTP 400, as AWS
answers a Publish over the account's rate); nothing throttled reaches a provider.

Params: ``p`` (probability per Publish) and/or ``rate`` (publishes per second the endpoint takes
before it throttles), ``targets`` (platform application or topic ARNs; default every Publish),
``seed``. A publisher must retry each throttled publish later, losing none and sending none
twice."""

from __future__ import annotations

from chaos.faults import fault
from chaos.faults.adapters import sns_fault

start = fault(
    "sns-throttle",
    "SNS throttles Publish (Throttling, Rate exceeded): every throttled publish must be retried",
    needs="sns_url",
    needs_what="SNS endpoint (the harness's own: push_transport sns, or a target's sns_listen)",
)(sns_fault("throttle"))
