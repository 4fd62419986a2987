"""The top-level `__all__` is exactly the public surface, sorted (as httpx checks)."""

from __future__ import annotations

import framework
import framework.errors

CONTRACT = {
    "BatchSampler", "BucketBatchSampler", "ConfigError", "DataCollator", "DataLoader", "DatasetReader",
    "DefaultDataCollator", "DistributedInfo", "DownloadBackend", "DownloadError", "DownloadManager",
    "FrameworkError", "Lazy", "MultiProcessDataLoader",
    "Registrable", "WorkerError", "WorkerInfo", "cached_path", "hookimpl", "hookspec",
}  # fmt: skip


def test_all_is_the_contract_and_sorted() -> None:
    assert set(framework.__all__) == CONTRACT
    assert framework.__all__ == sorted(framework.__all__)


def test_every_name_in_all_resolves() -> None:
    for name in framework.__all__:
        assert getattr(framework, name) is not None, name


def test_public_names_are_exactly_all() -> None:
    public = {
        name
        for name in dir(framework)
        if not name.startswith("_")
        and not isinstance(getattr(framework, name), type(framework))  # submodules
    }
    assert public == set(framework.__all__)


def test_unknown_attribute_is_an_attribute_error() -> None:
    try:
        framework.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as error:
        assert "NoSuchThing" in str(error)
    else:
        raise AssertionError("expected AttributeError")


def test_errors_module_all_is_sorted_and_complete() -> None:
    errors = framework.errors
    assert errors.__all__ == sorted(errors.__all__)
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == errors.__name__
    }
    assert defined == set(errors.__all__)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.FrameworkError)


def test_error_tree_is_drawn_in_the_docstring() -> None:
    doc = framework.errors.__doc__ or ""
    for name in framework.errors.__all__:
        assert name in doc, f"{name} missing from the tree in framework/errors.py's docstring"


def test_registry_and_testing_modules_export_what_they_define() -> None:
    # (ruff's RUF022 keeps their __all__ sorted, constants first)
    import framework.registry
    import framework.testing

    for module in (framework.registry, framework.testing):
        defined = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and (isinstance(value, type) or callable(value))
            and getattr(value, "__module__", None) == module.__name__
        }
        assert defined <= set(module.__all__), f"{module.__name__}: {defined - set(module.__all__)}"
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_bucket_batch_sampler_is_importable_from_framework() -> None:
    import framework

    assert "BucketBatchSampler" in framework.__all__
    from framework import BucketBatchSampler  # noqa: F401
