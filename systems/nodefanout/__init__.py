"""nodefanout: a push fan-out system in JavaScript (Node.js, the AWS SDK for JavaScript v3), the
third system under test, built unlike the reference and minifanout.

Three processes (``nodefanout.mjs api|router|sender``): an HTTP API that puts broadcasts on an
SQS events queue; a router that writes one job per recipient (the author's audience, kept in
DynamoDB) to a jobs queue; a sender that resolves each recipient's devices when it sends,
applies consent (default deny) and quiet hours in the member's IANA zone, claims each device in
a dedup Redis (fail closed) and sends over APNs (HTTP/2, TLS, ES256 provider tokens) or FCM HTTP
v1 (OAuth2, two sender projects chosen by crc32 of the member id). Push only: no inbox, no
erasure. The Python here is what the harness needs of it: ``driver`` (its API in the verifier's
terms) and ``launch`` (start the three for the tests and by hand). See README.md.
"""
