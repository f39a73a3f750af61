"""The in-process server's configuration: defaults, load-time checks, TOML layout."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from sepp_lite.testing import ConfigError, Limits, QueueConfig, ServerConfig
from sepp_lite.testing._names import rust_debug, rust_debug_list


def test_limits_defaults_are_the_servers():
    assert dataclasses.asdict(Limits()) == {
        "max_lease_duration_ms": 300_000,
        "default_max_attempts": 3,
        "max_attempts_ceiling": 100,
        "default_priority": 0,
        "retry_delay_ms": 0,
        "retry_backoff": "none",
        "retry_delay_max_ms": 3_600_000,
        "max_reserve_batch": 256,
        "max_reserve_queues": 32,
        "max_wait_timeout_ms": 300_000,
        "max_enqueue_batch": 256,
        "max_queue_depth": None,
        "max_payload_bytes": 1_048_576,
        "max_message_bytes": 16_777_216,
        "max_custom_entries": 64,
        "max_custom_total_bytes": 16_384,
        "max_custom_key_bytes": 256,
        "max_queue_name_bytes": 512,
        "max_job_type_bytes": 256,
        "max_idempotency_key_bytes": 256,
        "max_schedule_horizon_ms": 2_592_000_000,
        "allowed_encodings": None,
    }


def test_server_config_defaults():
    config = ServerConfig()
    assert (config.host, config.port, config.strict_queues) == ("127.0.0.1", 0, False)
    assert (config.api_keys, config.api_key_set, config.tls_enabled) == (None, None, False)
    assert (config.dedup_window_ms, config.dead_letter_retention_ms) == (86_400_000, 0)
    assert (config.sweep_interval_ms, config.sweep_limit, config.version) == (1000, 10_000, "0.1.0")
    assert config.queues == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"limits": Limits(default_max_attempts=5, max_attempts_ceiling=3)},
            "limits.default_max_attempts: must not exceed max_attempts_ceiling",
        ),
        (
            {"limits": Limits(retry_delay_ms=10, retry_delay_max_ms=5)},
            "limits.retry_delay_ms: must not exceed retry_delay_max_ms",
        ),
        (
            {"limits": Limits(max_payload_bytes=20, max_message_bytes=10)},
            "limits.max_payload_bytes: must not exceed limits.max_message_bytes",
        ),
        (
            {"queues": [QueueConfig("q", default_max_attempts=50, max_attempts_ceiling=10)]},
            'queues["q"].default_max_attempts: must not exceed max_attempts_ceiling',
        ),
        (
            {"queues": [QueueConfig("q", retry_delay_ms=10_000, retry_delay_max_ms=5_000)]},
            'queues["q"].retry_delay_ms: must not exceed retry_delay_max_ms',
        ),
        ({"queues": [QueueConfig("a/b")]}, "queues[].name \"a/b\" must not contain '/'"),
        ({"queues": [QueueConfig("")]}, 'queues[].name "" must not be empty'),
        ({"queues": [QueueConfig("q"), QueueConfig("q")]}, 'queues[] contains duplicate name "q"'),
        (
            {"queues": [QueueConfig("x" * 513)]},
            f'queues[].name "{"x" * 513}" exceeds limits.max_queue_name_bytes (512)',
        ),
        (
            {"queues": [QueueConfig("q", retry_backoff="linear")]},
            'queues["q"].retry_backoff: must be "none" or "exponential", got \'linear\'',
        ),
        (
            {"queues": [QueueConfig("q", allowed_job_types=[])]},
            'queues["q"].allowed_job_types: must list at least one non-empty job type',
        ),
        (
            {"queues": [QueueConfig("q", default_priority=10)]},
            'queues["q"].default_priority: must be at most 9, got 10',
        ),
        ({"tls_cert": b"pem"}, "server.tls_cert_path is set but server.tls_key_path is not"),
        ({"api_keys": [""]}, 'API key "key-0" has an empty key'),
        ({"api_keys": {"w": "has space"}}, 'API key "w" must be visible ASCII'),
        ({"api_keys": ["k", "k"]}, 'API keys "key-1" and another share the same key'),
        ({"sweep_limit": 0}, "storage.sweep_limit: must be at least 1, got 0"),
    ],
)
def test_load_time_checks(kwargs, message):
    with pytest.raises(ConfigError) as info:
        ServerConfig(**kwargs)
    assert str(info.value).startswith(message)


def test_limits_own_checks():
    with pytest.raises(ConfigError, match=r"limits.max_queue_name_bytes: must be at most 65535"):
        Limits(max_queue_name_bytes=65_536)
    with pytest.raises(ConfigError, match="limits.max_enqueue_batch: must be at least 1"):
        Limits(max_enqueue_batch=0)
    assert Limits(allowed_encodings=["json"]).allowed_encodings == ("json",)


def test_secrets_stay_out_of_repr():
    config = ServerConfig(api_keys={"worker": "top-secret"}, tls_cert=b"CERT", tls_key=b"KEY")
    assert "top-secret" not in repr(config) and "KEY" not in repr(config)
    assert config.api_key_set == frozenset({"top-secret"})


def test_with_overrides_routes_limit_names():
    config = ServerConfig().with_overrides(strict_queues=True, max_queue_depth=3)
    assert (config.strict_queues, config.limits.max_queue_depth) == (True, 3)
    with pytest.raises(TypeError, match="unknown server settings: nope"):
        ServerConfig().with_overrides(nope=1)


def test_from_toml_reads_the_servers_layout(tmp_path: Path, caplog):
    path = tmp_path / "sepp.toml"
    path.write_text(
        """
[server]
listen_addr = "[::1]:6000"
strict_queues = true
db_path = "./ignored"

[auth]
api_keys = ["alpha", "beta"]

[limits]
max_reserve_batch = 10
allowed_encodings = ["json"]
max_queue_depth = 100
not_a_setting = 1

[storage]
dead_letter_retention_ms = 5000
dedup_window_ms = 1000
sweep_limit = 50
persist_mode = "buffer"

[tracing]
enabled = false

[[queues]]
name = "emails"
allowed_job_types = ["send"]
retry_delay_ms = 100
retry_backoff = "exponential"
max_queue_depth = 5
"""
    )
    with caplog.at_level(logging.WARNING, logger="sepp_lite.testing._config"):
        config = ServerConfig.from_toml(path)
    assert "ignoring unknown config key limits.not_a_setting" in caplog.text
    assert (config.host, config.port, config.strict_queues) == ("::1", 6000, True)
    assert config.api_key_set == frozenset({"alpha", "beta"})
    assert (config.limits.max_reserve_batch, config.limits.allowed_encodings) == (10, ("json",))
    assert (config.dead_letter_retention_ms, config.dedup_window_ms, config.sweep_limit) == (
        5000,
        1000,
        50,
    )
    [queue] = config.queues
    assert queue == QueueConfig(
        "emails",
        allowed_job_types=("send",),
        retry_delay_ms=100,
        retry_backoff="exponential",
        max_queue_depth=5,
    )
    merged = config.global_limits().merged_with(queue)
    assert (merged.max_queue_depth, merged.allowed_encodings, merged.dedup_window_ms) == (
        5,
        ("json",),
        1000,
    )
    assert config.global_limits().allowed_job_types is None


def test_from_toml_named_keys_and_errors(tmp_path: Path):
    path = tmp_path / "a.toml"
    path.write_text('[auth]\napi_keys = [{ name = "w", key = "k1" }, { name = "p", key = "k2" }]\n')
    assert ServerConfig.from_toml(path).api_key_set == frozenset({"k1", "k2"})
    path.write_text('[auth]\napi_keys = [{ name = "w", key = "k1" }, { name = "w", key = "k2" }]\n')
    with pytest.raises(ConfigError, match='auth.api_keys has a duplicate name "w"'):
        ServerConfig.from_toml(path)
    path.write_text('[auth]\napi_keys = ["k1", { name = "w", key = "k2" }]\n')
    with pytest.raises(ConfigError, match="all be strings or all be"):
        ServerConfig.from_toml(path)
    path.write_text("[auth]\napi_keys = []\n")
    assert ServerConfig.from_toml(path).api_key_set == frozenset()
    path.write_text("[limits\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        ServerConfig.from_toml(path)
    path.write_text('[server]\nlisten_addr = "nowhere"\n')
    with pytest.raises(ConfigError, match="server.listen_addr must be host:port"):
        ServerConfig.from_toml(path)
    path.write_text("[[queues]]\nmax_queue_depth = 1\n")
    with pytest.raises(ConfigError, match=r"every \[\[queues\]\] entry needs a name"):
        ServerConfig.from_toml(path)


def test_rust_debug_quoting():
    assert rust_debug('a"b\\c') == '"a\\"b\\\\c"'
    assert rust_debug("tab\there\n") == '"tab\\there\\n"'
    assert rust_debug("\x01é\u200b\u0301") == '"\\u{1}é\\u{200b}\\u{301}"'
    assert rust_debug("it's") == '"it\'s"'
    assert rust_debug_list(["a", "b"]) == '["a", "b"]'
    assert rust_debug_list([]) == "[]"


def test_unknown_keys_and_sections_warn_in_every_section(tmp_path: Path, caplog):
    # Before: only [limits] and [[queues]] warned; a typo under [server], [auth] or
    # [storage] was dropped without a word (the README promised a warning).
    path = tmp_path / "typos.toml"
    path.write_text(
        """
[server]
listen_adr = "127.0.0.1:7000"
strict_queues = true

[auth]
api_key = ["k"]

[limits]
max_payload_byte = 5

[storage]
dead_letter_retenton_ms = 5000
db_path = "./sepp-data"

[tracing]
enabled = true

[admin]
listen_addr = "127.0.0.1:9465"

[metrics]
enabled = true

[[queues]]
name = "emails"
max_atempts = 3
"""
    )
    with caplog.at_level(logging.WARNING, logger="sepp_lite.testing._config"):
        config = ServerConfig.from_toml(path)
    warned = sorted(record.getMessage() for record in caplog.records)
    assert warned == [
        "ignoring unknown config key auth.api_key",
        "ignoring unknown config key limits.max_payload_byte",
        "ignoring unknown config key queues[].max_atempts",
        "ignoring unknown config key server.listen_adr",
        "ignoring unknown config key storage.dead_letter_retenton_ms",
        "ignoring unknown config section [metrics]",
    ]
    # The known keys beside them still count; the real server's own settings this
    # server has no use for (db_path, [tracing], [admin]) pass without a word.
    assert config.strict_queues and config.port == 0 and config.api_key_set is None
    assert config.dead_letter_retention_ms == 0


def test_tomli_is_a_runtime_dependency_where_tomllib_is_missing():
    # `sepp-lite serve --config` needs a TOML parser on 3.9 and 3.10 too (before, tomli
    # was only a test extra, so a plain install failed there).
    tomllib = pytest.importorskip("tomllib")
    from packaging.markers import Marker
    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    requirements = [Requirement(text) for text in project["project"]["dependencies"]]
    [tomli] = [req for req in requirements if req.name == "tomli"]
    assert tomli.marker is not None and str(tomli.marker) == str(Marker('python_version < "3.11"'))
    for version, needed in (("3.9", True), ("3.10", True), ("3.11", False), ("3.13", False)):
        assert tomli.marker.evaluate({"python_version": version}) is needed
