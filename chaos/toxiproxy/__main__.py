"""``python -m chaos.toxiproxy --host 127.0.0.1 --port 8474``: the Toxiproxy-compatible proxy
server in the foreground (``toxiproxy listening on http://HOST:PORT`` when ready; exit 2 when
the port is taken; SIGTERM/SIGINT close every proxy and exit 0)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from chaos.toxiproxy.api import DEFAULT_PORT, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.toxiproxy",
        description="TCP fault proxy with Toxiproxy 2.x's HTTP API",
    )
    parser.add_argument("--host", default="127.0.0.1", help="API address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="API port (0: any free)")
    parser.add_argument(
        "--config", type=Path, help="JSON array of proxies to create at start (like -config)"
    )
    parser.add_argument("--seed", type=int, help="seed for jitter, slicing and toxicity")
    parser.add_argument("--verbose", action="store_true", help="log proxies and connections")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    return serve(args.host, args.port, config=args.config, seed=args.seed)


if __name__ == "__main__":
    sys.exit(main())
