"""One Kafka client configuration for every process: the security settings translated
once, for librdkafka (confluent-kafka: the agent, replay, record, the admin checks) and
for aiokafka (the notifier's consumer; Faust's credentials are built from the same
:class:`KafkaClient` in the worker).

>>> from ragwatch.config import Settings
>>> s = Settings.from_env({"RAGWATCH_KAFKA_BOOTSTRAP": "k1:9092,k2:9092"})
>>> KafkaClient.of(s).librdkafka()
{'bootstrap.servers': 'k1:9092,k2:9092', 'security.protocol': 'PLAINTEXT'}
>>> KafkaClient.of(s).aiokafka()
{'bootstrap_servers': ['k1:9092', 'k2:9092']}
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragwatch.errors import ConfigError

if TYPE_CHECKING:
    from ragwatch.config import Settings


@dataclass(frozen=True)
class KafkaClient:
    """Where the brokers are and how to authenticate (``RAGWATCH_KAFKA_*``)."""

    bootstrap: str
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    sasl_mechanism: str
    sasl_username: str
    sasl_password: str
    ssl_cafile: Path | None

    @classmethod
    def of(cls, settings: Settings) -> KafkaClient:
        return cls(
            bootstrap=settings.kafka_bootstrap,
            protocol=settings.kafka_security_protocol,
            sasl_mechanism=settings.kafka_sasl_mechanism,
            sasl_username=settings.kafka_sasl_username,
            sasl_password=settings.kafka_sasl_password.get(),
            ssl_cafile=settings.kafka_ssl_cafile,
        )

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a TLS protocol (the CA file if set), else None; a CA file
        that cannot be read is a ConfigError (one line)."""
        if not self.tls:
            return None
        cafile = str(self.ssl_cafile) if self.ssl_cafile else None
        try:
            return ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise self._cafile_error(getattr(exc, "strerror", None) or str(exc)) from None

    def _cafile_error(self, why: str) -> ConfigError:
        return ConfigError(f"RAGWATCH_KAFKA_SSL_CAFILE: cannot read {self.ssl_cafile}: {why}")

    def librdkafka(self) -> dict[str, Any]:
        """confluent-kafka options: the one place snake_case meets dotted keys."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": self.protocol,
        }
        if self.sasl:
            conf["sasl.mechanism"] = self.sasl_mechanism
            conf["sasl.username"] = self.sasl_username
            conf["sasl.password"] = self.sasl_password
        if self.ssl_cafile is not None:
            if not os.access(self.ssl_cafile, os.R_OK):  # librdkafka would say it much later
                raise self._cafile_error("no such file, or not readable")
            conf["ssl.ca.location"] = str(self.ssl_cafile)
        return conf

    def aiokafka(self) -> dict[str, Any]:
        """aiokafka client keyword arguments."""
        kw: dict[str, Any] = {"bootstrap_servers": self.bootstrap.split(",")}
        if self.protocol == "PLAINTEXT":
            return kw
        kw["security_protocol"] = self.protocol
        ctx = self.ssl_context()
        if ctx is not None:
            kw["ssl_context"] = ctx
        if self.sasl:
            kw["sasl_mechanism"] = self.sasl_mechanism
            kw["sasl_plain_username"] = self.sasl_username
            kw["sasl_plain_password"] = self.sasl_password
        return kw
