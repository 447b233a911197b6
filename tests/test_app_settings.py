"""Settings of a user's own Celery app (``app.conf.checkbeat_*``) and what ``install`` adds.

In-process and fast; the same behaviour through ``celery -A proj ...`` is test_user_app's.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from celery import Celery

import celery_app
from celery_app.factory import BEAT_SCHEDULER, CRON_ROUTER, create_app, settings_of
from celery_app.settings import SettingsError, load_settings

BROKER = "redis://broker.example:6379/3"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No CHECKBEAT_* from the test session unless a test sets one."""
    for name in ("CHECKBEAT_REDIS_URL", "CHECKBEAT_BROKER_URL", "CHECKBEAT_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)


def user_app(broker: str | None = BROKER, **conf) -> Celery:
    app = Celery("proj", broker=broker, set_as_current=False)
    app.conf.update(conf)
    return app


def test_every_setting_may_be_given_in_the_apps_conf():
    app = user_app(
        checkbeat_regions=["eu", "us"],
        checkbeat_cron_grace=timedelta(seconds=30),
        checkbeat_pool_size=12,
        checkbeat_dispatch_interval="PT0.25S",
        checkbeat_allow_private_targets=True,
        checkbeat_key_prefix="acme",
    )
    settings = settings_of(app)
    assert settings.regions == ["eu", "us"]
    assert settings.cron_grace == timedelta(seconds=30)
    assert settings.pool_size == 12
    assert settings.dispatch_interval == 0.25
    assert settings.allow_private_targets is True
    assert settings.key_prefix == "acme"
    assert settings_of(app) is settings  # read once, kept on the app


def test_the_environment_overrides_the_conf(monkeypatch):
    monkeypatch.setenv("CHECKBEAT_KEY_PREFIX", "from-env")
    monkeypatch.setenv("CHECKBEAT_REGIONS", "ap")
    app = user_app(
        checkbeat_key_prefix="from-conf", checkbeat_regions=["eu"], checkbeat_pool_size=3
    )
    settings = settings_of(app)
    assert (settings.key_prefix, settings.regions, settings.pool_size) == ("from-env", ["ap"], 3)


def test_explicit_overrides_still_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("CHECKBEAT_POOL_SIZE", "5")
    assert load_settings(pool_size=7).pool_size == 7


def test_a_bad_conf_value_is_named_as_written_and_an_environment_one_as_its_variable(
    monkeypatch,
):
    with pytest.raises(SettingsError) as conf_error:
        settings_of(user_app(checkbeat_pool_size=0))
    assert "app.conf.checkbeat_pool_size=0: must be an integer >= 1" in str(conf_error.value)
    monkeypatch.setenv("CHECKBEAT_POOL_SIZE", "0")
    with pytest.raises(SettingsError) as env_error:
        settings_of(user_app(checkbeat_pool_size=4))
    assert "CHECKBEAT_POOL_SIZE='0'" in str(env_error.value)
    assert "app.conf" not in str(env_error.value)


def test_cross_field_errors_name_the_conf_keys():
    with pytest.raises(SettingsError) as error:
        settings_of(user_app(checkbeat_pool_size=2, checkbeat_fast_lane_reserved=2))
    assert (
        "app.conf.checkbeat_fast_lane_reserved (2) must be smaller than "
        "app.conf.checkbeat_pool_size (2)"
    ) in str(error.value)


def test_a_failed_read_is_not_kept():
    app = user_app(checkbeat_pool_size=0)
    with pytest.raises(SettingsError):
        settings_of(app)
    app.conf.checkbeat_pool_size = 4
    assert settings_of(app).pool_size == 4


def test_unknown_conf_keys_are_refused_with_close_matches():
    app = user_app(checkbeat_pool_sise=4, checkbeat_region=["eu"], checkbeat_zzz=1)
    with pytest.raises(SettingsError) as error:
        settings_of(app)
    message = str(error.value)
    assert "app.conf.checkbeat_pool_sise: not a checkbeat setting; did you mean " in message
    assert "checkbeat_pool_size" in message
    assert "app.conf.checkbeat_region: not a checkbeat setting; did you mean checkbeat_regions" in (
        message
    )
    assert "app.conf.checkbeat_zzz: not a checkbeat setting; `checkbeat settings`" in message


def test_a_namespaced_config_object_is_read_under_its_namespace():
    app = Celery("proj", broker=BROKER, set_as_current=False)
    app.config_from_object(
        SimpleNamespace(CELERY_CHECKBEAT_POOL_SIZE=9, CELERY_CHECKBEAT_POOL_SIZ=1),
        namespace="CELERY",
    )
    with pytest.raises(SettingsError, match=r"app.conf.CELERY_CHECKBEAT_POOL_SIZ: not a"):
        settings_of(app)
    fine = Celery("proj", broker=BROKER, set_as_current=False)
    fine.config_from_object(SimpleNamespace(CELERY_CHECKBEAT_POOL_SIZE=9), namespace="CELERY")
    assert settings_of(fine).pool_size == 9


def test_state_defaults_to_a_redis_broker_and_the_broker_is_always_the_apps(monkeypatch):
    monkeypatch.setenv("CHECKBEAT_BROKER_URL", "redis://ignored.example/0")
    settings = settings_of(user_app())
    assert settings.redis_url == BROKER
    assert settings.effective_broker_url == BROKER  # CHECKBEAT_BROKER_URL is the ready-made app's
    given = settings_of(user_app(checkbeat_redis_url="redis://state.example/1"))
    assert given.redis_url == "redis://state.example/1"
    monkeypatch.setenv("CHECKBEAT_REDIS_URL", "redis://env.example/2")
    assert settings_of(user_app(checkbeat_redis_url="redis://x/1")).redis_url == (
        "redis://env.example/2"
    )


def test_a_non_redis_broker_leaves_the_default_state_url():
    settings = settings_of(user_app(broker="amqp://guest@rabbit//"))
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.broker_url == "amqp://guest@rabbit//"


def test_checkbeat_broker_url_in_conf_is_refused():
    with pytest.raises(SettingsError, match=r"app.conf.checkbeat_broker_url: your app sends"):
        settings_of(user_app(checkbeat_broker_url="redis://other/0"))


def test_cron_timezone_defaults_to_the_apps_timezone():
    assert settings_of(user_app(timezone="Europe/Berlin")).timezone == "Europe/Berlin"
    assert settings_of(user_app()).timezone == "UTC"
    own = settings_of(user_app(timezone="Europe/Berlin", checkbeat_timezone="Asia/Tokyo"))
    assert own.timezone == "Asia/Tokyo"
    with pytest.raises(SettingsError, match=r"app.conf.timezone='Mars/Olympus'"):
        settings_of(user_app(timezone="Mars/Olympus"))


def test_an_app_refusing_json_is_refused():
    with pytest.raises(SettingsError, match=r"app.conf.accept_content=\['pickle'\]"):
        settings_of(user_app(accept_content=["pickle"]))
    both = settings_of(user_app(accept_content=["pickle", "application/json"]))
    assert both.pool_size == 8


def test_create_app_keeps_the_settings_it_was_built_with():
    settings = load_settings(pool_size=5)
    app = create_app(settings)
    app.conf.checkbeat_pool_size = 99  # never read: the app carries its settings
    assert settings_of(app) is settings
    app.close()


# --- install ---------------------------------------------------------------------------------
def test_install_adds_what_checkbeat_needs_and_keeps_the_apps_config():
    app = user_app(
        task_routes={"proj.hello": {"queue": "hello"}},
        imports=["proj.tasks"],
        task_serializer="json",
    )
    assert celery_app.install(app) is app
    assert app.conf.task_routes == [CRON_ROUTER, {"proj.hello": {"queue": "hello"}}]
    assert app.conf.imports == ["proj.tasks"]  # checkbeat's modules come with the import signal
    assert app.conf.beat_scheduler == BEAT_SCHEDULER
    assert {o.name for o in app.user_options["worker"]} == {"checkbeat_role", "checkbeat_region"}
    assert "workers.worker_step:CheckWorkerStep" in app.steps["worker"]
    celery_app.install(app)  # twice is once
    assert app.conf.task_routes.count(CRON_ROUTER) == 1
    assert len(app.user_options["worker"]) == 2


def test_install_keeps_a_chosen_scheduler_and_router_order():
    app = user_app(beat_scheduler="django_celery_beat.schedulers:DatabaseScheduler")
    app.conf.task_routes = ("a.router", CRON_ROUTER)
    celery_app.install(app)
    assert app.conf.beat_scheduler == "django_celery_beat.schedulers:DatabaseScheduler"
    assert app.conf.task_routes == ("a.router", CRON_ROUTER)  # listed already: left as it is


def test_install_before_the_config_object_is_loaded():
    app = Celery("proj", broker=BROKER, set_as_current=False)
    celery_app.install(app)
    app.config_from_object(SimpleNamespace(task_routes={"x": {"queue": "q"}}, imports=["m"]))
    assert app.conf.task_routes == [CRON_ROUTER, {"x": {"queue": "q"}}]
    assert app.conf.imports == ["m"]
    assert app.conf.beat_scheduler == BEAT_SCHEDULER


def test_an_installed_app_imports_checkbeats_modules_and_checkbeat_imports(tmp_path, monkeypatch):
    (tmp_path / "proj_extra_kinds.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = user_app(checkbeat_imports=["proj_extra_kinds"])
    celery_app.install(app)
    app.loader.import_default_modules()
    import sys

    assert "proj_extra_kinds" in sys.modules
    assert "checkbeat.run_check" in app.tasks
    assert "celery_app.cron_tasks.recording" in sys.modules


def test_an_uninstalled_app_imports_nothing_of_checkbeat(tmp_path, monkeypatch):
    (tmp_path / "proj_not_imported.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = user_app(checkbeat_imports=["proj_not_imported"])
    app.loader.import_default_modules()
    import sys

    assert "proj_not_imported" not in sys.modules


def test_the_readme_example_app_is_configured_as_it_says():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    example = readme.split("# proj/celery.py\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(example, "README proj/celery.py", "exec"), namespace)
    app = namespace["app"]
    settings = settings_of(app)
    assert settings.regions == ["eu", "us"]
    assert settings.cron_grace == timedelta(seconds=30)
    assert settings.redis_url == "redis://localhost:6379/0"  # the broker holds the state
    assert app.conf.beat_scheduler == BEAT_SCHEDULER
    assert CRON_ROUTER in app.conf.task_routes
