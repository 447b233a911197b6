"""compose.yaml's structure: no Docker engine runs here, so the file itself is checked.

The variables are interpolated the way ``docker compose`` does (``${X}``, ``${X:-default}``,
``${X:?error}``, ``$$`` for a literal ``$``) with the values of ``.env.example``, and the worker
commands are checked against the lane plan the workers compute from the same settings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from celery_app.settings import load_settings
from workers.roles import plan_role

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "compose.yaml"
ENV_EXAMPLE = REPO / ".env.example"
VARIABLE = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}")
SECRETS = (
    "CHECKBEAT_REDIS_PASSWORD",
    "CHECKBEAT_FLOWER_PASSWORD",
    "CHECKBEAT_METRICS_BEARER_TOKEN",
)
SCRAPE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"


def env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation of one string (``$$`` stays a literal ``$``)."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        value = env.get(name, "")
        if op == ":?" and not value:
            raise KeyError(f"{name} is required: {arg}")
        if op == ":-" and not value:
            return arg
        return value

    return VARIABLE.sub(one, text.replace("$$", "\0")).replace("\0", "$")


def resolved(node: object, env: dict[str, str]) -> object:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [resolved(item, env) for item in node]
    if isinstance(node, dict):
        return {key: resolved(value, env) for key, value in node.items()}
    return node


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def compose(raw) -> dict:
    return resolved(raw, env_example())


def command_of(service: dict) -> list[str]:
    command = service["command"]
    return command if isinstance(command, list) else command.split()


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_services_are_the_deployment(compose):
    assert set(compose["services"]) == {
        "redis",
        "beat",
        "worker-fast",
        "worker-shared",
        "worker-tasks",
        "flower",
        "pings",
    }


def test_the_ping_endpoint_is_served_on_its_published_port(compose):
    pings = compose["services"]["pings"]
    command = command_of(pings)
    assert command[:5] == ["celery", "-A", "celery_app", "checks", "serve-pings"]
    port = option(command, "--bind").rsplit(":", 1)[1]
    assert pings["ports"] == [f"{env_example()['CHECKBEAT_PINGS_PORT']}:{port}"]


def test_a_worker_runs_cron_tasks_from_the_default_queue(compose):
    command = command_of(compose["services"]["worker-tasks"])
    assert command[:4] == ["celery", "-A", "celery_app", "worker"]
    assert "--role" not in command
    assert option(command, "-Q").split(",")[0] == "celery"
    assert int(option(command, "-c")) >= 1
    # Only a pool with child processes enforces a cron task's hard time limit.
    assert option(command, "-P") == "prefork"


def test_checkbeat_up_runs_cron_tasks_on_the_same_pool_as_compose(compose):
    from celery_app.local.up import worker_specs

    specs = {spec.name: spec for spec in worker_specs({}, ("local",), "threads")}
    argv = specs["worker-tasks"].argv
    assert argv[argv.index("--pool") + 1] == option(
        command_of(compose["services"]["worker-tasks"]), "-P"
    )
    lanes = [spec for name, spec in specs.items() if name != "worker-tasks"]
    assert lanes and all(s.argv[s.argv.index("--pool") + 1] == "threads" for s in lanes)


def test_redis_has_aof_and_a_password_from_the_environment(raw, compose):
    redis = compose["services"]["redis"]
    script = " ".join(command_of(redis))
    assert "--appendonly yes" in script
    assert '--requirepass "$CHECKBEAT_REDIS_PASSWORD"' in script
    assert (
        "${CHECKBEAT_REDIS_PASSWORD"
        in raw["services"]["redis"]["environment"]["CHECKBEAT_REDIS_PASSWORD"]
    )
    assert redis["environment"]["CHECKBEAT_REDIS_PASSWORD"] == env_example()[SECRETS[0]]
    assert "redis-data:/data" in redis["volumes"]


def test_every_app_service_reaches_redis_with_the_password(compose):
    password = env_example()["CHECKBEAT_REDIS_PASSWORD"]
    for name, service in compose["services"].items():
        if name == "redis":
            continue
        env = service["environment"]
        for variable in ("CHECKBEAT_REDIS_URL", "CHECKBEAT_BROKER_URL"):
            assert env[variable].startswith(f"redis://:{password}@redis:6379/"), (name, variable)
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        # The settings the service gets are valid checkbeat settings.
        settings = load_settings(
            **{k.removeprefix("CHECKBEAT_").lower(): v for k, v in env.items() if v}
        )
        assert settings.redis_url.endswith("@redis:6379/1")


def test_one_beat(compose):
    beats = [s for s in compose["services"].values() if "beat" in command_of(s)]
    assert len(beats) == 1
    assert command_of(beats[0])[:4] == ["celery", "-A", "celery_app", "beat"]


@pytest.mark.parametrize(
    ("service", "role", "queues", "slots"),
    [
        ("worker-fast", "fast", ("checks.local.fast",), 2),
        ("worker-shared", "shared", ("checks.local.fast", "checks.local.slow"), 6),
    ],
)
def test_workers_consume_their_lanes_with_their_slots(compose, service, role, queues, slots):
    spec = compose["services"][service]
    command = command_of(spec)
    assert command[:4] == ["celery", "-A", "celery_app", "worker"]
    assert option(command, "--role") == role
    assert option(command, "-P") == "threads"  # probes are I/O bound
    assert "-E" in command  # task events, so Flower shows the runs
    env = spec["environment"]
    settings = load_settings(
        regions=env["CHECKBEAT_REGIONS"],
        pool_size=int(env["CHECKBEAT_POOL_SIZE"]),
        fast_lane_reserved=int(env["CHECKBEAT_FAST_LANE_RESERVED"]),
    )
    plan = plan_role(option(command, "--role"), option(command, "--region"), settings)
    assert (plan.queues, plan.concurrency) == (queues, slots)


def test_flower_has_basic_auth_from_the_environment(raw, compose):
    flower = compose["services"]["flower"]
    assert command_of(flower)[:4] == ["celery", "-A", "celery_app", "flower"]
    values = env_example()
    expected = f"{values['CHECKBEAT_FLOWER_USER']}:{values['CHECKBEAT_FLOWER_PASSWORD']}"
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == expected
    assert (
        "CHECKBEAT_FLOWER_PASSWORD:?"
        in raw["services"]["flower"]["environment"]["FLOWER_BASIC_AUTH"]
    )


def test_secrets_are_required_and_never_written_in_the_file():
    text = COMPOSE.read_text()
    for secret in SECRETS:
        assert f"${{{secret}:?" in text, f"{secret} must be required (${{{secret}:?...}})"
        with pytest.raises(KeyError, match=secret):
            resolved(yaml.safe_load(text), {k: v for k, v in env_example().items() if k != secret})
    for value in (env_example()[s] for s in SECRETS):
        assert value not in text
    assert not re.search(r"redis://:[^$@]+@", text), "a literal password in a Redis URL"
    assert not re.search(r"requirepass\s+[^\s\"$]", text), "a literal requirepass"
    assert ".env" in (REPO / ".gitignore").read_text().split()


def test_every_variable_is_a_documented_checkbeat_variable():
    text = COMPOSE.read_text()
    documented = set(env_example())
    used = {match["name"] for match in VARIABLE.finditer(text.replace("$$", ""))}
    assert used, "compose.yaml should be configured by variables"
    assert all(name.startswith("CHECKBEAT_") for name in used), used
    assert used <= documented, f"missing from .env.example: {sorted(used - documented)}"


@pytest.mark.parametrize("service", ["beat", "worker-fast", "worker-shared", "worker-tasks"])
def test_beat_and_workers_serve_metrics_and_their_healthcheck_asks_healthz(compose, service):
    spec = compose["services"][service]
    settings = load_settings(
        **{
            k.removeprefix("CHECKBEAT_").lower(): v
            for k, v in spec["environment"].items()
            if k.startswith("CHECKBEAT_METRICS_")
        }
    )
    port = settings.metrics_addr.rsplit(":", 1)[1]
    probe = " ".join(spec["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/healthz" in probe
    assert spec["healthcheck"]["start_period"]  # beat is unhealthy until its first tick


@pytest.mark.parametrize("service", ["beat", "worker-fast", "worker-shared", "worker-tasks"])
def test_metrics_need_the_token_and_the_healthcheck_and_prometheus_send_it(compose, service):
    spec = compose["services"][service]
    token = env_example()["CHECKBEAT_METRICS_BEARER_TOKEN"]
    settings = load_settings(
        **{
            k.removeprefix("CHECKBEAT_").lower(): v
            for k, v in spec["environment"].items()
            if k.startswith("CHECKBEAT_METRICS_")
        }
    )
    assert settings.metrics_bearer_token.get_secret_value() == token
    probe = " ".join(spec["healthcheck"]["test"])
    assert "'Authorization': 'Bearer ' + os.environ['CHECKBEAT_METRICS_BEARER_TOKEN']" in probe
    assert token not in probe


def test_the_scrape_config_sends_credentials_on_every_job():
    jobs = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    assert {job["job_name"] for job in jobs} == {
        "checkbeat-beat",
        "checkbeat-workers",
        "checkbeat-checks",
    }
    for job in jobs:
        auth = job["authorization"]
        assert auth["type"] == "Bearer" and auth["credentials_file"], job["job_name"]
        assert "credentials" not in auth  # the token is in a file, not in the config
