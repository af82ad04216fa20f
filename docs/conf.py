"""Sphinx configuration: the guide (Markdown, through myst-parser) and the API reference (numpydoc docstrings).

Build: ``pip install -e '.[docs]'; sphinx-build -W -b html docs docs/_build``.
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the package from a checkout, installed or not

project = "gpuscope"
extensions = ["myst_parser", "numpydoc", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
numpydoc_show_class_members = False
numpydoc_validation_checks = set()
autodoc_mock_imports = ["cuda", "numba", "cupy", "nvtx"]  # the reference builds without a GPU stack
html_theme = "alabaster"
suppress_warnings = ["myst.xref_missing"]
