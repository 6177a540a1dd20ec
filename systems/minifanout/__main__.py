"""``python -m systems.minifanout --redis URL --sqs-endpoint URL --apns-url URL --fcm-url URL
--port N [--dedup-redis URL] [--apns-ca-file F] [--bugs a,b] [--role both|api|consumer]``

``--role both`` (the default) runs the API and the consumer in one process; ``api`` and
``consumer`` run one each (two commands), so a crash experiment can kill the consumer alone.
Exit 0 after SIGTERM/SIGINT, 2 for a bad command line or a taken port, 1 when the queues cannot
be created. What the process does: :mod:`systems.minifanout.process`.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from systems.minifanout.config import BadConfig, config_from_args, parser


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    try:
        config = config_from_args(args)
    except BadConfig as exc:
        cli.error(str(exc))  # exits 2
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    # One line per provider request would drown the consumer's own lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # Imported only now: a bad command line is refused before aiohttp, boto3 and redis load.
    from systems.minifanout.process import serve

    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
