"""A fault proxy for AWS JSON-protocol APIs (Kinesis first): forwards every request unchanged
and, on command, holds one Kinesis shard's records or delays chosen operations.

* :mod:`emulators.aws_proxy.faults`: the faults, their validation and the window log, pure;
* :mod:`emulators.aws_proxy.kinesis`: which shard an iterator reads, the holding answer, pure;
* :mod:`emulators.aws_proxy.server`: ``python -m emulators.aws_proxy --upstream URL --port N``.
"""
