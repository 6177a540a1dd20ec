"""SNS-compatible local endpoint that really delivers: mobile push to the APNs and FCM
simulators, SMS to a ledger, topic notifications to SQS.

* :mod:`emulators.sns.model`: applications, endpoints, topics, SMS settings; pure;
* :mod:`emulators.sns.messages`: what a Publish means for each provider, and what the provider's
  answer means; pure;
* :mod:`emulators.sns.credentials`: platform credentials (APNs token/certificate, FCM v1);
* :mod:`emulators.sns.protocol`: the AWS query protocol (form-encoded requests, XML answers);
* :mod:`emulators.sns.service`: Publish and its consequences (delivery, ledgers, events);
* :mod:`emulators.sns.delivery`: persistent HTTP/2 pools to the providers, SQS sends;
* :mod:`emulators.sns.faults`: the throttle fault and :class:`SnsControl`, the control client;
* :mod:`emulators.sns.server`: ``python -m emulators.sns --port N``;
* :mod:`emulators.sns.processes`: start it as a subprocess and wait until it answers.
"""
