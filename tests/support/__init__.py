"""Helpers the tests share: readers, rank entry points, servers and tokenizers.

Imported as ``tests.support.<module>`` (pytest puts the repository root on ``sys.path``),
so "spawn" children, which inherit ``sys.path``, unpickle these classes by module name.
A subprocess that imports them needs the repository root on ``PYTHONPATH``.
"""
