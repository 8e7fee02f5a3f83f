"""Sphinx configuration of the adaptdl-ray documentation (see docs/README.md).

Build: ``python -m sphinx -W --keep-going -n -b html docs docs/_build/html``. The pages are
Markdown (myst-parser); the API reference is autodoc over the docstrings (reST roles with
Google-style sections, read by napoleon). Nothing is fetched over the network: no
intersphinx. With ``-n -W`` a link to a missing page or heading, and a cross-reference to a
Python name that does not exist, fail the build; a reference to a name that exists but has
no page here (``torch.nn.Module``, a private helper) is left as plain code (see
:func:`_existing_object`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import sys
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = "adaptdl-ray"
author = "the adaptdl-ray authors"
copyright = "the adaptdl-ray authors; Apache-2.0"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
html_theme = "alabaster"
html_static_path: list[str] = []

# Links: `[text](page.md#a-heading)` works as on GitHub (anchors of headings up to ###).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# Every cross-reference is checked (-n); see _existing_object for what counts as broken.
nitpicky = True
# Napoleon reads "name (words): ..." in Arguments/Returns sections as a type; prose there is
# not a reference anyone wrote.
nitpick_ignore_regex = [(r"py:.*", r".*\s.*")]
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False


def _import_dotted(name: str) -> bool:
    """Whether ``name`` (``package.module.Object.attr``) names an importable object."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def _home_modules(node) -> list[str]:
    """The modules a reference in ``node`` may be relative to: the page's current module,
    the module that defines the current class (a package may re-export it), and the module
    of the object whose docstring holds the reference."""
    modules = [node.get("py:module") or ""]
    cls = node.get("py:class")
    if modules[0] and cls:
        with contextlib.suppress(Exception):
            owner = importlib.import_module(modules[0])
            for attr in cls.split("."):
                owner = getattr(owner, attr)
            modules.append(owner.__module__)
    match = re.search(r"docstring of ([\w.]+)", node.source or "")
    if match:
        parts = match.group(1).split(".")
        modules += [".".join(parts[:cut]) for cut in range(len(parts) - 1, 0, -1)]
    return [m for m in modules if m]


def _existing_object(app, env, node, contnode):
    """A Python reference with no page here resolves to plain code when it names an object
    that exists (in a module it may be relative to, a package above it, or builtins); any
    other stays missing, which -n -W turns into a build failure."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip("~")
    cls = node.get("py:class") or ""
    candidates = [target, f"builtins.{target}"]
    for module in _home_modules(node):
        if target.startswith("."):  # relative to the module's package
            candidates += [module + target, module.rpartition(".")[0] + target]
            continue
        scopes = [module]
        while "." in scopes[-1]:
            scopes.append(scopes[-1].rsplit(".", 1)[0])
        candidates += [f"{module}.{cls}.{target}"] if cls else []
        candidates += [f"{scope}.{target}" for scope in scopes]
    if any(_import_dotted(c) for c in candidates):
        return contnode
    return None


class CliHelp(SphinxDirective):
    """``{cli-help}``: the ``--help`` of ``adaptdl-ray`` and of each of its verbs, rendered
    from the program's own parser, so the reference cannot drift from the code."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from adaptdl_ray.cli import build_parser

        old = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = "90"  # argparse wraps to this width
        try:
            parser = build_parser()
            # argparse has no public way to list a parser's sub-commands.
            verbs = next(a.choices for a in parser._actions
                         if isinstance(a, argparse._SubParsersAction))
            out = [("adaptdl-ray --help", parser.format_help())]
            out += [(f"adaptdl-ray {name} --help", sub.format_help())
                    for name, sub in verbs.items()]
        finally:
            if old is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = old
        result: list[nodes.Node] = []
        for title, text in out:
            section = nodes.section(ids=[nodes.make_id(title)])
            section += nodes.title("", "", nodes.literal(title, title))
            section += nodes.literal_block(text, text, language="text")
            result.append(section)
        self.env.note_dependency(str(ROOT / "adaptdl_ray" / "cli.py"))
        return result


def setup(app):
    app.connect("missing-reference", _existing_object)
    app.add_directive("cli-help", CliHelp)
    return {"parallel_read_safe": True}
