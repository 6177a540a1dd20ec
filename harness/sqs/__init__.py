"""SQS-compatible local endpoint (AWS JSON 1.0, Standard queues) with fault injection.

* :mod:`harness.sqs.model`: queues and messages, pure (O(log n) per call);
* :mod:`harness.sqs.protocol`: the JSON 1.0 protocol and AWS's error shapes;
* :mod:`harness.sqs.faults`: fault state and :class:`SqsFaultControl`, the chaos layer's client;
* :mod:`harness.sqs.server`: ``python -m harness.sqs --port N``;
* :mod:`harness.sqs.processes`: start it (or moto) as a subprocess and wait until it answers.
"""
