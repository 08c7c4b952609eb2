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


class EarlierRefreshesDone(dg.AutomationCondition):
    """True for the partitions of a refresh when this asset is done for every earlier refresh: its partitions there
    are materialized (for a per-source asset, those whose source has raw documents in that refresh, and no refresh
    is done whose intake read no source yet). For the assets
    that decide a refresh against every earlier one (`kiln.governance.refresh.require_earlier`): requested together,
    the later refresh's run would start beside the earlier one's and be refused, and nothing would ask again."""

    @property
    def name(self) -> str:
        return "earlier_refreshes_done"

    def evaluate(self, context) -> dg.AutomationResult:
        instance, key = context.asset_graph_view.instance, context.key
        order = instance.get_dynamic_partitions(refresh_partitions.name)
        done = instance.get_materialized_partitions(key)
        if context.partitions_def == document_partitions:
            def refresh_of(k: str) -> str:
                return document_partitions.get_partition_key_from_str(k).keys_by_dimension["refresh"]

            read = instance.get_materialized_partitions(dg.AssetKey("raw_documents"))
            # a source read and not done yet; or a refresh whose intake never succeeded for any source (its landed
            # files still wait to be read: the assets that decide later refreshes against it wait for it too)
            pending = {refresh_of(k) for k in read - done} | (set(order) - {refresh_of(k) for k in read})
        else:
            pending = set(order) - done
        first_pending = min((order.index(r) for r in pending if r in order), default=len(order))
        ready = {r for r in order[:first_pending + 1]}  # the first refresh not done yet may go: nothing before it waits
        candidates = context.candidate_subset.expensively_compute_partition_keys()
        if context.partitions_def == document_partitions:
            keys = {k for k in candidates if document_partitions.get_partition_key_from_str(k)
                    .keys_by_dimension["refresh"] in ready}
        else:
            keys = {k for k in candidates if k in ready}
        return dg.AutomationResult(context, context.candidate_subset.compute_intersection_with_partition_keys(keys))


# Eager, in refresh order: curation and the dedup index decide a refresh against every earlier one.
FOLLOW_IN_ORDER = (FOLLOW & EarlierRefreshesDone()).with_label("eager, in refresh order") if _AUTOMATE else None


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
