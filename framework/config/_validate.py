"""`validate`: every error of a config, building nothing; `check` raises the first.

A `framework run` config is checked against the run config's shape, which belongs
to the CLI (it names the loader and the reader, above this layer): the CLI installs it
with `use_run_config`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from os import PathLike
from typing import Any, Optional, Union

from framework.config._annotations import META_KEYS
from framework.config._construct import _Walk, checked
from framework.config._load import load_config
from framework.config._texts import combined, mismatch
from framework.errors import ConfigError, UnknownNameError
from framework.registry import Registrable, all_entries, describe_error, import_target

__all__ = [
    "RUN_CONFIG_META_KEYS",
    "check",
    "errors_in",
    "given_for",
    "resolve_base",
    "run_config_shape",
    "use_run_config",
    "validate",
]

RUN_CONFIG_META_KEYS = META_KEYS  # allowed in a run config and in every component's, for editors
_run_config: Optional[Callable[..., None]] = None


def use_run_config(shape: Callable[..., None]) -> None:
    """Check and describe `framework run` configs by `shape`'s signature."""
    global _run_config
    _run_config = shape


def run_config_shape() -> Callable[..., None]:
    """The signature a `framework run` config is checked against (the CLI's)."""
    if _run_config is None:  # installed by `framework.cli.run_config`, imported by `framework`'s root
        raise ConfigError("", "the shape of a `framework run` config was not installed (import framework)")
    return _run_config


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
            walk.fail(mismatch("", "a mapping (a run config)", config))
        else:
            body = {k: v for k, v in config.items() if k not in RUN_CONFIG_META_KEYS}
            for key in (k for k in RUN_CONFIG_META_KEYS if k in config and not isinstance(config[k], str)):
                walk.fail(mismatch(key, "str (a schema's URL)", config[key]))
            walk.arguments(run_config_shape(), body, "", {}, top_level=True)

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
        raise combined(errors)


def resolve_base(base: Union[str, type]) -> type[Registrable]:
    """A `Registrable` base class from itself, its class name, or a dotted path."""
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
