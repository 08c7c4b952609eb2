"""Planning: the run plan (model size, tokens, cost, layout, memory, checkpoint interval) from config."""

import json

import dagster as dg

from kiln.manifest import code_version
from kiln.planning.plan import make_plan
from resources import KilnConfig, KilnStorage

PLAN = "training_plan"


@dg.asset(key=PLAN, group_name="planning", kinds={"python", "json"}, code_version=code_version("kiln.planning"))
def training_plan(context: dg.AssetExecutionContext, kiln_config: KilnConfig,
                  storage: KilnStorage) -> dg.MaterializeResult:
    """How big a model, how many tokens, GPU-hours, days, parallelism and memory per GPU for the budget."""
    config, store = kiln_config.load(), storage.store()
    plan = make_plan(config.planning)
    with store.staging(PLAN) as writer:
        (writer.dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2, default=str))
        (writer.dir / "plan.txt").write_text(plan.render())
        manifest = writer.commit(code_version=context.assets_def.code_versions_by_key[context.asset_key],
                                 config={"planning": config.planning.model_dump(mode="json")}, inputs={}, counts={})
    return dg.MaterializeResult(
        metadata={"plan": dg.MetadataValue.md(f"```\n{plan.render()}\n```"),
                  "plan_json": dg.MetadataValue.json(json.loads(json.dumps(plan.to_dict(), default=str))),
                  "path": dg.MetadataValue.path(str(store.dataset_dir(PLAN)))},
        data_version=dg.DataVersion(manifest.data_version))
