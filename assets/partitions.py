"""The partitions the data assets share: every document dataset is one source in one refresh.

The UI shows each document asset as a grid of refreshes by sources. A refresh is a dynamic partition, added
when the landing sensor, the refresh schedule or the demo registers one (`kiln.governance.refresh`), or by hand in the UI
(raw_documents then registers what has landed); assets over every source of a refresh (the dedup index, the
token shards) are partitioned by refresh alone.
"""

import warnings

import dagster as dg

from kiln.common.config import load_config
from kiln.governance.forget import REQUESTS
from kiln.governance.refresh import partition

LOADED_CONFIG = load_config()  # partitions, automation, schedule and sensor settings: read when the code location loads

refresh_partitions = dg.DynamicPartitionsDefinition(name="refresh")
source_partitions = dg.StaticPartitionsDefinition([s.name for s in LOADED_CONFIG.sources])
document_partitions = dg.MultiPartitionsDefinition({"refresh": refresh_partitions, "source": source_partitions})

with warnings.catch_warnings():  # both mappings are marked beta in Dagster 1.13; they are what this graph means
    warnings.simplefilter("ignore", dg.BetaWarning)
    # A step that compares every source (exact dedup) reads every source of the same refresh.
    SAME_REFRESH_EVERY_SOURCE = dg.MultiPartitionMapping({
        "refresh": dg.DimensionPartitionMapping("refresh", dg.IdentityPartitionMapping()),
        "source": dg.DimensionPartitionMapping("source", dg.AllPartitionMapping())})
    # Between a (refresh, source) dataset and a per-refresh one (the dedup index, the token shards).
    SAME_REFRESH = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="refresh")

# Downstream data assets follow a refresh as soon as their inputs are there (`refresh.automation`);
# training only when `refresh.train` says so.
_AUTOMATE = LOADED_CONFIG.refresh.automation
FOLLOW = dg.AutomationCondition.eager() if _AUTOMATE else None
FOLLOW_TRAINING = dg.AutomationCondition.eager() if LOADED_CONFIG.refresh.train else None
# removal_requests has no version until the first `kiln forget` (removal_requests_sensor reports one per request):
# eager would count it as a missing input and never run the quality filter. Its absence is "no request yet"; a new
# version still makes the filter follow it.
_REQUESTS = dg.AssetSelection.assets(REQUESTS)
FOLLOW_REQUESTS = FOLLOW.replace("any_deps_missing", dg.AutomationCondition.any_deps_missing().ignore(_REQUESTS)
                                 ).with_label("eager") if _AUTOMATE else None
# The token shards apply every request themselves when they run; they follow the re-filtered partitions, not the
# request (in the same tick they would run beside the filter, reading the versions it replaces).
FOLLOW_FILTERED = FOLLOW.ignore(_REQUESTS).with_label("eager") if _AUTOMATE else None
# The tokenizer and the quality classifier are fitted once, when missing and their inputs are there or updated:
# refitting them would invalidate every refresh's shards or scores. (Dagster's on_missing is only "newly missing",
# never true for an asset already missing when the automation sensor first looks.)
ONCE = (dg.AutomationCondition.eager() & dg.AutomationCondition.missing()).with_label("once") if _AUTOMATE else None


def follow_only(*keys: str) -> dg.AutomationCondition | None:
    """Eager on these dependencies alone: a checkpoint's evaluation and data card follow the checkpoint, not
    every refresh's documents (which they also read)."""
    if FOLLOW is None:
        return None
    return FOLLOW.allow(dg.AssetSelection.assets(*keys))


def source_and_refresh(context: dg.AssetExecutionContext) -> tuple[str, str]:
    keys = document_partitions.get_partition_key_from_str(str(context.partition_key)).keys_by_dimension
    return keys["source"], keys["refresh"]


def store_partition(context: dg.AssetExecutionContext) -> str:
    """Where this (source, refresh) dataset lives in the store: `<asset>/<source>/<refresh>/`."""
    return partition(*source_and_refresh(context))


def partition_key(source: str, refresh: str) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"refresh": refresh, "source": source})
