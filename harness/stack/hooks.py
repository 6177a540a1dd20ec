"""A team's process hooks: the shell commands its target file names per role (``processes:``),
as Jepsen gives every database kill, start and pause. The process faults (consumer-crash,
dedup-crash, consumer-pause, consumer-restart, invalidator-stop) act through them as they act on the harness's own stack.

Each command runs with ``sh -c`` on this machine, bounded in time; a command that fails is the
fault's failure, said with its exit code and the end of its output (the run records it)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

from chaos.faults import FaultError

HOOK_TIMEOUT_S = 60.0


class ShellProcesses:
    """:class:`chaos.faults.ProcessControl` over a target's ``processes:`` hooks."""

    def __init__(self, hooks: Mapping[str, Mapping[str, str]], timeout_s: float = HOOK_TIMEOUT_S):
        self.hooks = {role: dict(commands) for role, commands in hooks.items()}
        self.timeout_s = timeout_s

    def offers(self, part: str, action: str) -> bool:
        return action in self.hooks.get(part, {})

    def _run(self, part: str, action: str) -> None:
        command = self.hooks.get(part, {}).get(action)
        if command is None:
            raise FaultError(f"no {action} hook for {part} in the target's processes: map")
        try:
            done = subprocess.run(
                ["sh", "-c", command],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise FaultError(
                f"the {action} hook of {part} did not finish in {self.timeout_s:.0f} s: {command}"
            ) from exc
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise FaultError(
                f"the {action} hook of {part} exited {done.returncode}: {command}"
                + (f" ({' / '.join(tail)})" if tail else "")
            )

    def kill_part(self, part: str) -> None:
        self._run(part, "kill")

    def stop_part(self, part: str) -> None:
        self._run(part, "stop")

    def start_part(self, part: str) -> None:
        self._run(part, "start")

    def pause_part(self, part: str) -> None:
        self._run(part, "pause")

    def resume_part(self, part: str) -> None:
        self._run(part, "resume")
