"""Settings: flags > MCP_SANDBOX_* > the earlier bridge's aliases > TOML file > defaults."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from mcp_sandbox.config import ENV_ALIASES, SETTINGS, Settings, load_config, load_settings
from mcp_sandbox.config.reference import FLAGS, env_names, settings_table
from mcp_sandbox.errors import ConfigError, SandboxError


class Sample(NamedTuple):
    """One value of a setting, as written in the environment, as a TOML literal, and parsed."""

    text: str
    toml: str
    value: object


# Two distinct valid values for every setting an alias can reach (A wins over B in the tests).
SAMPLES: dict[str, tuple[Sample, Sample]] = {
    "timeout": (Sample("45", "45", 45.0), Sample("60", "60", 60.0)),
    "max_timeout": (Sample("300", "300", 300.0), Sample("600", "600", 600.0)),
    "memory": (Sample("1g", '"1g"', 1 << 30), Sample("256m", '"256m"', 256 << 20)),
    "pids": (Sample("64", "64", 64), Sample("32", "32", 32)),
    "cpus": (Sample("2.5", "2.5", 2.5), Sample("0.5", "0.5", 0.5)),
    "container_runtime": (Sample("podman", '"podman"', "podman"), Sample("docker", '"docker"', "docker")),
    "image": (
        Sample("python:3.12-slim", '"python:3.12-slim"', "python:3.12-slim"),
        Sample("debian:bookworm", '"debian:bookworm"', "debian:bookworm"),
    ),
    "output_mode": (Sample("json", '"json"', "json"), Sample("toon", '"toon"', "toon")),
    "state_dir": (Sample("/srv/a", '"/srv/a"', Path("/srv/a")), Sample("/srv/b", '"/srv/b"', Path("/srv/b"))),
    "servers_config": (
        Sample("/srv/a.json", '"/srv/a.json"', Path("/srv/a.json")),
        Sample("/srv/b.json", '"/srv/b.json"', Path("/srv/b.json")),
    ),
    "log_level": (Sample("DEBUG", '"DEBUG"', "DEBUG"), Sample("INFO", '"INFO"', "INFO")),
    "otel_endpoint": (
        Sample("http://127.0.0.1:4317", '"http://127.0.0.1:4317"', "http://127.0.0.1:4317"),
        Sample("https://collector:4318", '"https://collector:4318"', "https://collector:4318"),
    ),
    "otel_protocol": (
        Sample("http/protobuf", '"http/protobuf"', "http/protobuf"),
        Sample("grpc", '"grpc"', "grpc"),
    ),
    "runner_data": (
        Sample("/srv/sandboxes", '"/srv/sandboxes"', Path("/srv/sandboxes")),
        Sample("/srv/old", '"/srv/old"', Path("/srv/old")),
    ),
    "runner_secret": (Sample("s3cret-a", '"s3cret-a"', "s3cret-a"), Sample("s3cret-b", '"s3cret-b"', "s3cret-b")),
    "token": (
        Sample("token-a-0123456789abcdef", '"token-a-0123456789abcdef"', "token-a-0123456789abcdef"),
        Sample("token-b-0123456789abcdef", '"token-b-0123456789abcdef"', "token-b-0123456789abcdef"),
    ),
    "public_url": (
        Sample("https://a.example", '"https://a.example"', "https://a.example"),
        Sample("http://b.example:8080", '"http://b.example:8080"', "http://b.example:8080"),
    ),
}

# --- a value of every setting, generated from its declaration (a new setting is covered at once) ---

_CANDIDATES: dict[str, list[Any]] = {
    "str": [
        "sample-value-0123456789",
        "https://sample.example",
        "deno",
        "json",
        "toon",
        "raw",
        "2000000000-2000000999",
        "postgresql://sample@db.example/sample",
        "s3://sample-bucket/prefix",
        "http/protobuf",
    ],
    "path": [Path("/srv/sample")],
    "strings": [("json", "csv"), ("10.0.0.0/8", "192.168.0.0/16"), ("python=img:1", "typescript=img:2")],
    "ints": [(8080, 8443)],
}


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(_literal(item) for item in value) + "]"
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    return repr(value)


def _sample(name: str) -> Sample:
    """A valid value of ``name`` other than its default, written for the environment and for TOML."""
    declaration = SETTINGS[name]
    kind, unit, check = str(declaration.type), declaration.metadata["unit"], declaration.metadata["check"]
    default = Settings().value(name)
    if kind == "bool":
        return Sample(str(not default).lower(), _literal(not default), not default)
    if unit == "bytes":
        value = (default or 0) + 3 * 1024
        return Sample(f"{value // 1024}k", f'"{value // 1024}k"', value)
    if unit == "duration":
        return Sample(f"{default + 7:.0f}s", f'"{default + 7:.0f}s"', default + 7)
    if kind.startswith(("int", "float")):
        value = (default or 2) + 1
        return Sample(str(value), _literal(value), value)
    group = (
        "ints"
        if kind.startswith("tuple[int")
        else "strings"
        if kind.startswith("tuple")
        else "path"
        if "Path" in kind
        else "str"
    )
    for value in _CANDIDATES[group]:
        try:
            if check is not None:
                check(name, value)
        except ConfigError:
            continue
        if value != default:
            text = ",".join(str(item) for item in value) if isinstance(value, tuple) else str(value)
            return Sample(text, _literal(value), value)
    raise AssertionError(f"no sample value for {name}: add one to _CANDIDATES")


EVERY: dict[str, Sample] = {name: _sample(name) for name in SETTINGS}


ALIASES = [pytest.param(alias, name, id=alias) for alias, name in ENV_ALIASES.items()]


def env_name(setting: str) -> str:
    return f"MCP_SANDBOX_{setting.upper()}"


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mcp-sandbox.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- precedence -----------------------------------------------------------------------------


def test_nothing_given_yields_the_defaults() -> None:
    assert load_settings(flags={}, env={}) == Settings()


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        pytest.param({"flag", "env", "alias", "toml"}, 5.0, id="flag"),
        pytest.param({"env", "alias", "toml"}, 10.0, id="env"),
        pytest.param({"alias", "toml"}, 15.0, id="alias"),
        pytest.param({"toml"}, 20.0, id="toml"),
        pytest.param(set(), 30.0, id="default"),
    ],
)
def test_the_highest_layer_that_sets_a_value_wins(tmp_path: Path, layers: set[str], expected: float) -> None:
    flags = {"timeout": 5} if "flag" in layers else {}
    env: dict[str, str] = {}
    if "env" in layers:
        env["MCP_SANDBOX_TIMEOUT"] = "10"
    if "alias" in layers:
        env["MCP_BRIDGE_TIMEOUT"] = "15"
    config = write_toml(tmp_path, "timeout = 20\n") if "toml" in layers else None

    settings = load_settings(flags=flags, env=env, config_file=config)

    assert settings.limits.timeout == expected


def test_a_flag_given_as_none_leaves_the_lower_layers_in_charge() -> None:
    settings = load_settings(flags={"timeout": None}, env={"MCP_SANDBOX_TIMEOUT": "10"})

    assert settings.limits.timeout == 10.0


def test_settings_from_different_layers_are_combined(tmp_path: Path) -> None:
    config = write_toml(tmp_path, 'backend = "podman"\npids = 99\n')

    settings = load_settings(
        flags={"memory": "2g"}, env={"MCP_SANDBOX_PIDS": "7", "MCP_BRIDGE_CPUS": "3"}, config_file=config
    )

    assert (settings.sandbox.backend, settings.limits.pids, settings.limits.cpus, settings.limits.memory) == (
        "podman",
        7,
        3.0,
        2 << 30,
    )


def test_the_process_environment_is_read_when_no_env_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):  # the developer's own settings must not leak into the test
        if key.startswith("MCP_SANDBOX_") or key in ENV_ALIASES or key == "MCP_HTTP_ADDR":
            monkeypatch.delenv(key)
    monkeypatch.setenv("MCP_SANDBOX_PIDS", "77")

    assert load_settings().limits.pids == 77


def test_every_setting_can_be_given_as_an_mcp_sandbox_variable() -> None:
    env = {env_name(name): sample.text for name, sample in EVERY.items()}

    settings = load_settings(env=env)

    assert {name: settings.value(name) for name in EVERY} == {name: sample.value for name, sample in EVERY.items()}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_each_setting_is_read_from_each_of_its_variables(setting: str) -> None:
    sample = EVERY[setting]

    for variable in env_names(setting):
        assert load_settings(env={variable: sample.text}).value(setting) == sample.value, variable


# --- the earlier bridge's aliases -------------------------------------------------------------


def test_the_aliases_are_exactly_the_earlier_systems_documented_variables_and_opentelemetrys() -> None:
    assert dict(ENV_ALIASES) == {
        "MCP_BRIDGE_TIMEOUT": "timeout",
        "MCP_BRIDGE_MAX_TIMEOUT": "max_timeout",
        "MCP_BRIDGE_MEMORY": "memory",
        "MCP_BRIDGE_PIDS": "pids",
        "MCP_BRIDGE_CPUS": "cpus",
        "MCP_BRIDGE_RUNTIME": "container_runtime",
        "MCP_BRIDGE_IMAGE": "image",
        "MCP_BRIDGE_OUTPUT_MODE": "output_mode",
        "MCP_BRIDGE_STATE_DIR": "state_dir",
        "MCP_SERVERS_CONFIG": "servers_config",
        "MCP_BRIDGE_LOG_LEVEL": "log_level",
        "MCP_API_TOKEN": "token",
        "PUBLIC_BASE_URL": "public_url",
        "SANDBOX_ROOT": "runner_data",
        "FILE_SECRET": "runner_secret",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "otel_endpoint",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "otel_protocol",
    }


@pytest.mark.parametrize(
    ("address", "host", "port"),
    [
        ("127.0.0.1:8080", "127.0.0.1", 8080),
        (":8080", "0.0.0.0", 8080),
        ("[::1]:9000", "::1", 9000),
        ("localhost:1234", "localhost", 1234),
    ],
)
def test_mcp_http_addr_sets_host_and_port(address: str, host: str, port: int) -> None:
    settings = load_settings(env={"MCP_HTTP_ADDR": address})

    assert (settings.http.host, settings.http.port) == (host, port)


def test_mcp_sandbox_host_and_port_beat_mcp_http_addr() -> None:
    env = {"MCP_HTTP_ADDR": "10.0.0.1:1000", "MCP_SANDBOX_HOST": "127.0.0.2", "MCP_SANDBOX_PORT": "2000"}

    settings = load_settings(env=env)

    assert (settings.http.host, settings.http.port) == ("127.0.0.2", 2000)


@pytest.mark.parametrize("address", ["8080", "localhost", "host:port", "127.0.0.1:"])
def test_a_malformed_mcp_http_addr_is_refused_naming_the_variable(address: str) -> None:
    with pytest.raises(ConfigError, match="MCP_HTTP_ADDR"):
        load_settings(env={"MCP_HTTP_ADDR": address})


@pytest.mark.parametrize(("alias", "setting"), ALIASES)
def test_an_alias_sets_its_setting(alias: str, setting: str) -> None:
    sample = SAMPLES[setting][0]

    settings = load_settings(env={alias: sample.text})

    assert settings.value(setting) == sample.value


@pytest.mark.parametrize(("alias", "setting"), ALIASES)
def test_the_mcp_sandbox_variable_beats_its_alias(alias: str, setting: str) -> None:
    winner, loser = SAMPLES[setting]

    settings = load_settings(env={alias: loser.text, env_name(setting): winner.text})

    assert settings.value(setting) == winner.value


@pytest.mark.parametrize(("alias", "setting"), ALIASES)
def test_an_alias_beats_the_config_file(tmp_path: Path, alias: str, setting: str) -> None:
    winner, loser = SAMPLES[setting]
    config = write_toml(tmp_path, f"{setting} = {loser.toml}\n")

    settings = load_settings(env={alias: winner.text}, config_file=config)

    assert settings.value(setting) == winner.value


@pytest.mark.parametrize(("alias", "setting"), ALIASES)
def test_a_flag_beats_an_alias(alias: str, setting: str) -> None:
    winner, loser = SAMPLES[setting]

    settings = load_settings(flags={setting: winner.text}, env={alias: loser.text})

    assert settings.value(setting) == winner.value


# --- the TOML file ----------------------------------------------------------------------------


def test_every_setting_can_be_given_in_the_config_file(tmp_path: Path) -> None:
    config = write_toml(tmp_path, "".join(f"{name} = {sample.toml}\n" for name, sample in EVERY.items()))

    settings = load_settings(env={}, config_file=config)

    assert {name: settings.value(name) for name in EVERY} == {name: sample.value for name, sample in EVERY.items()}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_each_setting_is_read_from_the_config_file(tmp_path: Path, setting: str) -> None:
    sample = EVERY[setting]
    config = write_toml(tmp_path, f"{setting} = {sample.toml}\n")

    assert load_settings(env={}, config_file=config).value(setting) == sample.value


def test_the_replicas_settings_keep_their_variables_and_keys_and_live_in_their_piece(tmp_path: Path) -> None:
    config = write_toml(tmp_path, 'object_store_url = "s3://bucket/prefix"\nreplica_lease = "30s"\n')
    env = {"MCP_SANDBOX_DATABASE_URL": "postgresql://db/app", "MCP_SANDBOX_REPLICA_URL": "http://10.0.0.2:8765"}

    replicas = load_settings(env=env, config_file=config).replicas

    assert (replicas.database_url, replicas.object_store_url) == ("postgresql://db/app", "s3://bucket/prefix")
    assert (replicas.replica_url, replicas.replica_lease) == ("http://10.0.0.2:8765", 30.0)


def test_the_config_file_is_found_through_mcp_sandbox_config(tmp_path: Path) -> None:
    config = write_toml(tmp_path, "pids = 42\n")

    settings = load_settings(env={"MCP_SANDBOX_CONFIG": str(config)})

    assert settings.limits.pids == 42


def test_an_explicit_config_file_is_used_instead_of_mcp_sandbox_config(tmp_path: Path) -> None:
    from_env = tmp_path / "from-env.toml"
    from_env.write_text("pids = 1\n", encoding="utf-8")
    explicit = tmp_path / "explicit.toml"
    explicit.write_text("pids = 2\n", encoding="utf-8")

    settings = load_settings(env={"MCP_SANDBOX_CONFIG": str(from_env)}, config_file=explicit)

    assert settings.limits.pids == 2


def test_the_auth_and_servers_tables_are_accepted(tmp_path: Path) -> None:
    config = write_toml(
        tmp_path,
        "timeout = 12\n"
        "[auth]\n"
        'tokens = [{ tenant = "alice", token = "sha256:00ff" }]\n'
        "[servers.git]\n"
        'command = "uvx"\n'
        'args = ["mcp-server-git"]\n',
    )

    settings = load_settings(env={}, config_file=config)

    assert settings.limits.timeout == 12.0


def test_an_unknown_key_in_the_config_file_is_rejected(tmp_path: Path) -> None:
    config = write_toml(tmp_path, "timeout = 10\nno_such_setting = 1\n")

    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, config_file=config)

    assert "no_such_setting" in str(caught.value)


def test_config_file_records_the_file_read_and_cannot_be_set_as_a_setting(tmp_path: Path) -> None:
    config = write_toml(tmp_path, "timeout = 10\n")
    assert load_settings(env={}, config_file=config).config_file == config
    # Set from the environment, it would point discovery at a file whose settings were never read.
    assert load_settings(env={"MCP_SANDBOX_CONFIG_FILE": str(config)}).config_file is None
    with pytest.raises(ConfigError):
        load_settings(env={}, config_file=write_toml(tmp_path, f"config_file = {str(config)!r}\n"))


def test_a_malformed_config_file_is_rejected(tmp_path: Path) -> None:
    config = write_toml(tmp_path, "timeout = = 10\n[unclosed\n")

    with pytest.raises(ConfigError):
        load_settings(env={}, config_file=config)


def test_a_missing_config_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_settings(env={}, config_file=tmp_path / "absent.toml")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("timeout = [1, 2]\n", id="list-for-a-number"),
        pytest.param("pids = { a = 1 }\n", id="table-for-a-number"),
        pytest.param("memory = true\n", id="boolean-for-a-size"),
        pytest.param("pids = 1.9\n", id="fraction-for-an-integer"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_rejected(tmp_path: Path, text: str) -> None:
    config = write_toml(tmp_path, text)

    with pytest.raises(ConfigError):
        load_settings(env={}, config_file=config)


# --- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512m", 512 << 20),
        ("1g", 1 << 30),
        ("1GiB", 1 << 30),
        ("64 MB", 64 << 20),
        ("2k", 2 << 10),
        ("65536", 65536),
    ],
)
@pytest.mark.parametrize("setting", ["memory", "tmp_size", "max_output", "max_file_size"])
def test_sizes_are_parsed_in_binary_units(setting: str, text: str, expected: int) -> None:
    settings = load_settings(env={env_name(setting): text})

    assert settings.value(setting) == expected


def test_a_size_in_the_config_file_may_be_a_plain_integer(tmp_path: Path) -> None:
    config = write_toml(tmp_path, "memory = 1048576\n")

    assert load_settings(env={}, config_file=config).limits.memory == 1 << 20


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("false", False), ("no", False)],
)
def test_booleans_accept_the_usual_spellings(text: str, expected: bool) -> None:
    settings = load_settings(env={"MCP_SANDBOX_ACCEPT_WEAKER_ISOLATION": text})

    assert settings.sandbox.accept_weaker_isolation is expected


def test_an_empty_optional_path_means_none() -> None:
    settings = load_settings(env={"MCP_SANDBOX_SERVERS_CONFIG": ""})

    assert settings.code_mode.servers_config is None


def test_a_timeout_equal_to_max_timeout_is_accepted() -> None:
    settings = load_settings(env={"MCP_SANDBOX_TIMEOUT": "90", "MCP_SANDBOX_MAX_TIMEOUT": "90"})

    assert settings.limits.timeout == settings.limits.max_timeout == 90.0


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        pytest.param({"MCP_SANDBOX_TIMEOUT": "soon"}, "timeout", id="timeout-not-a-number"),
        pytest.param({"MCP_SANDBOX_TIMEOUT": "0"}, "timeout", id="timeout-zero"),
        pytest.param({"MCP_SANDBOX_TIMEOUT": "-1"}, "timeout", id="timeout-negative"),
        pytest.param({"MCP_SANDBOX_TIMEOUT": ""}, "timeout", id="timeout-empty"),
        pytest.param({"MCP_BRIDGE_TIMEOUT": "soon"}, "timeout", id="timeout-alias-not-a-number"),
        pytest.param({"MCP_SANDBOX_PIDS": "many"}, "pids", id="pids-not-a-number"),
        pytest.param({"MCP_SANDBOX_PIDS": "1.5"}, "pids", id="pids-fraction"),
        pytest.param({"MCP_SANDBOX_PIDS": "0"}, "pids", id="pids-zero"),
        pytest.param({"MCP_SANDBOX_CPUS": "0"}, "cpus", id="cpus-zero"),
        pytest.param({"MCP_BRIDGE_CPUS": "two"}, "cpus", id="cpus-alias-not-a-number"),
        pytest.param({"MCP_SANDBOX_MEMORY": "lots"}, "memory", id="memory-not-a-size"),
        pytest.param({"MCP_SANDBOX_MEMORY": "0"}, "memory", id="memory-zero"),
        pytest.param({"MCP_SANDBOX_MEMORY": "-5m"}, "memory", id="memory-negative"),
        pytest.param({"MCP_BRIDGE_MEMORY": "1x"}, "memory", id="memory-alias-unknown-unit"),
        pytest.param({"MCP_SANDBOX_TMP_SIZE": "12q"}, "tmp_size", id="tmp-size-unknown-unit"),
        pytest.param({"MCP_SANDBOX_OPEN_FILES": "0"}, "open_files", id="open-files-zero"),
        pytest.param({"MCP_SANDBOX_ACCEPT_WEAKER_ISOLATION": "maybe"}, "accept_weaker_isolation", id="bool"),
        pytest.param({"MCP_SANDBOX_OUTPUT_MODE": "yaml"}, "output_mode", id="output-mode-unknown"),
        pytest.param({"MCP_BRIDGE_OUTPUT_MODE": "xml"}, "output_mode", id="output-mode-alias-unknown"),
        pytest.param({"MCP_SANDBOX_TOOL_RESULTS": "whole"}, "tool_results", id="tool-results-unknown"),
    ],
)
def test_a_bad_value_is_rejected_naming_its_setting(env: dict[str, str], setting: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env=env)

    assert setting in str(caught.value)


@pytest.mark.parametrize("text", ["nan", "inf"])
def test_a_cpus_value_that_is_not_a_finite_number_is_rejected(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"MCP_SANDBOX_CPUS": text})

    assert "cpus" in str(caught.value)


@pytest.mark.parametrize(
    ("flags", "env", "toml"),
    [
        pytest.param({}, {"MCP_SANDBOX_TIMEOUT": "200"}, "", id="env-over-default-max"),
        pytest.param({"timeout": 50}, {"MCP_BRIDGE_MAX_TIMEOUT": "40"}, "", id="flag-over-alias-max"),
        pytest.param({}, {"MCP_SANDBOX_TIMEOUT": "20"}, "max_timeout = 10\n", id="env-over-toml-max"),
    ],
)
def test_a_timeout_above_max_timeout_is_rejected(
    tmp_path: Path, flags: dict[str, Any], env: dict[str, str], toml: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(flags=flags, env=env, config_file=write_toml(tmp_path, toml))

    assert "timeout" in str(caught.value)


def test_an_unknown_output_mode_in_the_config_file_is_rejected(tmp_path: Path) -> None:
    config = write_toml(tmp_path, 'output_mode = "markdown"\n')

    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, config_file=config)

    assert "output_mode" in str(caught.value)


def test_an_unknown_flag_is_rejected() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(flags={"no_such_flag": 1}, env={})

    assert "no_such_flag" in str(caught.value)


def test_a_config_error_is_a_sandbox_error() -> None:
    with pytest.raises(SandboxError):
        load_settings(env={"MCP_SANDBOX_TIMEOUT": "soon"})


# --- the loader's other results: tokens, tenants, servers -------------------------------------


def test_the_loader_reads_tokens_tenants_and_servers_from_the_one_file(tmp_path: Path) -> None:
    config = write_toml(
        tmp_path,
        'egress_allow = ["example.com"]\n'
        "[auth]\n"
        'tokens = [{ tenant = "alice", token = "alice-token-0123456789" }]\n'
        "[tenants.alice]\n"
        'egress_allow = ["*.example.org"]\n'
        'egress_deny = ["bad.example.org"]\n'
        "[servers.git]\n"
        'command = "uvx"\n',
    )

    loaded = load_config(env={"MCP_SANDBOX_TOKEN": "default-token-0123456789"}, config_file=config)

    assert [token.tenant for token in loaded.tokens] == ["default", "alice"]
    assert [(t.name, t.egress_allow, t.egress_deny) for t in loaded.tenants] == [
        ("alice", ("*.example.org",), ("bad.example.org",))
    ]
    assert loaded.servers == {"git": {"command": "uvx"}}


def test_the_per_tenant_caps_are_finished_for_the_transport(tmp_path: Path) -> None:
    config = write_toml(
        tmp_path,
        '[auth]\ntokens = [{ tenant = "alice", token = "alice-token-0123456789" },'
        ' { tenant = "bob", token = "bob-token-0123456789ab" }]\n',
    )
    loaded = load_config(env={}, config_file=config)

    assert loaded.serving("http").admission.tenant_concurrent_runs == 2
    assert loaded.serving("stdio").admission.tenant_concurrent_runs == loaded.settings.admission.max_concurrent_runs


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[auth]\ntokens = 1\n", id="auth-tokens-not-a-list"),
        pytest.param('[auth]\ntokens = [{ tenant = "a", token = "short" }]\n', id="token-too-short"),
        pytest.param("tenants = 1\n", id="tenants-not-tables"),
        pytest.param("[tenants.a]\negress_ports = [0]\n", id="tenant-port"),
        pytest.param('[tenants.a]\negress_allow = "x"\n', id="tenant-allow-not-a-list"),
    ],
)
def test_a_malformed_table_is_refused_by_the_loader(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError):
        load_config(env={}, config_file=write_toml(tmp_path, text))


def test_settings_replaced_are_checked_again() -> None:
    with pytest.raises(ConfigError):
        Settings().replace(pool_min=9, pool_size=2)


# --- the docs' settings table -----------------------------------------------------------------

_DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
_START, _END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"


def test_the_settings_table_names_every_setting_and_variable() -> None:
    table = settings_table()

    for name in SETTINGS:
        assert f"| `{name}` |" in table
        assert all(f"`{variable}`" in table for variable in env_names(name))


def test_the_settings_flagged_in_the_table_are_the_cli_flags() -> None:
    from mcp_sandbox.cli import _common

    options = {flag for action in _common()._actions for flag in action.option_strings}
    settings_flags = {flag for flag in options if flag.startswith("--") and flag[2:].replace("-", "_") in SETTINGS}

    assert settings_flags == {f"--{name.replace('_', '-')}" for name in FLAGS}


def test_the_configuration_page_embeds_the_settings_table() -> None:
    if not _DOCS.exists() or _START not in _DOCS.read_text(encoding="utf-8"):
        pytest.skip("docs/configuration.md with the settings-table markers is written by the docs change")
    page = _DOCS.read_text(encoding="utf-8")
    embedded = page.split(_START, 1)[1].split(_END, 1)[0]

    assert embedded.strip() == settings_table().strip(), "regenerate: python -m mcp_sandbox.config.reference"


def test_a_short_runner_token_is_refused_naming_the_variable_its_user_set() -> None:
    with pytest.raises(ConfigError, match=r"^MCP_API_TOKEN: a token must be"):
        load_config(env={"MCP_API_TOKEN": "your-token"})
    with pytest.raises(ConfigError, match=r"^MCP_SANDBOX_TOKEN: a token must be"):
        load_config(env={"MCP_SANDBOX_TOKEN": "your-token"})


def test_the_runners_variables_alone_make_runner_replies_the_default() -> None:
    assert load_settings(env={"MCP_HTTP_ADDR": ":8080"}).output_mode == "runner"
    assert load_settings(env={"MCP_API_TOKEN": "x" * 20, "MCP_SANDBOX_OUTPUT_MODE": "json"}).output_mode == "json"
    assert load_settings(env={"MCP_SANDBOX_TOKEN": "x" * 20}).output_mode == "compact"


@pytest.mark.parametrize("url", ["http://[fd00::1]:8765", "https://[::1]", "http://10.0.0.11:8765", "http://a.example"])
def test_a_replica_url_with_any_address_family_is_accepted(url: str) -> None:
    assert load_settings(env={"MCP_SANDBOX_REPLICA_URL": url}).replicas.replica_url == url


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://fd00::1:8765", "IPv6 address without brackets"),  # what $(POD_IP) made on an IPv6 cluster
        ("http://10.0.0.11:port", "no valid port"),
        ("http://10.0.0.11:99999", "no valid port"),
    ],
)
def test_a_replica_url_that_cannot_be_reached_as_written_is_refused_naming_why(url: str, said: str) -> None:
    with pytest.raises(ConfigError, match=f"^replica_url: .*{said}"):
        load_settings(env={"MCP_SANDBOX_REPLICA_URL": url})


_REPLICA = {"MCP_SANDBOX_REPLICA_URL": "https://10.0.0.11:8766"}
_TLS = {"MCP_SANDBOX_INTERNAL_CERT": "/etc/replica.pem", "MCP_SANDBOX_INTERNAL_KEY": "/etc/replica.key"}


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"MCP_SANDBOX_INTERNAL_PORT": "8766"}, "^internal_port: .*set replica_url"),
        ({**_REPLICA, "MCP_SANDBOX_INTERNAL_PORT": "8765"}, "^internal_port: 8765 is the public port"),
        ({**_REPLICA, "MCP_SANDBOX_INTERNAL_PORT": "0"}, "^internal_port: 0 is not a TCP port"),
        ({**_REPLICA, "MCP_SANDBOX_INTERNAL_PORT": "8766", "MCP_SANDBOX_INTERNAL_CERT": "/c.pem"}, "set both"),
        ({**_REPLICA, **_TLS}, "^internal_cert: .*set internal_port"),
        (
            {**_TLS, "MCP_SANDBOX_REPLICA_URL": "http://10.0.0.11:8766", "MCP_SANDBOX_INTERNAL_PORT": "8766"},
            "^replica_url: .*https://",
        ),
    ],
    ids=["without-replicas", "the-public-port", "not-a-port", "cert-without-key", "tls-without-port", "plain-url"],
)
def test_an_internal_listener_that_does_not_fit_is_refused_naming_the_setting(env: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        load_config(env={**env, "MCP_SANDBOX_DATABASE_URL": "postgresql://app@db/app"}).serving("http")


def test_an_internal_listener_on_a_port_of_its_own_with_tls_is_accepted() -> None:
    env = {**_REPLICA, **_TLS, "MCP_SANDBOX_INTERNAL_PORT": "8766", "MCP_SANDBOX_DATABASE_URL": "postgresql://db/app"}
    http = load_config(env=env).serving("http").http

    assert (http.internal_port, http.internal_host, http.internal_verify_clients) == (8766, None, True)
    assert http.internal_cert == Path("/etc/replica.pem")
