"""Typed configuration: one schema, YAML files with `extends:` inheritance, dotted `key=value` overrides.

Every hyperparameter is declared exactly once, in recipes/config/schema.py, with its default and its meaning (the
`help` metadata). `load_config(path, overrides)` (recipes/config/load.py) returns a validated `Config`; any problem
raises `base.errors.ConfigError` with the file, key, expected type and value named.
"""

from recipes.config.load import (
    config_from_dict,
    load_config,
    load_yaml_tree,
    parse_override,
    split_overrides,
    to_dict,
    to_yaml,
)
from recipes.config.reference import reference_table
from recipes.config.schema import (
    DOMAINS,
    AllreduceName,
    CheckpointConfig,
    CommConfig,
    Config,
    DataConfig,
    DawnbenchConfig,
    DistConfig,
    InputName,
    LogConfig,
    ModelConfig,
    ModelName,
    OptimConfig,
    OptimizerName,
    Phase,
    RunConfig,
    domain_text,
)

__all__ = [
    "DOMAINS",
    "AllreduceName",
    "CheckpointConfig",
    "CommConfig",
    "Config",
    "DataConfig",
    "DawnbenchConfig",
    "DistConfig",
    "InputName",
    "LogConfig",
    "ModelConfig",
    "ModelName",
    "OptimConfig",
    "OptimizerName",
    "Phase",
    "RunConfig",
    "config_from_dict",
    "domain_text",
    "load_config",
    "load_yaml_tree",
    "parse_override",
    "reference_table",
    "split_overrides",
    "to_dict",
    "to_yaml",
]
