"""An example framework plugin: a ``"squares"`` reader and a ``numbers://`` backend."""
