"""The in-process server's configuration: the real server's settings, defaults and
load-time checks (``src/config.rs``), and its TOML layout.

Times are integer milliseconds, as in the real server's config file.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from sepp_lite._sending import DEFAULT_BATCH_JOBS, MAX_MESSAGE_BYTES
from sepp_lite.testing._names import queue_name_error, rust_debug

__all__ = ["ConfigError", "Limits", "QueueConfig", "ServerConfig"]

log = logging.getLogger(__name__)

_U32 = 0xFFFF_FFFF
_BACKOFFS = ("none", "exponential")

PemSource = Union[bytes, str, "os.PathLike[str]"]
"""PEM text as ``bytes`` (or a ``str`` starting with ``-----BEGIN``), else a file path."""


class ConfigError(ValueError):
    """A configuration the real server would refuse to start with."""


def _tuple_or_none(value: Optional[Sequence[str]], name: str) -> Optional[tuple[str, ...]]:
    if value is None:
        return None
    if isinstance(value, str):
        raise ConfigError(f"{name} must be a list of strings, not a string")
    items = tuple(value)
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{name} items must be strings, got {item!r}")
    return items


def _check_int(value: object, name: str, minimum: int = 0, maximum: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name}: must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}: must be at most {maximum}, got {value}")


@dataclass(frozen=True)
class Limits:
    """Every ``[limits]`` key of the real server, with its defaults (ms for times).

    ``max_queue_depth=None`` means unlimited; ``allowed_encodings=None`` accepts any
    encoding and ``[]`` rejects every payload.
    """

    max_lease_duration_ms: int = 300_000
    default_max_attempts: int = 3
    max_attempts_ceiling: int = 100
    default_priority: int = 0
    retry_delay_ms: int = 0
    retry_backoff: str = "none"
    retry_delay_max_ms: int = 3_600_000
    max_reserve_batch: int = 256
    max_reserve_queues: int = 32
    max_wait_timeout_ms: int = 300_000
    max_enqueue_batch: int = DEFAULT_BATCH_JOBS
    max_queue_depth: Optional[int] = None
    max_payload_bytes: int = 1_048_576
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_custom_entries: int = 64
    max_custom_total_bytes: int = 16_384
    max_custom_key_bytes: int = 256
    max_queue_name_bytes: int = 512
    max_job_type_bytes: int = 256
    max_idempotency_key_bytes: int = 256
    max_schedule_horizon_ms: int = 2_592_000_000
    allowed_encodings: Optional[Sequence[str]] = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "allowed_encodings",
            _tuple_or_none(self.allowed_encodings, "limits.allowed_encodings"),
        )
        for name in (
            "max_reserve_batch",
            "max_reserve_queues",
            "max_wait_timeout_ms",
            "max_enqueue_batch",
            "max_message_bytes",
            "max_job_type_bytes",
            "max_idempotency_key_bytes",
        ):
            _check_int(getattr(self, name), f"limits.{name}", 1)
        _check_int(self.max_queue_name_bytes, "limits.max_queue_name_bytes", 1, 65_535)
        if self.max_queue_depth is not None:
            _check_int(self.max_queue_depth, "limits.max_queue_depth")


@dataclass(frozen=True)
class QueueConfig:
    """A declared queue (``[[queues]]``): its name and the settings it overrides.

    Fields left as ``None`` take the global value; ``allowed_job_types`` exists only
    per queue (``None`` = any job type).
    """

    name: str
    max_lease_duration_ms: Optional[int] = None
    default_max_attempts: Optional[int] = None
    max_attempts_ceiling: Optional[int] = None
    default_priority: Optional[int] = None
    retry_delay_ms: Optional[int] = None
    retry_backoff: Optional[str] = None
    retry_delay_max_ms: Optional[int] = None
    max_payload_bytes: Optional[int] = None
    allowed_encodings: Optional[Sequence[str]] = None
    allowed_job_types: Optional[Sequence[str]] = None
    max_schedule_horizon_ms: Optional[int] = None
    max_custom_entries: Optional[int] = None
    max_custom_total_bytes: Optional[int] = None
    max_custom_key_bytes: Optional[int] = None
    dedup_window_ms: Optional[int] = None
    max_queue_depth: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"queues[].name must be a string, got {self.name!r}")
        for name in ("allowed_encodings", "allowed_job_types"):
            scope = f"queues[{rust_debug(self.name)}].{name}"
            object.__setattr__(self, name, _tuple_or_none(getattr(self, name), scope))


@dataclass(frozen=True)
class EffectiveLimits:
    """A queue's settings after applying its overrides to the global defaults."""

    max_lease_duration_ms: int
    default_max_attempts: int
    max_attempts_ceiling: int
    default_priority: int
    retry_delay_ms: int
    retry_backoff: str
    retry_delay_max_ms: int
    max_payload_bytes: int
    allowed_encodings: Optional[tuple[str, ...]]
    allowed_job_types: Optional[tuple[str, ...]]
    max_schedule_horizon_ms: int
    max_custom_entries: int
    max_custom_total_bytes: int
    max_custom_key_bytes: int
    dedup_window_ms: int
    max_queue_depth: Optional[int]

    @classmethod
    def from_globals(cls, limits: Limits, dedup_window_ms: int) -> EffectiveLimits:
        """The settings of an undeclared queue."""
        values: dict[str, Any] = {
            f.name: getattr(limits, f.name, None) for f in dataclasses.fields(cls)
        }
        values["allowed_job_types"] = None
        values["dedup_window_ms"] = dedup_window_ms
        return cls(**values)

    def merged_with(self, queue: QueueConfig) -> EffectiveLimits:
        """These settings with ``queue``'s overrides applied (``allowed_job_types`` is
        the queue's own, never inherited)."""
        values = {}
        for f in dataclasses.fields(self):
            override = getattr(queue, f.name)
            values[f.name] = getattr(self, f.name) if override is None else override
        values["allowed_job_types"] = queue.allowed_job_types
        return EffectiveLimits(**values)

    def validate(self, max_message_bytes: int, scope: str) -> None:
        """Raise :class:`ConfigError` as the server's load-time checks would."""
        for name in (
            "max_lease_duration_ms",
            "default_max_attempts",
            "max_attempts_ceiling",
            "retry_delay_max_ms",
            "max_payload_bytes",
            "max_schedule_horizon_ms",
            "max_custom_entries",
            "max_custom_total_bytes",
            "max_custom_key_bytes",
            "dedup_window_ms",
        ):
            _check_int(getattr(self, name), f"{scope}.{name}", 1)
        _check_int(self.default_priority, f"{scope}.default_priority", 0, 9)
        _check_int(self.retry_delay_ms, f"{scope}.retry_delay_ms")
        if self.max_queue_depth is not None:
            _check_int(self.max_queue_depth, f"{scope}.max_queue_depth")
        self._validate_lists(scope)
        self._validate_cross(max_message_bytes, scope)

    def _validate_lists(self, scope: str) -> None:
        if self.retry_backoff not in _BACKOFFS:
            raise ConfigError(
                f'{scope}.retry_backoff: must be "none" or "exponential", '
                f"got {self.retry_backoff!r}"
            )
        if self.allowed_encodings is not None and not all(self.allowed_encodings):
            raise ConfigError(f"{scope}.allowed_encodings: entries must not be empty")
        if self.allowed_job_types is not None and (
            not self.allowed_job_types or not all(self.allowed_job_types)
        ):
            raise ConfigError(
                f"{scope}.allowed_job_types: must list at least one non-empty job type"
            )

    def _validate_cross(self, max_message_bytes: int, scope: str) -> None:
        if self.max_payload_bytes > max_message_bytes:
            raise ConfigError(
                f"{scope}.max_payload_bytes: must not exceed limits.max_message_bytes"
            )
        if self.default_max_attempts > self.max_attempts_ceiling:
            raise ConfigError(f"{scope}.default_max_attempts: must not exceed max_attempts_ceiling")
        if self.retry_delay_ms > self.retry_delay_max_ms:
            raise ConfigError(f"{scope}.retry_delay_ms: must not exceed retry_delay_max_ms")


ApiKeys = Union[Sequence[str], Mapping[str, str]]


def _normalise_api_keys(api_keys: Optional[ApiKeys]) -> Optional[tuple[tuple[str, str], ...]]:
    """``(name, key)`` pairs; plain keys are named by their position. ``None`` = auth
    off. Raises :class:`ConfigError` for the keys the server refuses."""
    if api_keys is None:
        return None
    if isinstance(api_keys, str):
        raise ConfigError("api_keys must be a list of keys or a name -> key mapping, not a str")
    if isinstance(api_keys, Mapping):
        pairs = [(str(name), key) for name, key in api_keys.items()]
    else:
        pairs = [(f"key-{index}", key) for index, key in enumerate(api_keys)]
    names: set[str] = set()
    keys: set[str] = set()
    for name, key in pairs:
        _check_api_key(name, key)
        if name in names:
            raise ConfigError(f"auth.api_keys has a duplicate name {rust_debug(name)}")
        if key in keys:
            raise ConfigError(f"API keys {rust_debug(name)} and another share the same key")
        names.add(name)
        keys.add(key)
    return tuple(pairs)


def _check_api_key(name: str, key: object) -> None:
    # Messages name the key, never show it: keys must not reach logs or tracebacks.
    if not name:
        raise ConfigError("auth.api_keys[].name must not be empty")
    if not isinstance(key, str):
        raise ConfigError(f"API key {rust_debug(name)} must be a string")
    if not key:
        raise ConfigError(f"API key {rust_debug(name)} has an empty key")
    if not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise ConfigError(f"API key {rust_debug(name)} must be visible ASCII")


@dataclass(frozen=True)
class ServerConfig:
    """Everything the in-process server is configured with.

    ``api_keys``: ``None`` turns auth off (the ``authorization`` header is ignored),
    ``[]`` rejects every call, else a list of keys or a name -> key mapping.
    ``tls_cert``/``tls_key``: PEM bytes or file paths, both or neither.
    ``dead_letter_retention_ms = 0`` (the default) keeps no dead-letter records.
    Raises :class:`ConfigError` where the real server would refuse to start.
    """

    host: str = "127.0.0.1"
    port: int = 0
    strict_queues: bool = False
    # Secrets stay out of repr(): configs end up in logs and test failure output.
    api_keys: Optional[ApiKeys] = field(default=None, repr=False)
    tls_cert: Optional[PemSource] = field(default=None, repr=False)
    tls_key: Optional[PemSource] = field(default=None, repr=False)
    limits: Limits = field(default_factory=Limits)
    queues: Sequence[QueueConfig] = ()
    dedup_window_ms: int = 86_400_000
    dead_letter_retention_ms: int = 0
    sweep_interval_ms: int = 1000
    sweep_limit: int = 10_000
    version: str = "0.1.0"

    def __post_init__(self) -> None:
        object.__setattr__(self, "queues", tuple(self.queues))
        object.__setattr__(self, "_key_pairs", _normalise_api_keys(self.api_keys))
        if (self.tls_cert is None) != (self.tls_key is None):
            missing, given = ("key", "cert") if self.tls_key is None else ("cert", "key")
            raise ConfigError(
                f"server.tls_{given}_path is set but server.tls_{missing}_path is not; "
                "set both or neither"
            )
        _check_int(self.port, "server.port", 0, 65_535)
        _check_int(self.sweep_interval_ms, "storage.sweep_interval_ms", 1)
        _check_int(self.sweep_limit, "storage.sweep_limit", 1)
        _check_int(self.dead_letter_retention_ms, "storage.dead_letter_retention_ms")
        defaults = self.global_limits()
        defaults.validate(self.limits.max_message_bytes, "limits")
        self._validate_queues(defaults)

    def _validate_queues(self, defaults: EffectiveLimits) -> None:
        seen: set[str] = set()
        for queue in self.queues:
            if not isinstance(queue, QueueConfig):
                raise ConfigError(f"queues must hold QueueConfig values, got {queue!r}")
            why = queue_name_error(queue.name)
            if why is not None:
                raise ConfigError(f"queues[].name {rust_debug(queue.name)} {why}")
            if len(queue.name.encode()) > self.limits.max_queue_name_bytes:
                raise ConfigError(
                    f"queues[].name {rust_debug(queue.name)} exceeds "
                    f"limits.max_queue_name_bytes ({self.limits.max_queue_name_bytes})"
                )
            if queue.name in seen:
                raise ConfigError(f"queues[] contains duplicate name {rust_debug(queue.name)}")
            seen.add(queue.name)
            defaults.merged_with(queue).validate(
                self.limits.max_message_bytes, f"queues[{rust_debug(queue.name)}]"
            )

    @property
    def api_key_set(self) -> Optional[frozenset[str]]:
        """The accepted keys, or ``None`` when auth is off."""
        pairs: Optional[tuple[tuple[str, str], ...]] = self.__dict__["_key_pairs"]
        return None if pairs is None else frozenset(key for _, key in pairs)

    @property
    def tls_enabled(self) -> bool:
        """Whether the server serves TLS."""
        return self.tls_cert is not None

    def global_limits(self) -> EffectiveLimits:
        """The settings every undeclared queue uses."""
        return EffectiveLimits.from_globals(self.limits, self.dedup_window_ms)

    def with_overrides(self, **overrides: Any) -> ServerConfig:
        """A copy with fields replaced; names of :class:`Limits` fields go into
        ``limits``. Raises ``TypeError`` for unknown names."""
        own = {f.name for f in dataclasses.fields(self)}
        limit_names = {f.name for f in dataclasses.fields(Limits)}
        mine = {k: v for k, v in overrides.items() if k in own}
        limits = {k: v for k, v in overrides.items() if k in limit_names and k not in own}
        unknown = set(overrides) - set(mine) - set(limits)
        if unknown:
            raise TypeError(f"unknown server settings: {', '.join(sorted(unknown))}")
        if limits:
            mine["limits"] = dataclasses.replace(mine.get("limits", self.limits), **limits)
        return dataclasses.replace(self, **mine)

    @classmethod
    def from_toml(cls, path: Union[str, os.PathLike[str]], **overrides: Any) -> ServerConfig:
        """Read the real server's TOML layout (``[server]``, ``[auth]``, ``[limits]``,
        ``[storage]``, ``[[queues]]``); other sections and keys are ignored, with a
        warning for each one neither server knows. Raises
        :class:`ConfigError` for invalid settings and ``RuntimeError`` when no TOML
        parser is available (Python < 3.11 without ``tomli``, which sepp-lite
        depends on there)."""
        return from_toml_data(read_toml(path)).with_overrides(**overrides)


def read_toml(path: Union[str, os.PathLike[str]]) -> dict[str, Any]:
    """A TOML file as a dict; raises :class:`ConfigError` when it cannot be read or is
    not valid TOML."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {os.fspath(path)}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {os.fspath(path)}: {exc}") from None
    try:
        return _toml_loads(raw.decode())
    except UnicodeDecodeError:
        raise ConfigError(f"invalid TOML: {os.fspath(path)} is not UTF-8") from None


def _toml_loads(text: str) -> dict[str, Any]:
    # tomllib is in the standard library from 3.11; before that, tomli has its API.
    name = "tomllib" if sys.version_info >= (3, 11) else "tomli"
    try:
        parser = importlib.import_module(name)
    except ImportError:
        raise RuntimeError(
            "reading a TOML config needs Python 3.11+ or the tomli package (pip install tomli)"
        ) from None
    try:
        data: dict[str, Any] = parser.loads(text)
    except parser.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}") from None
    return data


_QUEUE_FIELDS = frozenset(f.name for f in dataclasses.fields(QueueConfig))
_LIMIT_FIELDS = frozenset(f.name for f in dataclasses.fields(Limits))
_STORAGE_FIELDS = frozenset(
    {"dedup_window_ms", "dead_letter_retention_ms", "sweep_interval_ms", "sweep_limit"}
)
_SERVER_FIELDS = frozenset({"listen_addr", "strict_queues", "tls_cert_path", "tls_key_path"})
_AUTH_FIELDS = frozenset({"api_keys"})
# Settings of the real server that the in-process one has no use for (it keeps nothing
# on disk, traces nothing and has no admin UI): read without a word.
_REAL_SERVER_ONLY = frozenset({"storage.db_path"})
_REAL_SERVER_SECTIONS = frozenset({"tracing", "admin"})
_SECTIONS = frozenset({"server", "auth", "limits", "storage", "queues"})


def from_toml_data(data: Mapping[str, Any]) -> ServerConfig:
    """A :class:`ServerConfig` from an already parsed TOML document. A key or section
    this server does not know is logged as a WARNING and ignored, as the real server
    ignores them (a typo must not pass unnoticed)."""
    for name in data:
        if name not in _SECTIONS and name not in _REAL_SERVER_SECTIONS:
            log.warning("ignoring unknown config section [%s]", name)
    kwargs: dict[str, Any] = {}
    kwargs.update(_server_section(_known(_section(data, "server"), _SERVER_FIELDS, "server")))
    auth = _known(_section(data, "auth"), _AUTH_FIELDS, "auth")
    if "api_keys" in auth:
        kwargs["api_keys"] = _api_keys_from_toml(auth["api_keys"])
    kwargs["limits"] = Limits(**_known(_section(data, "limits"), _LIMIT_FIELDS, "limits"))
    kwargs.update(_known(_section(data, "storage"), _STORAGE_FIELDS, "storage"))
    queues = data.get("queues", [])
    if not isinstance(queues, list):
        raise ConfigError("queues must be an array of tables ([[queues]])")
    kwargs["queues"] = [_queue_from_toml(q) for q in queues]
    return ServerConfig(**kwargs)


def _section(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    section = data.get(name, {})
    if not isinstance(section, Mapping):
        raise ConfigError(f"[{name}] must be a table")
    return section


def _known(table: Mapping[str, Any], known: frozenset[str], scope: str) -> dict[str, Any]:
    # The real server ignores keys it does not know; say so instead of failing.
    for key in table:
        if key not in known and f"{scope}.{key}" not in _REAL_SERVER_ONLY:
            log.warning("ignoring unknown config key %s.%s", scope, key)
    return {k: v for k, v in table.items() if k in known}


def _server_section(server: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "listen_addr" in server:
        out["host"], out["port"] = _split_addr(server["listen_addr"])
    if "strict_queues" in server:
        out["strict_queues"] = bool(server["strict_queues"])
    if "tls_cert_path" in server:
        out["tls_cert"] = str(server["tls_cert_path"])
    if "tls_key_path" in server:
        out["tls_key"] = str(server["tls_key_path"])
    return out


def _split_addr(addr: object) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets) as the server's ``listen_addr`` takes it."""
    if not isinstance(addr, str) or ":" not in addr:
        raise ConfigError(f"server.listen_addr must be host:port, got {addr!r}")
    host, _, port = addr.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return host, int(port)
    except ValueError:
        raise ConfigError(f"server.listen_addr has an invalid port: {addr!r}") from None


def _api_keys_from_toml(value: object) -> ApiKeys:
    if not isinstance(value, list):
        raise ConfigError("auth.api_keys must be an array")
    if all(isinstance(item, str) for item in value):
        return list(value)
    named: dict[str, str] = {}
    for item in value:
        if not isinstance(item, Mapping) or set(item) != {"name", "key"}:
            raise ConfigError(
                "auth.api_keys entries must all be strings or all be { name, key } tables"
            )
        if item["name"] in named:
            raise ConfigError(f"auth.api_keys has a duplicate name {rust_debug(item['name'])}")
        named[item["name"]] = item["key"]
    return named


def _queue_from_toml(table: object) -> QueueConfig:
    if not isinstance(table, Mapping) or "name" not in table:
        raise ConfigError("every [[queues]] entry needs a name")
    return QueueConfig(**_known(table, _QUEUE_FIELDS, "queues[]"))
