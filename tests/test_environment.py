"""`harness env`: a team's long-lived environment, up across runs, on its target file's
addresses, with an APNs TLS authority written once."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import run_cli

from emulators.ports import free_port

pytestmark = pytest.mark.integration


def _target(tmp_path: Path) -> tuple[Path, dict]:
    target = {
        "name": "team-push",
        "event_api": f"http://127.0.0.1:{free_port()}",
        "apns_listen": f"127.0.0.1:{free_port()}",
        "apns_tls": True,
        "fcm_listen": f"127.0.0.1:{free_port()}",
        "sqs_listen": f"127.0.0.1:{free_port()}",
        "dedup_redis": f"127.0.0.1:{free_port()}",
        "dedup_listen": f"127.0.0.1:{free_port()}",
        "proxies": {
            "datastore": {
                "listen": f"127.0.0.1:{free_port()}",
                "upstream": f"127.0.0.1:{free_port()}",
            }
        },  # fmt: skip
        "payload_ids": {"apns": {"notification_id": "n.id"}},
    }
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(target))
    return path, target


def test_env_up_serves_the_targets_addresses_until_down_and_keeps_its_ca(tmp_path):
    path, target = _target(tmp_path)
    env = {"HARNESS_ENV_DIR": str(tmp_path / "envs")}
    ca = tmp_path / "envs" / "team-push" / "tls" / "ca.pem"
    try:
        up = run_cli("env", "up", "--target", str(path), env=env, timeout=120)
        assert up.returncode == 0, up.stderr
        assert str(ca) in up.stdout and "/token" in up.stdout
        first_ca = ca.read_bytes()
        context = ssl.create_default_context(cafile=str(ca))
        apns = f"https://{target['apns_listen']}"
        with httpx.Client(http2=True, verify=context, timeout=10) as client:
            # The payload keys the target states are the simulator's from the start.
            assert client.get(f"{apns}/_sim/payload-ids").json()["notification_id"] == "n.id"
        sqs = f"http://{target['sqs_listen']}/_sqs/health"
        assert httpx.get(sqs, timeout=5).json()["ok"] is True
        proxies = httpx.get(f"http://{_toxiproxy(tmp_path)}/proxies", timeout=5).json()
        assert set(proxies) == {"dedup", "datastore"}
        assert proxies["datastore"]["listen"] == target["proxies"]["datastore"]["listen"]
        again = run_cli("env", "up", "--target", str(path), env=env, timeout=60)
        assert again.returncode == 2 and "already up" in again.stderr
        status = run_cli("env", "status", "--target", str(path), env=env, timeout=60)
        assert status.returncode == 0 and "running" in status.stdout
        down = run_cli("env", "down", "--target", str(path), env=env, timeout=60)
        assert down.returncode == 0 and "apns" in down.stdout
        with pytest.raises(httpx.HTTPError):
            httpx.get(sqs, timeout=2)
        assert run_cli("env", "status", "--target", str(path), env=env).returncode == 1
        # Up again: the same authority, so a client that trusts it keeps working.
        up = run_cli("env", "up", "--target", str(path), env=env, timeout=120)
        assert up.returncode == 0, up.stderr
        assert ca.read_bytes() == first_ca
    finally:
        run_cli("env", "down", "--target", str(path), env=env, timeout=60)


def _toxiproxy(tmp_path: Path) -> str:
    info = json.loads((tmp_path / "envs" / "team-push" / "env.json").read_text())
    return info["parts"]["toxiproxy"]["url"].removeprefix("http://")


def test_env_with_a_bad_target_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    result = run_cli("env", "up", "--target", str(bad))
    assert result.returncode == 2 and "event_api is required" in result.stderr
