"""The first-party plugins: one entry point each, named in setup.cfg.

Each plugin names its bases and components by import path, so listing them
imports no component module (and no torch); a component's module is imported
when it is first used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from framework.hookspecs import hookimpl
from framework.registry import Registrar, import_target

__all__ = ["BuiltinPlugin", "core", "fsspec", "http", "local", "readers", "s3", "samplers"]


class BuiltinPlugin:
    """Registers `(base path, name, target path)` triples through the plugin hook;
    `aliases` maps a target to the other dotted paths that re-export it."""

    def __init__(
        self, *components: tuple[str, str, str], aliases: Optional[Mapping[str, tuple[str, ...]]] = None
    ) -> None:
        self.components = components
        self.aliases = dict(aliases or {})

    @hookimpl
    def framework_register_components(self, registrar: Registrar) -> None:
        for base, name, target in self.components:
            base_class = import_target(base, allow_import=True)  # our own code
            registrar.add(base_class, name, target, aliases=self.aliases.get(target, ()))


_LOADER = "framework.data.loader:DataLoader"
_COLLATOR = "framework.data.collate:DataCollator"
_SAMPLER = "framework.data.sampler:BatchSampler"
_READER = "framework.data.reader:DatasetReader"
_BACKEND = "framework.download.backend:DownloadBackend"

core = BuiltinPlugin(
    (_LOADER, "multiprocess", "framework.data.multiprocess:MultiProcessDataLoader"),
    (_COLLATOR, "default", "framework.data.collate:DefaultDataCollator"),
)
samplers = BuiltinPlugin(
    (_SAMPLER, "bucket", "framework.data.sampler:BucketBatchSampler"),
    (_SAMPLER, "max_tokens", "framework.data.sampler:MaxTokensBatchSampler"),
    aliases={  # the path configs named before the samplers moved; the module re-exports them
        "framework.data.sampler:BucketBatchSampler": ("framework_plugins.samplers:BucketBatchSampler",),
        "framework.data.sampler:MaxTokensBatchSampler": ("framework_plugins.samplers:MaxTokensBatchSampler",),
    },
)
readers = BuiltinPlugin(
    (_READER, "jsonl", "framework_plugins.readers:JsonlReader"),
    (_READER, "text", "framework_plugins.readers:TextReader"),
    (_READER, "csv", "framework_plugins.readers:CsvReader"),
)
http = BuiltinPlugin((_BACKEND, "http", "framework_plugins.http:HttpBackend"))
s3 = BuiltinPlugin((_BACKEND, "s3", "framework_plugins.s3:S3Backend"))
local = BuiltinPlugin((_BACKEND, "local", "framework_plugins.local:LocalBackend"))
fsspec = BuiltinPlugin((_BACKEND, "fsspec", "framework_plugins.fsspec:FsspecBackend"))
