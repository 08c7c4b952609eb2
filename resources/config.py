
import dagster as dg

from kiln.common.config import ProjectConfig, config_path, load_config


class KilnConfig(dg.ConfigurableResource):
    """The project config file (`KILN_CONFIG`); validated on every load so a bad edit fails loudly."""

    path: str = str(config_path())

    def load(self) -> ProjectConfig:
        return load_config(self.path)
