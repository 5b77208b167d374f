"""The certificates and kubeconfigs of the tests' Kubernetes: the control plane's (hack/cluster.py) and the node's
(hack/node.py), all signed by one CA made per start.

Apart from hack/cluster.py because this is what a reader looks for when a component is refused (who is the
client, which groups, which SANs, which file), and it is the same whether the control plane runs alone or under a
node; the processes that use the files are started there. The CA and the serving pairs come from the product's
own trainhook.certs.build; what is here is what only a cluster needs: client certificates whose CN is the
Kubernetes user and whose O entries are its groups, the ServiceAccount signing key, and kubeconfigs.

`cryptography` and trainhook.certs are imported inside the functions, so that `cluster.py down` and `env` (which
import this module through hack/cluster.py) run with any Python 3.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainhook.certs.build import KeyPair

APISERVER_SANS = ["127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default",
                  "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]


def build_client_pair(ca: KeyPair, user: str, groups: list[str], now: dt.datetime, days: int = 30) -> KeyPair:
    """A client certificate: CN is the Kubernetes user name, O entries its groups."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    from trainhook.certs.build import KeyPair
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
                        + [x509.NameAttribute(NameOID.COMMON_NAME, user)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def write_file(path: Path, data: bytes, private: bool = False) -> Path:
    """Write `data`; a private file (a key, a kubeconfig) is created 0600 before anything is written to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:
        path.touch(mode=0o600)
    path.write_bytes(data)
    return path


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig_dict(server: str, ca_pem: bytes, user: str, cert_pem: bytes | None = None,
                    key_pem: bytes | None = None, token: str | None = None) -> dict:
    creds = {"token": token} if token else {"client-certificate-data": _b64(cert_pem),
                                            "client-key-data": _b64(key_pem)}
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "trainhook",
        "clusters": [{"name": "trainhook", "cluster": {"server": server,
                                                       "certificate-authority-data": _b64(ca_pem)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "trainhook", "context": {"cluster": "trainhook", "user": user}}],
    }


def write_kubeconfig(path: Path, config: dict) -> Path:
    # JSON is YAML: kubectl and the Python client read it, and no YAML dependency is needed.
    return write_file(path, json.dumps(config, indent=1).encode(), private=True)


# ---- the control plane's --------------------------------------------------------------------------------------

@dataclass
class ControlPlaneFiles:
    """Where hack/cluster.py's components find their certificates, keys and kubeconfigs."""

    ca: Path
    ca_key: Path
    apiserver_cert: Path  # the serving certificate, then the CA (the chain clients see)
    apiserver_key: Path
    admin_cert: Path  # trainhook-admin, group system:masters: the tests' client
    admin_key: Path
    sa_key: Path  # signs ServiceAccount tokens (kube-controller-manager, kube-apiserver)
    sa_pub: Path  # checks them (kube-apiserver)
    kubeconfig: Path  # the admin's
    kcm_kubeconfig: Path
    sched_kubeconfig: Path


def write_control_plane_files(state_dir: Path, host: str, ca: KeyPair | None = None,
                              extra_sans: list[str] = ()) -> ControlPlaneFiles:
    """The CA (made when None), the API server's serving pair (APISERVER_SANS and `extra_sans`), the admin's,
    the controller manager's and the scheduler's client pairs as kubeconfigs for `host`, and the ServiceAccount
    key, under `state_dir` (certificates and keys in pki/)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from trainhook.certs.build import build_ca, build_serving_pair
    pki = state_dir / "pki"
    now = dt.datetime.now(dt.timezone.utc)
    ca = ca or build_ca("trainhook-k8s-ca", now)
    serving = build_serving_pair(ca, APISERVER_SANS + list(extra_sans), now, days=30)
    admin = build_client_pair(ca, "trainhook-admin", ["system:masters"], now)
    kcm = build_client_pair(ca, "system:kube-controller-manager", [], now)
    sched = build_client_pair(ca, "system:kube-scheduler", [], now)
    sa_key = ec.generate_private_key(ec.SECP256R1())
    return ControlPlaneFiles(
        ca=write_file(pki / "ca.crt", ca.cert_pem),
        ca_key=write_file(pki / "ca.key", ca.key_pem, private=True),
        apiserver_cert=write_file(pki / "apiserver.crt", serving.cert_pem + ca.cert_pem),
        apiserver_key=write_file(pki / "apiserver.key", serving.key_pem, private=True),
        admin_cert=write_file(pki / "admin.crt", admin.cert_pem),
        admin_key=write_file(pki / "admin.key", admin.key_pem, private=True),
        sa_key=write_file(pki / "sa.key", sa_key.private_bytes(serialization.Encoding.PEM,
                                                               serialization.PrivateFormat.PKCS8,
                                                               serialization.NoEncryption()), private=True),
        sa_pub=write_file(pki / "sa.pub", sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)),
        kubeconfig=write_kubeconfig(state_dir / "kubeconfig", kubeconfig_dict(
            host, ca.cert_pem, "trainhook-admin", admin.cert_pem, admin.key_pem)),
        kcm_kubeconfig=write_kubeconfig(state_dir / "kube-controller-manager.kubeconfig", kubeconfig_dict(
            host, ca.cert_pem, "system:kube-controller-manager", kcm.cert_pem, kcm.key_pem)),
        sched_kubeconfig=write_kubeconfig(state_dir / "kube-scheduler.kubeconfig", kubeconfig_dict(
            host, ca.cert_pem, "system:kube-scheduler", sched.cert_pem, sched.key_pem)),
    )


# ---- the node's (hack/node.py) --------------------------------------------------------------------------------

def write_node_files(ca: KeyPair, pki: Path, node_name: str, node_ip: str) -> dict[str, Path]:
    """Client certificates for the kubelet (system:node:<name>), kube-proxy and the API server's calls to the
    kubelet, the kubelet's serving pair, and the CA's certificate, in `pki`; by file name (`kubelet.crt`, ...)."""
    from trainhook.certs.build import build_serving_pair
    now = dt.datetime.now(dt.timezone.utc)
    files: dict[str, Path] = {}
    pairs = {
        "kubelet-client": build_client_pair(ca, f"system:node:{node_name}", ["system:nodes"], now),
        "kube-proxy": build_client_pair(ca, "system:kube-proxy", [], now),
        # Only the kubelet checks this one (x509 against the cluster CA, then AlwaysAllow): no group needed.
        "apiserver-kubelet-client": build_client_pair(ca, "kube-apiserver-kubelet-client", [], now),
        "kubelet": build_serving_pair(ca, [node_ip, node_name], now, days=30),
    }
    for name, pair in pairs.items():
        files[f"{name}.crt"] = write_file(pki / f"{name}.crt", pair.cert_pem)
        files[f"{name}.key"] = write_file(pki / f"{name}.key", pair.key_pem, private=True)
    files["ca.crt"] = write_file(pki / "ca.crt", ca.cert_pem)
    return files


def write_client_kubeconfig(path: Path, server: str, ca: KeyPair, pki: Path, pair_name: str, user: str) -> Path:
    """A kubeconfig for `user` with the client pair `pair_name` that write_node_files left in `pki`."""
    return write_kubeconfig(path, kubeconfig_dict(server, ca.cert_pem, user, (pki / f"{pair_name}.crt").read_bytes(),
                                                  (pki / f"{pair_name}.key").read_bytes()))
