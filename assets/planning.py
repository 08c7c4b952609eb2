"""Planning: the run plan (model size, tokens, cost, layout, memory, checkpoint interval) from config."""

import json

import dagster as dg

from assets.tokens import SHARDS
from kiln.common.config import kiln_home
from kiln.common.manifest import code_version
from kiln.common.storage import IncompleteDataset
from kiln.governance.refresh import latest
from kiln.planning import own_mfu
from kiln.planning.plan import make_plan
from resources import KilnConfig, KilnStorage

PLAN = "training_plan"


@dg.asset(key=PLAN, deps=[SHARDS], group_name="planning", kinds={"python", "json"},
          code_version=code_version("kiln.planning"))
def training_plan(context: dg.AssetExecutionContext, kiln_config: KilnConfig,
                  storage: KilnStorage) -> dg.MaterializeResult:
    """How big a model, how many tokens, GPU-hours, days, parallelism and memory per GPU for the budget;
    data sufficiency from the newest token shards' per-source token counts when they exist."""
    config, store = kiln_config.load(), storage.store()
    request, inputs = config.planning, {}
    if not request.available_tokens:
        try:
            refresh, shards = latest(store, SHARDS)
        except IncompleteDataset:
            context.log.info("token_shards not materialized: data sufficiency needs planning.available_tokens")
        else:
            available = {name: s["natural_train_tokens"] for name, s in shards.stats["sources"].items()}
            weights = {k: v for k, v in config.mixture.weights.items() if v > 0 and k in available}
            request = type(request).model_validate({**request.model_dump(), "available_tokens": available,
                                                    "mixture_weights": weights})
            inputs[f"{SHARDS}/{refresh}"] = shards.data_version
    plan = make_plan(request, throughputs=own_mfu.runs_in(kiln_home() / "runs"))  # Kiln's MFU unless the config has one
    with store.staging(PLAN) as writer:
        (writer.dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2, default=str))
        (writer.dir / "plan.txt").write_text(plan.render())
        manifest = writer.commit(code_version=context.assets_def.code_versions_by_key[context.asset_key],
                                 config={"planning": request.model_dump(mode="json")}, inputs=inputs, counts={})
    return dg.MaterializeResult(
        metadata={"plan": dg.MetadataValue.md(f"```\n{plan.render()}\n```"),
                  "plan_json": dg.MetadataValue.json(json.loads(json.dumps(plan.to_dict(), default=str))),
                  "path": dg.MetadataValue.path(str(store.dataset_dir(PLAN)))},
        data_version=dg.DataVersion(manifest.data_version))
