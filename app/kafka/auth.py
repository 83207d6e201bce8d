"""How every role authenticates to Kafka and encrypts its connections: TLS, SASL PLAIN and
SCRAM, read once from the environment (``KAFKA_SECURITY_PROTOCOL`` and friends;
docs/configuration.md lists them).

:class:`KafkaAuth` turns into the options of each client library: aiokafka's keyword
arguments (:meth:`KafkaAuth.client_options`, also what Faust's transport is given) and the
``kafka.*`` options of Spark's Kafka connector (:meth:`KafkaAuth.spark_options`). The
password never appears in a repr, a log line or an error.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

#: name -> (default, description), merged into :data:`app.runtime.settings.ENV_DOCS`.
AUTH_ENV_DOCS: dict[str, tuple[str, str]] = {
    "KAFKA_SECURITY_PROTOCOL": (
        "PLAINTEXT",
        "How every role connects to Kafka: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.",
    ),
    "KAFKA_SASL_MECHANISM": ("PLAIN", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."),
    "KAFKA_SASL_USERNAME": ("", "SASL user name (required with SASL_PLAINTEXT and SASL_SSL)."),
    "KAFKA_SASL_PASSWORD": ("", "SASL password (required with SASL_*; never logged)."),
    "KAFKA_SSL_CAFILE": (
        "",
        "PEM file of the CA certificates that sign the brokers' certificates (SSL, SASL_SSL); "
        "unset: the system's trust store.",
    ),
    "KAFKA_SSL_CERTFILE": ("", "PEM client certificate, for clusters that require mutual TLS."),
    "KAFKA_SSL_KEYFILE": ("", "PEM private key of KAFKA_SSL_CERTFILE."),
    "KAFKA_SSL_CHECK_HOSTNAME": ("true", "Check that a broker's certificate names the host dialled."),
}


def _env(env: Mapping[str, str], name: str) -> str:
    return env.get(name, AUTH_ENV_DOCS[name][0]).strip()


@dataclass(frozen=True)
class KafkaAuth:
    """A client's security settings; the default is plaintext without authentication."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "PLAIN"
    username: str = ""
    password: str = field(default="", repr=False)
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    check_hostname: bool = True

    @property
    def uses_ssl(self) -> bool:
        return self.protocol in {"SSL", "SASL_SSL"}

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KafkaAuth:
        """Parse and check the ``KAFKA_SECURITY_PROTOCOL``, ``KAFKA_SASL_*`` and ``KAFKA_SSL_*``
        variables; a :class:`ConfigError` names the variable and what it expected."""
        protocol = _env(env, "KAFKA_SECURITY_PROTOCOL").upper()
        if protocol not in PROTOCOLS:
            msg = f"KAFKA_SECURITY_PROTOCOL={protocol!r}: expected one of {', '.join(PROTOCOLS)}"
            raise ConfigError(msg)
        mechanism = _env(env, "KAFKA_SASL_MECHANISM").upper()
        if mechanism not in MECHANISMS:
            msg = f"KAFKA_SASL_MECHANISM={mechanism!r}: expected one of {', '.join(MECHANISMS)}"
            raise ConfigError(msg)
        check = _env(env, "KAFKA_SSL_CHECK_HOSTNAME").lower()
        if check not in {"true", "false"}:
            msg = f"KAFKA_SSL_CHECK_HOSTNAME={check!r}: expected true or false"
            raise ConfigError(msg)
        auth = cls(
            protocol=protocol,
            mechanism=mechanism,
            username=_env(env, "KAFKA_SASL_USERNAME"),
            password=env.get("KAFKA_SASL_PASSWORD", ""),
            cafile=_env(env, "KAFKA_SSL_CAFILE"),
            certfile=_env(env, "KAFKA_SSL_CERTFILE"),
            keyfile=_env(env, "KAFKA_SSL_KEYFILE"),
            check_hostname=check == "true",
        )
        auth.check()
        return auth

    def check(self) -> None:
        """Refuse combinations no connection could use, naming the variable to fix."""
        if self.uses_sasl and not (self.username and self.password):
            msg = f"KAFKA_SECURITY_PROTOCOL={self.protocol} needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"
            raise ConfigError(msg)
        files = {"KAFKA_SSL_CAFILE": self.cafile, "KAFKA_SSL_CERTFILE": self.certfile}
        files["KAFKA_SSL_KEYFILE"] = self.keyfile
        for name, path in files.items():
            if path and not self.uses_ssl:
                msg = f"{name} is set but KAFKA_SECURITY_PROTOCOL={self.protocol} uses no TLS"
                raise ConfigError(msg)
            if path and not Path(path).is_file():
                msg = f"{name}={path!r}: no such file"
                raise ConfigError(msg)
        if bool(self.certfile) != bool(self.keyfile):
            msg = "KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE go together (mutual TLS needs both)"
            raise ConfigError(msg)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a client (None without TLS)."""
        if not self.uses_ssl:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.cafile or None)
        ctx.check_hostname = self.check_hostname
        if self.certfile:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        return ctx

    def client_options(self) -> dict[str, Any]:
        """aiokafka's keyword arguments for a producer, consumer, admin or bare client."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_ssl:
            options["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            options["sasl_mechanism"] = self.mechanism
            options["sasl_plain_username"] = self.username
            options["sasl_plain_password"] = self.password
        return options

    def spark_options(self) -> dict[str, str]:
        """The ``kafka.*`` options of Spark's Kafka connector (its Java client's settings)."""
        options = {"kafka.security.protocol": self.protocol}
        if self.uses_sasl:
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if self.mechanism == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            user, password = _jaas_quote(self.username), _jaas_quote(self.password)
            options["kafka.sasl.mechanism"] = self.mechanism
            options["kafka.sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
        if self.uses_ssl:
            if self.cafile:
                options["kafka.ssl.truststore.type"] = "PEM"
                options["kafka.ssl.truststore.location"] = self.cafile
            if self.certfile:  # the Java client takes a PEM key and chain inline
                options["kafka.ssl.keystore.type"] = "PEM"
                options["kafka.ssl.keystore.certificate.chain"] = Path(self.certfile).read_text()
                options["kafka.ssl.keystore.key"] = Path(self.keyfile).read_text()
            if not self.check_hostname:
                options["kafka.ssl.endpoint.identification.algorithm"] = ""
        return options


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


_JAAS_VALUE = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


def from_spark_options(options: Mapping[str, str]) -> KafkaAuth:
    """The :class:`KafkaAuth` that Spark's Kafka options (``kafka.security.protocol``,
    ``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config``, a PEM ``kafka.ssl.truststore.*``)
    describe: the inverse of :meth:`KafkaAuth.spark_options`, for the project's own source.
    Keys are lower-case. A :class:`ConfigError` names an option it cannot honour."""
    protocol = options.get("kafka.security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        msg = f"option 'kafka.security.protocol' must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
        raise ConfigError(msg)
    if any(k.startswith("kafka.ssl.keystore.") for k in options):
        msg = "client certificates (kafka.ssl.keystore.*) need format 'kafka', not 'kafka_py'"
        raise ConfigError(msg)
    store_type = options.get("kafka.ssl.truststore.type", "PEM").strip().upper()
    if "kafka.ssl.truststore.location" in options and store_type != "PEM":
        msg = "option 'kafka.ssl.truststore.type' must be PEM for format 'kafka_py'"
        raise ConfigError(msg)
    found = dict(_JAAS_VALUE.findall(options.get("kafka.sasl.jaas.config", "")))
    unescape = lambda v: re.sub(r"\\(.)", r"\1", v)  # noqa: E731
    auth = KafkaAuth(
        protocol=protocol,
        mechanism=options.get("kafka.sasl.mechanism", "PLAIN").strip().upper(),
        username=unescape(found.get("username", "")),
        password=unescape(found.get("password", "")),
        cafile=options.get("kafka.ssl.truststore.location", "").strip(),
        check_hostname=options.get("kafka.ssl.endpoint.identification.algorithm", "https") != "",
    )
    if auth.mechanism not in MECHANISMS:
        msg = f"option 'kafka.sasl.mechanism' must be one of {', '.join(MECHANISMS)}, got {auth.mechanism!r}"
        raise ConfigError(msg)
    if auth.uses_sasl and not (auth.username and auth.password):
        msg = 'option \'kafka.sasl.jaas.config\' must carry username="..." and password="..."'
        raise ConfigError(msg)
    return auth
