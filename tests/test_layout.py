"""The package's layers import only downwards: layers know nothing of the models, searches,
training or export built on them, and decoding nothing of export.

Every module is parsed (not imported), so an import inside a function counts as much as
one at the top of a file.
"""

import ast
from pathlib import Path

import keras_transformer

PACKAGE = Path(keras_transformer.__file__).resolve().parent

# Sub-package -> the sub-packages none of its modules may import.
FORBIDDEN_IMPORTS = {
    "layers": ("models", "decoding", "training", "export"),
    "decoding": ("export",),
}


def imported_modules(path):
    """The absolute module names `path` imports (for `from a import b`: `a` and `a.b`)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def upward_imports(package_dir, forbidden_imports):
    """`module imports name` for every import that `forbidden_imports` rules out."""
    found = []
    for subpackage, forbidden in forbidden_imports.items():
        for path in sorted((package_dir / subpackage).rglob("*.py")):
            for name in imported_modules(path):
                parts = name.split(".")
                if parts[0] == package_dir.name and len(parts) > 1 and parts[1] in forbidden:
                    found.append(f"{path.relative_to(package_dir.parent)} imports {name}")
    return found


def test_layers_and_decoding_do_not_import_upwards():
    assert upward_imports(PACKAGE, FORBIDDEN_IMPORTS) == []


def test_an_upward_import_inside_a_function_is_found(tmp_path):
    package = tmp_path / PACKAGE.name
    (package / "decoding").mkdir(parents=True)
    (package / "decoding" / "reader.py").write_text(
        f"def read():\n    from {PACKAGE.name}.export.serving import next_version\n",
        encoding="utf-8",
    )
    assert upward_imports(package, {"decoding": ("export",)}) == [
        f"{PACKAGE.name}/decoding/reader.py imports {PACKAGE.name}.export.serving",
        f"{PACKAGE.name}/decoding/reader.py imports {PACKAGE.name}.export.serving.next_version",
    ]
