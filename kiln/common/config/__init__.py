"""The one project config: YAML (`KILN_CONFIG`, default `configs/default.yaml`) validated with pydantic.

One module per section (`curation`, `dedup`, `tokens`, `quality`, `evaluation`, `storage`, `refresh`, `engine`,
`card`),
the root model in `project`, reading and error messages naming the key and the fix in `loading`.
"""

from kiln.common.config.base import ConfigError, config_path, kiln_home
from kiln.common.config.card import CardSettings
from kiln.common.config.curation import Curation, ExactDedup, Reading, Source, StepSpec
from kiln.common.config.dedup import (
    Benchmark,
    BoilerplateLines,
    Decontamination,
    Dedup,
    NearDedup,
    ShingleNormalization,
)
from kiln.common.config.engine import EngineSettings
from kiln.common.config.evaluation import EvaluationSettings
from kiln.common.config.loading import load_config, merge_config, parse_config
from kiln.common.config.project import ProjectConfig
from kiln.common.config.quality import Quality, QualityClassifier, QualityPerplexity, QualityRule
from kiln.common.config.refresh import RefreshSettings
from kiln.common.config.storage import StorageSettings
from kiln.common.config.tokens import Fim, Mixture, Phase, ShardSettings, TokenizerSettings

__all__ = [
    "Benchmark", "BoilerplateLines", "CardSettings", "ConfigError", "Curation", "Decontamination", "Dedup", "EngineSettings",
    "EvaluationSettings", "ExactDedup", "Fim", "Mixture", "NearDedup", "Phase", "ProjectConfig", "Quality",
    "QualityClassifier", "QualityPerplexity", "QualityRule", "Reading", "RefreshSettings", "ShardSettings",
    "ShingleNormalization", "Source", "StepSpec", "StorageSettings", "TokenizerSettings", "config_path",
    "kiln_home", "load_config", "merge_config", "parse_config",
]
