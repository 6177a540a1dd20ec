"""Progress lines: one live status line on a terminal, plain lines anywhere else."""

from __future__ import annotations

import io

from harness.run.runner import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_every_line_plain():
    stream = io.StringIO()
    progress = Progress(stream=stream)
    progress("stack", "ready")
    progress("wait", "10/20 expected deliveries seen")
    progress("wait", "20/20 expected deliveries seen")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in stream.getvalue()
    assert lines[1].endswith("wait      10/20 expected deliveries seen")


def test_a_terminal_rewrites_the_status_line_in_place():
    stream = Terminal()
    progress = Progress(stream=stream)
    progress("stack", "ready")
    progress("locust", "5.0s users=8 injected=5")
    progress("wait", "10/20 expected deliveries seen")
    progress("collect", "done")
    text = stream.getvalue()
    # Status updates overwrite each other (carriage return, clear line), never a newline...
    assert text.count("\r\033[K") == 3
    status = text.split("ready\n", 1)[1].split("\n")[0]
    assert "injected=5" in status and "10/20" in status
    # ...and the next plain line starts on a cleared line.
    assert text.rstrip().endswith("collect   done")
