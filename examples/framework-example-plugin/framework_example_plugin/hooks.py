"""The plugin's entry point (``framework.plugins: example``): register by import path.

Nothing here imports the reader or the backend module; the registry does that when a
component is first used.
"""

from __future__ import annotations

from framework import hookimpl
from framework.registry import Registrar


@hookimpl
def framework_register_components(registrar: Registrar) -> None:
    from framework.data.reader import DatasetReader
    from framework.download.backend import DownloadBackend

    registrar.add(DatasetReader, "squares", "framework_example_plugin.reader:SquaresReader")
    registrar.add(DownloadBackend, "numbers", "framework_example_plugin.backend:NumbersBackend")
