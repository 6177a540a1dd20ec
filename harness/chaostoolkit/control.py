"""The harness's Chaos Toolkit control: declared under the experiment's ``controls``, it hands the
experiment to the run the first method step starts, and stops that run, whatever happened, when
Chaos Toolkit cleans its controls up (also after an interruption that skipped the rollbacks).

Options, from the control's ``arguments`` or the environment (which wins, for one invocation):
``out`` / ``HARNESS_OUT`` (default ``reports``), ``seed`` / ``HARNESS_SEED``, ``reports`` /
``HARNESS_NO_REPORT=1``, ``target`` / ``HARNESS_TARGET``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.chaostoolkit.session import SESSION


def run_options(
    env: dict[str, str],
    out: str | None = None,
    seed: int | None = None,
    reports: bool = True,
    target: str | None = None,
) -> dict[str, Any]:
    """The background run's options: the environment's over the control's arguments."""
    seed_text = env.get("HARNESS_SEED")
    return {
        "out": Path(env.get("HARNESS_OUT") or out or "reports"),
        "seed": int(seed_text) if seed_text else seed,
        "reports": reports and env.get("HARNESS_NO_REPORT", "") not in ("1", "true", "yes"),
        "target": env.get("HARNESS_TARGET") or target,
    }


def configure_control(
    experiment: dict[str, Any],
    out: str | None = None,
    seed: int | None = None,
    reports: bool = True,
    target: str | None = None,
    **_: Any,
) -> None:
    SESSION.configure(experiment, **run_options(dict(os.environ), out, seed, reports, target))


def cleanup_control() -> None:
    SESSION.cleanup()
