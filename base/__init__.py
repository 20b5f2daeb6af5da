"""The ground floor, below data/, models/ and recipes/: every error class (`errors`), the one reader (`reader`) and the
one writer (`writer`) of files, and the plug-in records (`registry`).

Its modules import nothing of this repository but each other (tests/meta/test_layers.py); `registry.load` imports a
plug-in's module by the name in its record, when a factory asks for it.
"""
