"""The package's import contract, beyond the layers that ``lint-imports`` checks.

Every ``import`` statement counts, including those inside functions (a cycle hidden in a function body is
still a cycle), and no module reaches for another module's ``_private`` names.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

PACKAGE = Path(__file__).resolve().parent.parent / "bitfit_hf"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module a ``from ... import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(modules: Dict[str, Path]) -> List[Tuple[str, str, str, int]]:
    """``(importer, imported module, imported name or "", line)`` for every bitfit_hf import."""
    found = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(module, a.name, "", node.lineno) for a in node.names if a.name.startswith("bitfit_hf")]
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(module, node, path.name == "__init__.py")
                if target.startswith("bitfit_hf"):
                    found += [(module, target, a.name, node.lineno) for a in node.names]
    return found


def _edges(modules: Dict[str, Path]) -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {m: set() for m in modules}
    for importer, target, name, _ in _imports(modules):
        submodule = f"{target}.{name}" if name else ""
        resolved = submodule if submodule in modules else target
        if resolved in modules and resolved != importer:
            graph[importer].add(resolved)
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_the_whole_package():
    modules = _modules()
    assert {"bitfit_hf", "bitfit_hf.tuners.bias.model", "bitfit_hf.adapters.bank", "bitfit_hf.cli.main"} <= set(modules)
    graph = _edges(modules)
    assert "bitfit_hf.adapters.bank" in graph["bitfit_hf.adapters.multitask"]
    assert "bitfit_hf.utils.names" in graph["bitfit_hf.utils.fingerprint"]


def test_the_cycle_finder_finds_a_loop():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    assert _cycles(_edges(_modules())) == []


def test_no_private_name_is_imported_from_another_module():
    offenders = [
        f"{importer}:{line} imports {target}.{name}"
        for importer, target, name, line in _imports(_modules())
        if name.startswith("_") and not name.startswith("__") and target != importer
    ]
    assert offenders == []


def test_no_private_attribute_of_another_package_module_is_read():
    """``module._name`` or ``imported_object._name`` where the left side came from another bitfit_hf module."""
    modules = _modules()
    offenders = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        imported: Set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("bitfit_hf")}
            elif isinstance(node, ast.ImportFrom) and _absolute(module, node, path.name == "__init__.py").startswith("bitfit_hf"):
                imported |= {a.asname or a.name for a in node.names}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in imported):
                offenders.append(f"{module}:{node.lineno} reads {node.value.id}.{node.attr}")
    assert offenders == []


SHARED_TUNER_PACKAGES = {"bitfit_hf.tuners.bias"}  # BitFit's selection: shared by every bias-selecting method


def _method_folders() -> Set[str]:
    """The packages under tuners/ that hold a registered method's config or its :class:`Method` class (``bitfit``'s
    config lives in the shared tuners/bias/)."""
    from bitfit_hf.tuners import METHODS

    folders = {"bitfit_hf.tuners.bitfit"}
    for method in METHODS.values():
        for obj in (method.config_class, type(method)):
            parts = obj.__module__.split(".")
            if parts[:2] == ["bitfit_hf", "tuners"] and len(parts) > 3 and ".".join(parts[:3]) not in SHARED_TUNER_PACKAGES:
                folders.add(".".join(parts[:3]))
    return folders


def test_the_independence_contract_lists_every_method_folder():
    import tomllib

    contracts = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    listed = {m for c in contracts if c["type"] == "independence" for m in c["modules"]}
    folders = _method_folders()
    assert {"bitfit_hf.tuners.bitfit_lora", "bitfit_hf.tuners.adapterbias"} <= folders
    assert folders <= listed, f"method folders missing from the independence contract: {sorted(folders - listed)}"


def test_upper_layers_name_no_method_but_through_the_registry():
    """adapters/, reporting/, training/, hub/, cli/, study/, serving/ and recipe_kit/ import no method folder; only
    the package root (public names) does. The recipes' flags of each method come from its folder through the
    registry (``Method.recipe``)."""
    folders = tuple(_method_folders())
    allowed = {"bitfit_hf"}
    upper = ("adapters", "reporting", "training", "hub", "cli", "study", "serving", "recipe_kit")
    found = [
        f"{importer}:{line} imports {target}"
        for importer, target, _, line in _imports(_modules())
        if importer.split(".")[1:2] and importer.split(".")[1] in upper and importer not in allowed
        and any(target == f or target.startswith(f + ".") for f in folders)
    ]
    assert found == []


#: Where recipe_kit may spell a method's name: the default ``--method``. Default learning rates live in the method
#: folders (``RecipeMethod.default_learning_rate``).
RECIPE_KIT_METHOD_NAMES_ALLOWED = {"DEFAULT_METHOD"}


def _method_names() -> Set[str]:
    """Every registered method and every recipe ``--method`` (``full``, ``frozen``, ``lora`` are recipe names)."""
    from bitfit_hf.tuners import METHODS, recipe_methods

    return set(METHODS) | set(recipe_methods())


def _named_methods(path: Path, names: Set[str]) -> List[str]:
    """``line: 'name'`` for each string constant of ``path`` that is a method's name, outside docstrings and outside
    the statements that bind or update a name of RECIPE_KIT_METHOD_NAMES_ALLOWED."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                skipped.add(id(first.value))
        targets: List[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
            targets = [node.value.func.value]  # NAME.update({...})
        if any(isinstance(t, ast.Name) and t.id in RECIPE_KIT_METHOD_NAMES_ALLOWED for t in targets):
            skipped |= {id(n) for n in ast.walk(node)}
    hits = [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in skipped]
    return [f"{path.name}:{node.lineno}: {node.value!r}" for node in sorted(hits, key=lambda n: (n.lineno, n.col_offset))]


def test_the_method_name_finder_finds_a_branch(tmp_path):
    source = tmp_path / "args.py"
    source.write_text('"""bitfit"""\nDEFAULT_METHOD = {"bitfit": 1e-3}\nDEFAULT_METHOD.update({"lora": 1})\n'
                      'def f(method):\n    """lora"""\n    if method in ("lora", "x"):\n        return {"full": 1}[method]\n')
    assert _named_methods(source, {"bitfit", "lora", "full"}) == ["args.py:6: 'lora'", "args.py:7: 'full'"]


def test_recipe_kit_names_no_method():
    """The recipes' argument code holds no method's name (no ``if method == ...``, no table of some methods' flags):
    every method's flags, refusals and config come from its folder (``tuners/<method>/recipe.py``) through the
    registry, so a new method touches its folder and its registry line, not recipe_kit."""
    names = _method_names()
    assert {"bitfit", "full", "frozen", "lora", "bitfit_lora", "adapterbias", "rand_uniform", "ia3"} <= names
    found = [hit for path in sorted((PACKAGE / "recipe_kit").rglob("*.py")) for hit in _named_methods(path, names)]
    assert found == []
