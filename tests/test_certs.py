"""The simulators' TLS material (emulators/certs.py): processes that share a directory and start
together end up trusting one CA."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from emulators.certs import load_or_generate_tls_material


def _load(directory: str) -> bytes:
    return load_or_generate_tls_material(Path(directory)).ca_cert.read_bytes()


def test_simulators_starting_together_share_one_ca(tmp_path: Path) -> None:
    # A stack starts APNs and FCM at once on one directory: each must find the CA the other
    # made, not overwrite it (a reader in between saw an empty ca.pem).
    with multiprocessing.get_context("fork").Pool(4) as pool:
        cas = pool.map(_load, [str(tmp_path)] * 8)
    assert all(ca.startswith(b"-----BEGIN CERTIFICATE-----") for ca in cas)
    assert len(set(cas)) == 1
    assert (tmp_path / "ca.pem").read_bytes() == cas[0]
