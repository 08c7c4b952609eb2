import dagster as dg

from kiln.common.config import EngineSettings
from kiln.engine import Engine, engine_for


class KilnEngine(dg.ConfigurableResource):
    """Where the per-document stages run: the project config's `engine:` section (Ray by default: an embedded
    local Ray, `RAY_ADDRESS`, or `engine.ray_address`). A deployment may set `ray_address` here instead
    (e.g. `dg.EnvVar("KILN_RAY_ADDRESS")`), which wins over the config file.

    A small resource of Kiln's own rather than dagster-ray's: dagster-ray's resources connect through Ray
    Client by default (which Ray advises against for data and ML work; Kiln joins as a driver) or run a plain `ray.init()` per step, and the
    same engine must also serve the CLI and the benches, outside Dagster (`kiln.engine`)."""

    ray_address: str | None = None

    def get(self, settings: EngineSettings) -> Engine:
        if self.ray_address:
            settings = settings.model_copy(update={"ray_address": self.ray_address})
        return engine_for(settings)
