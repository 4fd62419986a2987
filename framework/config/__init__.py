"""Checking and building objects from config mappings, guided by constructor annotations.

`validate(config)` walks a `framework run` config (or one component's config) and
returns every error, each with its dotted path and a did-you-mean, building nothing.
`construct(Annotation, value)` runs the same walk to check, then again to build: a
mapping with `"type"` becomes the registered subclass of a `Registrable`; lists,
dicts, tuples, unions, literals, enums and paths are converted element by element;
`Lazy[T]` defers construction until `Lazy.construct(**extras)`. `json_schema()`
describes the same configs for editors. Every error is a `ConfigError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from typing import Any, Union

from framework.config._annotations import is_typed_dict as is_typed_dict
from framework.config._annotations import typed_dict_fields as typed_dict_fields
from framework.config._construct import MAX_DEPTH as MAX_DEPTH
from framework.config._construct import Lazy as Lazy
from framework.config._construct import construct as construct
from framework.config._json_schema import json_schema as json_schema
from framework.config._load import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES
from framework.config._load import load_config as load_config
from framework.config._signatures import AtLeast as AtLeast
from framework.config._signatures import ConfigChecks as ConfigChecks
from framework.config._signatures import Given as Given
from framework.config._signatures import arg_docs as arg_docs
from framework.config._signatures import signature_of as signature_of
from framework.config._texts import combined
from framework.config._texts import shown as shown
from framework.config._validate import RUN_CONFIG_META_KEYS as RUN_CONFIG_META_KEYS
from framework.config._validate import check as check
from framework.config._validate import errors_in as errors_in
from framework.config._validate import given_for as given_for
from framework.config._validate import resolve_base as resolve_base
from framework.config._validate import use_run_config as use_run_config
from framework.config._validate import validate as validate
from framework.registry import install_config_builder

__all__ = ["AtLeast", "ConfigChecks", "Lazy", "check", "construct", "json_schema", "load_config", "validate"]

# Importable for the framework's own packages under public names.
combined_errors = combined  # one ConfigError holding several


def _build(cls: type, config: Union[Mapping[str, Any], str, PathLike[str]], extras: dict[str, Any]) -> Any:
    """`Registrable.from_config`'s work: read `config` if it is a file, then construct."""
    if not isinstance(config, Mapping):
        config = load_config(config)
    return construct(cls, config, extras=extras)


install_config_builder(_build)
