"""The first-party plugins: one entry point each, named in setup.cfg.

Each hook names its components by import path, so listing them imports nothing
heavy; a component's module is imported when it is first used.
"""

from __future__ import annotations

from framework.hookspecs import hookimpl
from framework.registry import Registrar

__all__ = [
    "CorePlugin",
    "HttpPlugin",
    "LocalPlugin",
    "ReadersPlugin",
    "S3Plugin",
    "SamplersPlugin",
]


class CorePlugin:
    """The loader and collator that the core engine ships."""

    @staticmethod
    @hookimpl
    def framework_register_components(registrar: Registrar) -> None:
        from framework.data.collate import DataCollator
        from framework.data.loader import DataLoader

        registrar.add(DataLoader, "multiprocess", "framework.data.multiprocess:MultiProcessDataLoader")
        registrar.add(DataCollator, "default", "framework.data.collate:DefaultDataCollator")


class SamplersPlugin:
    @staticmethod
    @hookimpl
    def framework_register_components(registrar: Registrar) -> None:
        from framework.data.sampler import BatchSampler

        registrar.add(BatchSampler, "bucket", "framework_plugins.samplers:BucketBatchSampler")
        registrar.add(BatchSampler, "max_tokens", "framework_plugins.samplers:MaxTokensBatchSampler")


class ReadersPlugin:
    @staticmethod
    @hookimpl
    def framework_register_components(registrar: Registrar) -> None:
        from framework.data.reader import DatasetReader

        registrar.add(DatasetReader, "jsonl", "framework_plugins.readers:JsonlReader")
        registrar.add(DatasetReader, "text", "framework_plugins.readers:TextReader")
        registrar.add(DatasetReader, "csv", "framework_plugins.readers:CsvReader")


class HttpPlugin:
    @staticmethod
    @hookimpl
    def framework_register_components(registrar: Registrar) -> None:
        from framework.download.backend import DownloadBackend

        registrar.add(DownloadBackend, "http", "framework_plugins.http:HttpBackend")


class S3Plugin:
    @staticmethod
    @hookimpl
    def framework_register_components(registrar: Registrar) -> None:
        from framework.download.backend import DownloadBackend

        registrar.add(DownloadBackend, "s3", "framework_plugins.s3:S3Backend")


class LocalPlugin:
    @staticmethod
    @hookimpl
    def framework_register_components(registrar: Registrar) -> None:
        from framework.download.backend import DownloadBackend

        registrar.add(DownloadBackend, "local", "framework_plugins.local:LocalBackend")
