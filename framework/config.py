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

import difflib
import json
import pathlib
from collections.abc import Iterable, Mapping
from os import PathLike
from typing import Any, Union

from framework._signatures import AtLeast as AtLeast
from framework._signatures import ConfigChecks as ConfigChecks
from framework._validate import _MAPPINGS as _MAPPINGS
from framework._validate import _NONE as _NONE
from framework._validate import _SEQUENCES as _SEQUENCES
from framework._validate import _SETS as _SETS
from framework._validate import _UNION_TYPES as _UNION_TYPES
from framework._validate import MAX_DEPTH as MAX_DEPTH
from framework._validate import META_KEYS, _combined, _mismatch, _Walk, checked
from framework._validate import Lazy as Lazy
from framework._validate import _is_constructible as _is_constructible
from framework._validate import _shown as _shown
from framework._validate import construct as construct
from framework._validate import is_typed_dict as is_typed_dict
from framework._validate import typed_dict_fields as typed_dict_fields
from framework.errors import ConfigError
from framework.registry import Registrable

__all__ = ["AtLeast", "ConfigChecks", "Lazy", "check", "construct", "json_schema", "load_config", "validate"]

MAX_CONFIG_BYTES = 64 * 2**20  # a config file larger than this is a mistake (or /dev/zero)
RUN_CONFIG_META_KEYS = META_KEYS  # allowed in a run config and in every component's, for editors


def load_config(path: Union[str, PathLike[str]]) -> dict[str, Any]:
    """Read a JSON config, or a YAML one (`.yaml`/`.yml`, needs PyYAML)."""
    if not isinstance(path, (str, PathLike)):
        raise ConfigError("", f"expected a config mapping, or a JSON or YAML file's path, got {_shown(path)}")
    try:
        path = pathlib.Path(path)
        with path.open("rb") as file:  # a pipe works too; /dev/zero would never end
            data = file.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(
                "",
                f"config file {path} is larger than {MAX_CONFIG_BYTES // 2**20} MiB: no config is so large",
            )
        text = data.decode("utf-8")
    except ConfigError:
        raise
    except OSError as error:
        raise ConfigError("", f"cannot read config file {path}: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise ConfigError(
            "", f"config file {path} is not UTF-8 text (byte {error.start}): save it as UTF-8"
        ) from error
    except (TypeError, ValueError) as error:  # a NUL in the path; a path-like that is no path
        raise ConfigError("", f"cannot read config file {path!r}: {error}") from error
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as error:
            raise ConfigError("", f"{path} is YAML: `pip install pyyaml` to read it") from error
        try:
            data = yaml.safe_load(text)
        except (yaml.YAMLError, ValueError) as error:  # ValueError: an int too long to convert
            raise ConfigError("", f"{path} is not valid YAML: {error}") from error
        except RecursionError as error:
            raise ConfigError(
                "", f"{path} nests too deep to read (more than {MAX_DEPTH} levels is a mistake)"
            ) from error
    else:
        try:
            data = json.loads(text)
        except ValueError as error:  # a JSONDecodeError, or an int too long to convert
            raise ConfigError("", f"{path} is not valid JSON: {error}") from error
        except RecursionError as error:
            raise ConfigError(
                "", f"{path} nests too deep to read (more than {MAX_DEPTH} levels is a mistake)"
            ) from error
    if not isinstance(data, dict):
        raise ConfigError("", f"{path} must hold a mapping at the top, got {type(data).__name__}")
    return data


def validate(
    config: Any, base: Union[str, type, None] = None, *, given: Iterable[str] = ()
) -> list[ConfigError]:
    """Every error in `config`, in the order met; constructs nothing, reads no data.

    Without `base`, `config` is a `framework run` config; with one (a `Registrable`
    base class or its name, e.g. `"DatasetReader"`), a config of that base. Names
    in `"type"` are looked up in the registry (importing the component's module
    to read its signature); no constructor runs and no connection is opened.

    A string or path `config` is a JSON or YAML file, read as `Registrable.from_config`
    reads it (a file that cannot be read is the one error). `given` names the arguments
    that code passes to `from_config` (its extras), so the config need not hold them;
    a base may declare its usual ones (`DataLoader.config_given`: reader, data_path).
    """
    if isinstance(config, (str, PathLike)):
        try:
            config = load_config(config)
        except ConfigError as error:
            return [error]
    cls = None if base is None else resolve_base(base)
    walk = _Walk(build=False, extras=dict.fromkeys(given if cls is None else given_for(cls, given)))

    def step(walk: _Walk) -> None:
        if cls is not None:
            walk.value(cls, config, "")
        elif not isinstance(config, Mapping):
            walk.fail(_mismatch("", "a mapping (a run config)", config))
        else:
            from framework._runconfig import run_config

            body = {k: v for k, v in config.items() if k not in RUN_CONFIG_META_KEYS}
            for key in (k for k in RUN_CONFIG_META_KEYS if k in config and not isinstance(config[k], str)):
                walk.fail(_mismatch(key, "str (a schema's URL)", config[key]))
            walk.arguments(run_config, body, "", {}, top_level=True)

    return checked(walk, step)


def given_for(base: type, given: Iterable[str] = ()) -> tuple[str, ...]:
    """The argument names code passes with a config of `base`: its declared ones and `given`."""
    declared: tuple[str, ...] = getattr(base, "config_given", ())
    return tuple(dict.fromkeys([*declared, *given]))


def errors_in(annotation: Any, value: Any) -> list[ConfigError]:
    """The errors of `value` as a config for `annotation`."""
    return checked(_Walk(build=False, extras={}), lambda walk: walk.value(annotation, value, ""))


def check(config: Any, base: Union[str, type, None] = None) -> None:
    """`validate`, raising one `ConfigError` (the first, its `errors` holding all)."""
    errors = validate(config, base)
    if errors:
        raise _combined(errors)


def json_schema(base: Union[str, type, None] = None, *, given: Iterable[str] = ()) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of run configs, or of configs of one `Registrable` base.

    Every registered name is a `"type"` choice with its own parameters, from the
    registry (this process's registrations and installed plugins) and the
    constructors' annotations. Components it could not describe are listed, with
    the reason, under `"x-framework-undescribed"`. `given`: as for `validate`.
    """
    from framework._schema import build_schema

    return build_schema(base, given)


def resolve_base(base: Union[str, type]) -> type[Registrable]:
    """A `Registrable` base class from itself, its class name, or a dotted path."""
    from framework.errors import UnknownNameError
    from framework.registry import all_entries, describe_error, import_target

    if isinstance(base, type) and issubclass(base, Registrable):
        return base
    if not isinstance(base, str):
        raise ConfigError("base", "expected a Registrable base class or its name", "str", base)
    bases = {entry.base.__name__: entry.base for entry in all_entries()}
    if base in bases:
        return bases[base]
    if "." in base or ":" in base:
        try:
            target = import_target(base)
        except (ImportError, AttributeError) as error:
            raise ConfigError("base", f"cannot import {base!r}: {error}") from error
        except (Exception, SystemExit) as error:  # the module is someone else's code
            raise ConfigError("base", f"cannot import {base!r}: {describe_error(error)}") from error
        if isinstance(target, type) and issubclass(target, Registrable):
            return target
        raise ConfigError("base", f"{base!r} is {target!r}, not a Registrable subclass")
    close = difflib.get_close_matches(base, sorted(bases), n=2)
    raise UnknownNameError("Registrable bases", base, sorted(bases), close)
