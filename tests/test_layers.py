"""The package's shape (docs/explanation/design.md): no import cycle among fedmpi's modules, counting function-local
imports (grimp sees those too), so no import exists only to dodge one. The layers themselves are
import-linter's contracts in pyproject.toml, checked by `lint-imports` in .ci/run."""

import grimp


def _cycles(graph):
    adjacent = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    state, found = {}, []

    def visit(module, path):
        state[module] = "open"
        path.append(module)
        for imported in sorted(adjacent[module]):
            if state.get(imported) == "open":
                found.append(path[path.index(imported):] + [imported])
            elif imported not in state:
                visit(imported, path)
        path.pop()
        state[module] = "done"

    for module in sorted(adjacent):
        if module not in state:
            visit(module, [])
    return found


def test_cycle_finder_finds_a_planted_cycle():
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert _cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]


def test_fedmpi_has_no_import_cycle():
    graph = grimp.build_graph("fedmpi", include_external_packages=False, cache_dir=None)
    assert _cycles(graph) == []
