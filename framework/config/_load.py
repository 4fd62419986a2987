"""Reading a config file: JSON, or YAML (`.yaml`/`.yml`, needs PyYAML)."""

from __future__ import annotations

import json
import pathlib
from os import PathLike
from typing import Any, Union

from framework.config._construct import MAX_DEPTH
from framework.config._texts import shown
from framework.errors import ConfigError

__all__ = ["MAX_CONFIG_BYTES", "load_config"]

MAX_CONFIG_BYTES = 64 * 2**20  # a config file larger than this is a mistake (or /dev/zero)


def load_config(path: Union[str, PathLike[str]]) -> dict[str, Any]:
    """Read a JSON config, or a YAML one (`.yaml`/`.yml`, needs PyYAML)."""
    if not isinstance(path, (str, PathLike)):
        raise ConfigError("", f"expected a config mapping, or a JSON or YAML file's path, got {shown(path)}")
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
