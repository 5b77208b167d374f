"""What a user's training image sees: our import names cannot be shadowed, and the CLI makes certificates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cryptography import x509

BIN = Path(sys.executable).parent


def test_a_users_launcher_py_and_certs_folder_do_not_shadow_ours(tmp_path):
    (tmp_path / "launcher.py").write_text("raise SystemExit('the user launcher was imported')\n")
    (tmp_path / "webhook.py").write_text("raise SystemExit('the user webhook was imported')\n")
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "__init__.py").write_text("raise SystemExit('the user certs were imported')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", "import trainhook.launcher.cli, trainhook.certs.build, "
                           "trainhook.webhook.server; print('ours')"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ours", done.stderr
    for script in ("trainhook-launch", "trainhook-webhook", "trainhook"):
        done = subprocess.run([str(BIN / script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0 and "usage:" in done.stdout, (script, done.stderr)


def test_certs_generate_writes_a_tls_secrets_files_with_ip_and_dns_sans(tmp_path):
    done = subprocess.run([str(BIN / "trainhook"), "certs", "generate", "--out", str(tmp_path / "out"),
                           "--san", "trainhook.trainhook.svc", "--san", "10.0.0.5"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    cert = x509.load_pem_x509_certificate((tmp_path / "out" / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["trainhook.trainhook.svc"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    ca = x509.load_pem_x509_certificate((tmp_path / "out" / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    assert (tmp_path / "out" / "tls.key").stat().st_mode & 0o077 == 0, "the key must not be readable by others"
