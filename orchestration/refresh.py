"""Refresh automation: a sensor on the landing area and a schedule (both register a refresh and start its
intake), and the automation sensor that carries a refresh downstream through the eager data assets.

Training is never started by these unless `refresh.train: true` (then `training_run` is eager too).
"""

from __future__ import annotations

import warnings

import dagster as dg

from assets.curation import FILTERED, RAW
from assets.partitions import LOADED_CONFIG, partition_key, refresh_partitions
from kiln.common.config import ConfigError
from kiln.governance.forget import REQUESTS, load_requests
from kiln.governance.refresh import load_refreshes, never_read, next_refresh
from resources import KilnConfig, KilnStorage

_settings = LOADED_CONFIG.refresh
INTAKE = [dg.AssetKey(RAW), dg.AssetKey(FILTERED)]


def refresh_runs(context, kiln_config: KilnConfig, storage: KilnStorage, trigger: str
                 ) -> list[dg.RunRequest] | dg.SkipReason:
    """Register what is new (see `kiln.governance.refresh.next_refresh`), mirror the store's refreshes into Dagster's
    dynamic partitions, and request the intake (raw + filtered documents) of every source for a new refresh, and
    for any registered one whose intake never started; the automation sensor takes it from there."""
    config, store = kiln_config.load(), storage.store()
    # Partitions added by hand in the UI and not read yet take what has landed, in the order they were added.
    added = context.instance.get_dynamic_partitions(refresh_partitions.name)
    _, landing = next_refresh(store, config, trigger, config.refresh.sensor.settle_seconds, waiting=added)
    if landing is not None:
        for folder in landing.unknown_sources:
            context.log.warning(f"landing folder {folder!r} names no declared source; its files are left alone "
                                f"(sources: {', '.join(s.name for s in config.sources)})")
    refreshes = load_refreshes(store)
    known = set(context.instance.get_dynamic_partitions(refresh_partitions.name))
    missing = [r.key for r in refreshes if r.key not in known]
    if missing:  # the store is the source of truth; Dagster's partitions follow it
        context.instance.add_dynamic_partitions(refresh_partitions.name, missing)
    # Registering is done by the evaluation; submitting its requests is not (a "Test sensor" preview, a tick that
    # timed out or failed to submit): a refresh without raw documents is requested again, with the same run keys,
    # and started once (a run in progress or failed is not started again). Dagster skips a run key only among the
    # runs of the instigator asking (a sensor's by its name, a schedule's by its tick's time): the landing sensor
    # and the refresh schedule both ask for every refresh not read yet, so each skips the run keys either one
    # started (its intake still running, or failed).
    todo = never_read(store, [s.name for s in config.sources], refreshes)
    requests = [dg.RunRequest(run_key=f"refresh-{r.key}-{s.name}", partition_key=partition_key(s.name, r.key),
                              asset_selection=INTAKE, tags={"kiln/refresh": r.key, "kiln/trigger": trigger})
                for r in todo for s in config.sources]
    requests = [r for r in requests if not _started(context.instance, r.run_key)]
    if todo and not requests:
        return dg.SkipReason(f"the intake of refresh {', '.join(r.key for r in todo)} has already been started "
                             f"(by the landing sensor or the refresh schedule); nothing new under "
                             f"{config.refresh.landing_path()}/<source>/")
    if not requests:
        settling = f"; {landing.settling} file(s) still settling" if landing and landing.settling else ""
        return dg.SkipReason(f"no new files under {config.refresh.landing_path()}/<source>/{settling}")
    return requests


RUN_KEY_TAG = "dagster/run_key"  # the tag Dagster gives a run started for a run request's run_key


def _started(instance: dg.DagsterInstance, run_key: str) -> bool:
    """Whether any instigator started a run for `run_key` (the landing sensor, the refresh schedule)."""
    return bool(instance.get_run_ids(dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1))


def _status(enabled: bool, kind):
    return kind.RUNNING if enabled else kind.STOPPED


@dg.sensor(name="landing_sensor", target=INTAKE, minimum_interval_seconds=_settings.sensor.interval_seconds,
           default_status=_status(_settings.sensor.enabled, dg.DefaultSensorStatus),
           description="New files under <landing>/<source>/ become a refresh (the first tick reads the configured "
                       "sources): registers it and starts its intake.")
def landing_sensor(context: dg.SensorEvaluationContext, kiln_config: KilnConfig, storage: KilnStorage):
    return refresh_runs(context, kiln_config, storage, "sensor")


def _refresh_schedule(context: dg.ScheduleEvaluationContext, kiln_config: KilnConfig, storage: KilnStorage):
    return refresh_runs(context, kiln_config, storage, "schedule")


try:  # Dagster's own cron check (its field ranges: minute 0-59, ...), with the config's key named
    refresh_schedule = dg.schedule(
        name="refresh_schedule", target=INTAKE, cron_schedule=_settings.schedule.cron,
        execution_timezone=_settings.schedule.timezone,
        default_status=_status(_settings.schedule.enabled, dg.DefaultScheduleStatus),
        description="The periodic corpus refresh (refresh.schedule.cron, default weekly): whatever landed since the "
                    "last refresh becomes the next one.")(_refresh_schedule)
except dg.DagsterInvalidDefinitionError as exc:
    raise ConfigError(f"refresh.schedule.cron: {_settings.schedule.cron!r} is not a schedule Dagster can run "
                      f"({exc}); write 5 fields in their ranges (minute 0-59, hour 0-23, day 1-31, month 1-12, "
                      f"weekday 0-6), e.g. '0 3 * * 1' for Mondays 03:00") from None


@dg.sensor(name="removal_requests_sensor", minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="A removal request recorded by `kiln forget` becomes a new version of the removal_requests "
                       "asset, so the quality filter and the token shards that apply it show as stale (and, under "
                       "automation, follow it).")
def removal_requests_sensor(context: dg.SensorEvaluationContext, storage: KilnStorage):
    requests, version = load_requests(storage.store())
    if version is None or version == context.cursor:
        return dg.SkipReason("no removal request since the last tick")
    event = dg.AssetMaterialization(REQUESTS, metadata={"requests": len(requests),
                                                        "latest": requests[-1].request_id if requests else None},
                                    tags={"dagster/data_version": version})  # Dagster's data version tag
    return dg.SensorResult(asset_events=[event], cursor=version)


with warnings.catch_warnings():  # use_user_code_server is beta in Dagster 1.13
    warnings.simplefilter("ignore", dg.BetaWarning)
    automation_sensor = dg.AutomationConditionSensorDefinition(
        "kiln_automation", target=dg.AssetSelection.all(), minimum_interval_seconds=30,
        # evaluated in the code location: EarlierRefreshesDone (assets.partitions) is Kiln's own condition
        use_user_code_server=True,
        default_status=_status(_settings.automation, dg.DefaultSensorStatus),
        description="Declarative automation: a refresh's curation, dedup, quality and token shards follow its intake "
                    "(refresh.automation); training only with refresh.train: true.")
