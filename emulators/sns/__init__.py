"""SNS-compatible local endpoint that really delivers: mobile push to the APNs and FCM
simulators, SMS to a ledger, topic notifications to SQS queues, loopback HTTP/S endpoints,
phones and devices.

* :mod:`emulators.sns.common`: the account, ARNs, listing pages; pure;
* :mod:`emulators.sns.model`: one region's applications, endpoints, SMS settings; pure;
* :mod:`emulators.sns.topics`: topics and their subscriptions, confirmation tokens, FIFO
  deduplication; pure;
* :mod:`emulators.sns.subscriptions`: a subscription, and the checks of its endpoint and
  attributes; pure;
* :mod:`emulators.sns.filter_policy`: subscription filter policies, checked and matched; pure;
* :mod:`emulators.sns.batch`: PublishBatch's own rules; pure;
* :mod:`emulators.sns.messages`: what a Publish means for each provider, and what the provider's
  answer means; pure;
* :mod:`emulators.sns.credentials`: platform credentials (APNs token/certificate, FCM v1);
* :mod:`emulators.sns.query`: the query protocol's encoding (form fields in, XML out, region);
* :mod:`emulators.sns.protocol`: the AWS query protocol (form-encoded requests, XML answers);
* :mod:`emulators.sns.topic_api`: its topic operations;
* :mod:`emulators.sns.service`: Publish and its consequences (delivery, ledgers, events);
* :mod:`emulators.sns.fanout`: a topic's messages to its subscriptions, and confirmations;
* :mod:`emulators.sns.notifications`: the signed JSON documents SNS delivers;
* :mod:`emulators.sns.delivery`: persistent HTTP/2 pools to the providers, SQS sends;
* :mod:`emulators.sns.sigv4`: the SigV4 signature of those SQS sends (the queue's region);
* :mod:`emulators.sns.http_delivery`: POSTs to HTTP/S subscriptions, loopback only;
* :mod:`emulators.sns.faults`: the throttle fault and :class:`SnsControl`, the control client;
* :mod:`emulators.sns.server`: ``python -m emulators.sns --port N``;
* :mod:`emulators.sns.processes`: start it as a subprocess and wait until it answers.
"""
