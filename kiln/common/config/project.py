"""The root config model: every section, and the checks that span sections."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from kiln.common.config.base import Strict
from kiln.common.config.card import CardSettings
from kiln.common.config.curation import Curation, Reading, Source, StepSpec
from kiln.common.config.dedup import Decontamination, Dedup
from kiln.common.config.engine import EngineSettings
from kiln.common.config.evaluation import EvaluationSettings
from kiln.common.config.quality import Quality
from kiln.common.config.refresh import RefreshSettings
from kiln.common.config.storage import StorageSettings
from kiln.common.config.tokens import Mixture, ShardSettings, TokenizerSettings
from kiln.common.strict import BOOLEAN_KEY
from kiln.curation.filters.language import LANGUAGES
from kiln.curation.filters.registry import build_step
from kiln.planning.plan import PlanRequest
from training_jobs.settings import TrainingSettings
from training_jobs.span_lengths import sentinel_problem


def _per_language(key: str, name: str, value, after_language: bool) -> dict[str, dict]:
    """A step's `per_language` settings, checked: known language codes, a mapping of parameters each, and the
    language step before the step (it writes the `language` each document is judged by). The parameters themselves
    are checked as each language runs with them, over the profile's (build_step: `per_language.<code>: ...`)."""
    if not value:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{key}.per_language must map language codes to parameters, e.g. {{zh: {{min_doc_words: "
                         f"50}}}}; got {value!r}")
    if name == "language":
        raise ValueError(f"{key}.per_language: the language step decides each document's language, so it has no "
                         "per-language settings; set them on the steps after it")
    if not after_language:
        raise ValueError(f"{key}.per_language: documents get their language from the `language` step, which must "
                         f"run before {name!r}: move `- language` above `- {name}` in the profile (or add it)")
    for language, params in value.items():
        if isinstance(language, bool):  # `no:` (Norwegian) as YAML reads it
            raise ValueError(f"{key}.per_language: a language code read as {language}: {BOOLEAN_KEY}")
        if language not in LANGUAGES:
            raise ValueError(f"{key}.per_language: unknown language code {language!r}; use the ISO 639-1 codes the "
                             f"language step identifies, such as de, fr, ja, ru, zh")
        if not isinstance(params, dict):
            raise ValueError(f"{key}.per_language.{language} must be a mapping of {name}'s parameters, got {params!r}")
    return value


class ProjectConfig(Strict):
    sources: list[Source] = Field(min_length=1)
    profiles: dict[str, list[StepSpec]]
    reading: Reading = Reading()
    curation: Curation = Curation()
    dedup: Dedup = Dedup()
    decontamination: Decontamination = Decontamination()
    planning: PlanRequest = PlanRequest()  # `kiln plan` and the training_plan asset start from these
    training: TrainingSettings = TrainingSettings()  # the model, optimizer, schedule, checkpoints, monitor
    evaluation: EvaluationSettings = EvaluationSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()
    mixture: Mixture = Mixture()
    shards: ShardSettings = ShardSettings()
    quality: Quality = Quality()
    storage: StorageSettings = StorageSettings()  # local files, or S3 with KILN_HOME as the cache
    refresh: RefreshSettings = RefreshSettings()  # new raw data: landing area, schedule, sensor, automation
    engine: EngineSettings = EngineSettings()  # Ray (embedded, or a cluster) or a local process pool
    card: CardSettings = CardSettings()  # the data card's statements (intended use, limitations) and licence fields

    @field_validator("profiles", mode="before")
    @classmethod
    def _parse_profiles(cls, value):
        """Accept `- gopher_quality` or `- gopher_quality: {min_doc_words: 20, per_language: {zh: {...}}}` and check
        each step."""
        if not isinstance(value, dict):
            return value
        parsed, problems = {}, []
        for profile, steps in value.items():
            if not isinstance(steps, list):
                raise ValueError(f"profile {profile!r} must be a list of steps, got {steps!r}")
            specs = []
            for i, item in enumerate(steps):
                per_language = None
                if isinstance(item, str):
                    name, params = item, {}
                elif isinstance(item, dict) and {"step", "params"} <= set(item) <= {"step", "params", "per_language"}:
                    name, params, per_language = item["step"], item["params"], item.get("per_language")  # read back
                elif isinstance(item, dict) and len(item) == 1:
                    (name, params), = item.items()
                    params = params or {}
                else:
                    raise ValueError(f"profiles.{profile}[{i}]: expected a step name or {{name: {{params}}}}, got {item!r}")
                if not isinstance(name, str):
                    raise ValueError(f"profiles.{profile}[{i}]: a step's name is a string, got {name!r}")
                key = f"profiles.{profile}[{i}] ({name})"
                if not isinstance(params, dict):
                    raise ValueError(f"{key}: its parameters are a mapping of name: value, got {params!r}; write "
                                     f"`- {name}: {{parameter: value}}`, or `- {name}` for its defaults")
                if per_language is None:
                    params = dict(params)
                    per_language = params.pop("per_language", None)
                per_language = _per_language(key, name, per_language, after_language="language" in [
                    s["step"] for s in specs])
                try:
                    build_step(name, params, per_language)
                except (TypeError, ValueError) as exc:  # `per_language.de: ...` continues the key
                    problems.append(f"{key}{'.' if str(exc).startswith('per_language.') else ': '}{exc}")
                specs.append({"step": name, "params": params, "per_language": per_language})
            parsed[profile] = specs
        if problems:  # every step's, one line each as the loader shows the config's other errors (loading._describe)
            raise ValueError("\n  profiles: ".join(problems))
        return parsed

    @model_validator(mode="after")
    def _consistent(self):
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique; repeated: {dupes}")
        for s in self.sources:
            if s.profile not in self.profiles:
                raise ValueError(f"source {s.name!r} uses profile {s.profile!r}, which is not defined; "
                                 f"defined profiles: {sorted(self.profiles)}")
        return self

    @model_validator(mode="after")
    def _recipes_have_what_they_need(self):
        if self.mixture.replay is not None and self.training.base_checkpoint is None:
            raise ValueError("mixture.replay mixes earlier data into a continued run: set training.base_checkpoint "
                             "(a checkpoint folder, or `latest`), or remove mixture.replay")
        if "safetensors" not in self.training.export:
            raise ValueError(f"training.export {self.training.export}: the checkpoint asset publishes and evaluates "
                             f"the safetensors export, so the list must hold safetensors (hf beside it is optional)")
        phases = [p.name for p in self.mixture.phases] or ["main"]
        unknown = sorted(set(self.training.phases or []) - set(phases))
        if unknown:
            raise ValueError(f"training.phases names {unknown}, which mixture.phases does not define (phases: "
                             f"{phases}); a run reads curriculum phases of its token shards by name")
        # Every phase of a run reads windows of its one seq_len. A brought tokenizer's sentinels are counted from its
        # file, at launch (assets.training.check_sentinels).
        if self.training.objective == "span_corruption" and self.tokenizer.source == "train":
            seq_len, key = ((self.training.seq_len, "training.seq_len") if self.training.seq_len
                            else (self.shards.seq_len, "shards.seq_len"))
            problem = sentinel_problem(seq_len, key, self.tokenizer.sentinel_tokens,
                                       f"tokenizer.sentinel_tokens is {self.tokenizer.sentinel_tokens}",
                                       "set tokenizer.sentinel_tokens to ≥ {need} (T5 uses 100) so the tokenizer "
                                       "reserves that many <extra_id_N>")
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _mixture_names_sources(self):
        """Weights and FIM sources must name declared sources; non-empty weights must name all of them,
        so adding a source never silently drops it from (or adds it to) training."""
        names = [s.name for s in self.sources]
        tables = [("mixture.weights", self.mixture.weights)]
        tables += [(f"mixture.phases[{i}].weights", p.weights) for i, p in enumerate(self.mixture.phases)]
        for key, weights in tables:
            unknown = sorted(set(weights) - set(names))
            if unknown:
                raise ValueError(f"{key} names unknown source {unknown[0]!r}; sources: {names}")
            missing = [n for n in names if n not in weights]
            if weights and missing:
                raise ValueError(f"{key} gives no weight to source(s) {missing}; list every source (weight 0 "
                                 f"leaves one out) or leave {key} empty for natural proportions")
        unknown_fim = sorted(set(self.shards.fim.sources or []) - set(names))
        if unknown_fim:
            raise ValueError(f"shards.fim.sources names unknown source {unknown_fim[0]!r}; sources: {names}")
        return self

    @model_validator(mode="after")
    def _quality_names_sources(self):
        names = [s.name for s in self.sources]
        q = self.quality
        for key, listed in [("quality.rules", list(q.rules)), ("quality.classifier.positive_sources",
                             q.classifier.positive_sources or []), ("quality.classifier.negative_sources",
                                                                     q.classifier.negative_sources or [])]:
            unknown = sorted(set(listed) - set(names))
            if unknown:
                raise ValueError(f"{key} names unknown source {unknown[0]!r}; sources: {names}")
        positives, negatives = self.quality_classes()
        if q.classifier.enabled is True and not (positives and negatives):
            raise ValueError("quality.classifier needs positive and negative sources: set "
                             "quality.classifier.positive_sources / negative_sources (defaults: domain 'reference' "
                             "/ 'web'), or set quality.classifier.enabled: false")
        if set(positives) & set(negatives):
            raise ValueError(f"quality.classifier: {sorted(set(positives) & set(negatives))} is both positive and "
                             "negative; a source belongs to one class")
        for name, rule in q.rules.items():
            if rule.uses_score and not self.quality_classifier_enabled:
                raise ValueError(f"quality.rules.{name} filters on the classifier score, but the classifier is off "
                                 f"(quality.classifier.enabled: {q.classifier.enabled}; positive sources {positives}, "
                                 f"negative sources {negatives}); enable it or drop min_score / keep_top_fraction")
            if rule.uses_perplexity and not q.perplexity.model:
                raise ValueError(f"quality.rules.{name} filters on perplexity, but quality.perplexity.model is not "
                                 "set; point it at a Kiln checkpoint folder or drop the perplexity rule")
        return self

    @model_validator(mode="after")
    def _card_names_sources(self):
        names = [s.name for s in self.sources]
        unknown = sorted(set(self.card.license_fields) - set(names))
        if unknown:
            raise ValueError(f"card.license_fields names unknown source {unknown[0]!r}; sources: {names}")
        return self

    @property
    def quality_classifier_enabled(self) -> bool:
        positives, negatives = self.quality_classes()
        enabled = self.quality.classifier.enabled
        return enabled is True or (enabled == "auto" and bool(positives) and bool(negatives))

    def quality_classes(self) -> tuple[list[str], list[str]]:
        """The classifier's positive (reference) and negative (web) sources."""
        c = self.quality.classifier
        positives = c.positive_sources if c.positive_sources is not None else [
            s.name for s in self.sources if s.domain == "reference"]
        negatives = c.negative_sources if c.negative_sources is not None else [
            s.name for s in self.sources if s.domain == "web"]
        return positives, negatives

    def source(self, name: str) -> Source:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(f"no source named {name!r}; sources: {[s.name for s in self.sources]}")

    def profile_for(self, source: str) -> list[StepSpec]:
        return self.profiles[self.source(source).profile]
