"""SQS-compatible local endpoint (AWS JSON 1.0, Standard and FIFO queues) with fault injection.

* :mod:`emulators.sqs.model`: queues and messages, pure (O(log n) per call);
* :mod:`emulators.sqs.protocol`: the JSON 1.0 protocol and AWS's error shapes;
* :mod:`emulators.sqs.faults`: fault state and :class:`SqsFaultControl`, the chaos layer's client;
* :mod:`emulators.sqs.server`: ``python -m emulators.sqs --port N``;
* :mod:`emulators.sqs.processes`: start it (or moto) as a subprocess and wait until it answers.
"""
