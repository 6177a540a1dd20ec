"""Start nodefanout's three processes (api, router, sender) pointed at given addresses, each a
``node`` process with its own pid file, stdout and log: for the tests, and by hand.

``python -m systems.nodefanout.launch --help``. Each role also starts alone with the command
line :func:`role_argv` builds (the README shows them); this only saves typing them. Imports
nothing of the harness: nodefanout stands alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

ROLES = ("api", "router", "sender")
ROOT = Path(__file__).resolve().parents[2]
ENTRY = Path(__file__).with_name("nodefanout.mjs")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Settings:
    """Where one deployment of nodefanout finds everything it talks to."""

    prefix: str
    api_port: int
    sqs_endpoint: str
    dynamodb_endpoint: str
    dedup_redis: str  # redis://host:port/0 (the harness's fault proxy, in a harness environment)
    apns_url: str  # https://host:port (TLS, trusting apns_ca) or http:// (h2c)
    apns_key: Path  # the team's .p8 (PKCS#8 P-256) signing key
    fcm_url: str
    fcm_credentials: Path  # a service-account JSON whose token_uri is the OAuth token endpoint
    apns_ca: Path | None = None
    apns_key_id: str = "NPKEY00001"
    apns_team_id: str = "NPTEAM0001"
    apns_topic: str = "com.example.nodefanout"
    fcm_projects: tuple[str, ...] = ("np-0", "np-1")
    region: str = "us-east-1"
    visibility_timeout_s: int = 30
    sender_loops: int = 4
    dedup_lease_s: int = 30


def node() -> str:
    found = shutil.which("node")
    if found is None:
        raise RuntimeError("node is not on PATH (nodefanout needs Node.js 20 or later)")
    return found


def role_argv(
    role: str,
    settings: Settings,
    *,
    bugs: Sequence[str] = (),
    pid_file: Path | None = None,
    portable: bool = False,
) -> list[str]:
    """The command line that starts ``role`` alone (``portable``: ``node`` from PATH and the
    entry point relative to the checkout, as a target file's hooks write it)."""
    if role not in ROLES:
        raise ValueError(f"role is one of {', '.join(ROLES)}, not {role!r}")
    entry = str(ENTRY.relative_to(ROOT)) if portable else str(ENTRY)
    argv = ["node" if portable else node(), entry, role]
    argv += ["--prefix", settings.prefix, "--region", settings.region]
    argv += ["--sqs-endpoint", settings.sqs_endpoint]
    argv += ["--dynamodb-endpoint", settings.dynamodb_endpoint]
    if pid_file is not None:
        argv += ["--pid-file", str(pid_file)]
    if bugs:
        argv += ["--bugs", ",".join(bugs)]
    if role == "api":
        argv += ["--port", str(settings.api_port)]
    if role == "sender":
        argv += [
            "--dedup-redis", settings.dedup_redis,
            "--apns-url", settings.apns_url,
            "--apns-key", str(settings.apns_key),
            "--apns-key-id", settings.apns_key_id,
            "--apns-team-id", settings.apns_team_id,
            "--apns-topic", settings.apns_topic,
            "--fcm-url", settings.fcm_url,
            "--fcm-credentials", str(settings.fcm_credentials),
            "--fcm-projects", ",".join(settings.fcm_projects),
            "--visibility-timeout", str(settings.visibility_timeout_s),
            "--loops", str(settings.sender_loops),
            "--dedup-lease", str(settings.dedup_lease_s),
        ]  # fmt: skip
        if settings.apns_ca is not None:
            argv += ["--apns-ca", str(settings.apns_ca)]
    return argv


def sender_hooks(settings: Settings, run_dir: Path) -> dict[str, str]:
    """A target file's ``processes.push-consumer``: shell commands (``sh -c``, from the
    checkout's root) that kill, start, pause and resume the sender through its pid file. The
    start returns at once, the sender left running under nohup with its log in ``run_dir``."""
    pid = run_dir / "sender.pid"
    argv = role_argv("sender", settings, pid_file=pid, portable=True)
    start = (
        f"mkdir -p {shlex.quote(str(run_dir))} && "
        "AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-testing} "
        "AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-testing} "
        f"nohup {shlex.join(argv)} >> {shlex.quote(str(run_dir / 'sender.log'))} 2>&1 &"
    )
    at = shlex.quote(str(pid))
    return {
        "kill": f"kill -9 $(cat {at})",
        "start": start,
        "pause": f"kill -STOP $(cat {at})",
        "resume": f"kill -CONT $(cat {at})",
    }


def node_env() -> dict[str, str]:
    """The environment for the node processes: the SDK's credentials from AWS_* (``testing``
    when unset: the local endpoints accept anything, and the SDK would otherwise go looking for
    an instance profile)."""
    env = dict(os.environ)
    env.setdefault("AWS_ACCESS_KEY_ID", "testing")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    return env


def write_apns_key(path: Path) -> Path:
    """A fresh APNs signing key: P-256, PKCS#8 PEM, as Apple's .p8 files are."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pem)
    path.chmod(0o600)
    return path


def write_fcm_credentials(path: Path, token_uri: str, project_id: str = "np-0") -> Path:
    """A service-account key file (fresh RSA key) whose token_uri is ``token_uri``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    info = {
        "type": "service_account",
        "project_id": project_id,
        "private_key_id": secrets.token_hex(20),
        "private_key": pem,
        "client_email": f"nodefanout@{project_id}.iam.gserviceaccount.com",
        "token_uri": token_uri,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2))
    path.chmod(0o600)
    return path


@dataclass
class RoleProcess:
    """One running role: its process, pid file, stdout and log (JSON lines on stderr)."""

    role: str
    proc: subprocess.Popen[bytes]
    pid_file: Path
    out: Path
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def log_lines(self) -> list[dict[str, object]]:
        """The log's JSON lines (anything else, e.g. a crash trace, is left out)."""
        lines = []
        for line in self.log_text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        return lines

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (and SIGCONT, in case it was paused), then SIGKILL after ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.send_signal(signal.SIGCONT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        return self.proc.returncode


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by whoever adopted it, does
    not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: signal 0 is all there is
    return state != "Z"


def stop_pid(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop a role this process did not start (a sender a target's start hook left running
    under nohup): SIGTERM and SIGCONT, then SIGKILL after ``timeout_s``; returns once it is
    gone (True), or False if it outlived the SIGKILL too. Waiting matters: a next deployment
    started beside a sender still finishing would share its queues with it."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
    for sig in (None, signal.SIGKILL):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return True
            time.sleep(0.05)  # polling another process's end, bounded by the deadline
    return not _alive(pid)


def start_role(
    role: str,
    settings: Settings,
    run_dir: Path,
    *,
    bugs: Sequence[str] = (),
    timeout_s: float = START_TIMEOUT_S,
    tag: str = "",
) -> RoleProcess:
    """Start ``role`` and wait (bounded) for its ready line; RuntimeError with its log if it
    exits or stays silent."""
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"{role}{tag}"
    pid_file, out, log = (run_dir / f"{name}.{ext}" for ext in ("pid", "out", "log"))
    argv = role_argv(role, settings, bugs=bugs, pid_file=pid_file)
    with open(out, "ab") as stdout, open(log, "ab") as stderr:
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=stdout, stderr=stderr, env=node_env(), start_new_session=True
        )
    started = RoleProcess(role, proc, pid_file, out, log)
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while f"nodefanout {role} ready" not in out.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            started.stop()
            raise RuntimeError(
                f"nodefanout {role} did not start (exit {proc.returncode}): "
                + log.read_text(errors="replace")[-2000:]
            )
        time.sleep(delay)  # polling a file for a condition, bounded by the deadline
        delay = min(delay * 2, 0.2)
    return started


@contextmanager
def launched(
    settings: Settings,
    run_dir: Path,
    *,
    bugs: Sequence[str] = (),
    roles: Sequence[str] = ROLES,
) -> Iterator[dict[str, RoleProcess]]:
    """The roles running (all three by default); every one stopped on the way out, whatever
    happened."""
    with ExitStack() as stack:
        running: dict[str, RoleProcess] = {}
        for role in roles:
            running[role] = start_role(role, settings, run_dir, bugs=bugs)
            stack.callback(running[role].stop)
        yield running


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m systems.nodefanout.launch",
        description="Start nodefanout's api, router and sender; stop them on Ctrl-C.",
    )
    p.add_argument("--prefix", default="np")
    p.add_argument("--api-port", type=int, required=True)
    p.add_argument("--sqs-endpoint", required=True)
    p.add_argument("--dynamodb-endpoint", required=True)
    p.add_argument("--dedup-redis", required=True, help="redis://host:port/0")
    p.add_argument("--apns-url", required=True)
    p.add_argument("--apns-ca", type=Path)
    p.add_argument("--apns-key", type=Path, help="a .p8 key (default: a fresh one in --run-dir)")
    p.add_argument("--fcm-url", required=True)
    p.add_argument(
        "--fcm-credentials",
        type=Path,
        help="a service-account JSON (default: a fresh one whose token_uri is <fcm-url>/token)",
    )
    p.add_argument("--bugs", default="")
    p.add_argument("--run-dir", type=Path, default=Path(".nodefanout"))
    p.add_argument("--print-commands", action="store_true", help="print each role's command line")
    args = p.parse_args(argv)
    run_dir = args.run_dir.resolve()
    settings = Settings(
        prefix=args.prefix,
        api_port=args.api_port,
        sqs_endpoint=args.sqs_endpoint,
        dynamodb_endpoint=args.dynamodb_endpoint,
        dedup_redis=args.dedup_redis,
        apns_url=args.apns_url,
        apns_ca=args.apns_ca,
        apns_key=args.apns_key or write_apns_key(run_dir / "apns.p8"),
        fcm_url=args.fcm_url,
        fcm_credentials=args.fcm_credentials
        or write_fcm_credentials(run_dir / "fcm.json", args.fcm_url.rstrip("/") + "/token"),
    )
    bugs = [b for b in args.bugs.split(",") if b]
    if args.print_commands:
        for role in ROLES:
            pid_file = run_dir / f"{role}.pid"
            print(" ".join(role_argv(role, settings, bugs=bugs, pid_file=pid_file)))
        return 0
    # SIGTERM as Ctrl-C: the roles are stopped on the way out either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with launched(settings, run_dir, bugs=bugs) as running:
        for role, started in running.items():
            print(f"{role}: pid {started.proc.pid}, log {started.log}", flush=True)
        try:
            while all(r.proc.poll() is None for r in running.values()):
                time.sleep(1)  # waiting for Ctrl-C or a role to exit
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
