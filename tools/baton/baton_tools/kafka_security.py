"""A secured development broker, set up as a platform team secures a cluster: SASL_SSL with SCRAM-SHA-512
on the client port, mutual TLS on a second port, and Kafka's StandardAuthorizer with no access for a
principal without an ACL. Each service of the suite gets its own SCRAM user and client certificate,
named as `baton_platform.acls` names it, and the suite's ACL table is applied by the super user `admin`.

`LocalKafka(security=BusSecurity.create(folder, identities))` runs it; `client_env` gives a service
process its identity through BATON_KAFKA__* variables, `client_options` the same for a test's client.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
# The variable a service reads its SCRAM password from (config kafka.sasl_password_env).
PASSWORD_ENV = "BATON_KAFKA_PASSWORD"


@dataclass
class BusSecurity:
    """Certificates and SCRAM credentials of one secured broker, kept in `folder`."""

    folder: Path
    passwords: dict[str, str]

    @classmethod
    def create(cls, folder: Path, identities: list[str]) -> BusSecurity:
        """A CA, the broker's certificate (for 127.0.0.1), and a SCRAM password and client certificate for
        `admin` and each identity. A folder made before is reused, so a restarted broker keeps its users."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        saved = folder / "passwords.json"
        passwords = json.loads(saved.read_text()) if saved.exists() else {}
        names = [ADMIN, *identities]
        missing = [n for n in names if n not in passwords]
        passwords.update({n: secrets.token_urlsafe(18) for n in missing})
        saved.write_text(json.dumps(passwords))
        saved.chmod(0o600)
        if not (folder / "ca.pem").exists():
            _write_pki(folder, names)
        elif any(not (folder / f"{n}.crt").exists() for n in names):
            _write_client_certs(folder, [n for n in names if not (folder / f"{n}.crt").exists()])
        return cls(folder, passwords)

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    def broker_properties(self, sasl_port: int, tls_port: int, controller_port: int) -> dict[str, str]:
        """server.properties for one combined broker+controller: clients on SASL_SSL and SSL (mutual TLS),
        the controller on loopback plaintext (the only place the ANONYMOUS super user can come from)."""
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN}" '
                f'password="{self.passwords[ADMIN]}";')
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{sasl_port},SSL://127.0.0.1:{tls_port},"
                         f"CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{sasl_port},SSL://127.0.0.1:{tls_port}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.folder / "broker.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "listener.name.ssl.ssl.client.auth": "required",
            # A certificate's principal is its common name: CN=baton-gateway is User:baton-gateway.
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)(,.*)?$/$1/,DEFAULT",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN};User:ANONYMOUS",
        }

    def format_args(self) -> list[str]:
        """StorageTool arguments that create the SCRAM users when the storage is formatted (KRaft)."""
        return [arg for name, password in self.passwords.items()
                for arg in ("--add-scram", f"{MECHANISM}=[name={name},password={password}]")]

    def client_env(self, identity: str, bootstrap: str) -> dict[str, str]:
        """The variables that make a service process connect over SASL_SSL as `identity`."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "BATON_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
            "BATON_KAFKA__SASL_MECHANISM": MECHANISM,
            "BATON_KAFKA__SASL_USERNAME": identity,
            "BATON_KAFKA__SASL_PASSWORD_ENV": PASSWORD_ENV,
            PASSWORD_ENV: self.passwords[identity],
            "BATON_KAFKA__SSL_CAFILE": str(self.ca_file),
        }

    def client_options(self, identity: str, bootstrap: str, *, mutual_tls: bool = False) -> dict:
        """aiokafka options for `identity`: SCRAM over TLS, or its client certificate (mutual TLS)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if mutual_tls:
            context.load_cert_chain(str(self.folder / f"{identity}.crt"), str(self.folder / f"{identity}.key"))
            return {"bootstrap_servers": bootstrap, "security_protocol": "SSL", "ssl_context": context}
        return {"bootstrap_servers": bootstrap, "security_protocol": "SASL_SSL", "ssl_context": context,
                "sasl_mechanism": MECHANISM, "sasl_plain_username": identity,
                "sasl_plain_password": self.passwords[identity]}


def _write_pki(folder: Path, names: list[str]) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509 import IPAddress

    key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("baton-dev-ca", key, key.public_key(), None, ca=True)
    _write(folder / "ca.key", _pem_key(key))
    _write(folder / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker = _certificate("127.0.0.1", broker_key, broker_key.public_key(), (ca, key),
                          alt_ips=[IPAddress(ipaddress.ip_address("127.0.0.1"))])
    # Kafka's PEM key store: the private key (PKCS#8), then the certificate chain, in one file.
    _write(folder / "broker.pem", _pem_key(broker_key) + broker.public_bytes(serialization.Encoding.PEM)
           + ca.public_bytes(serialization.Encoding.PEM))
    _write_client_certs(folder, names)


def _write_client_certs(folder: Path, names: list[str]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), None)
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(name, key, key.public_key(), (ca, ca_key))
        _write(folder / f"{name}.key", _pem_key(key))
        _write(folder / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))


def _certificate(common_name: str, key, public_key, issuer, *, ca: bool = False, alt_ips=()):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer[0].subject if issuer else subject)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=365))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if alt_ips:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(alt_ips)), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


async def wait_until_granted(options: dict, topic: str, timeout: float = 30) -> None:
    """Wait until the principal of `options` may describe `topic`: a broker applies new ACLs from its
    metadata log a moment after CreateAcls returns."""
    import asyncio
    import time

    from aiokafka.admin import AIOKafkaAdminClient

    deadline = time.monotonic() + timeout
    admin = AIOKafkaAdminClient(**options)
    await admin.start()
    try:
        while True:
            (described,) = await admin.describe_topics([topic])
            if described.get("error_code") == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} still not granted after {timeout:g} s")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()
