"""No two rooms of ours reach each other, at any folder depth of the package: the children of
every folder (its modules and sub-packages) import one another in one direction only, type-only
and in-function imports counted (tests/engine/test_engine_rooms.py's rule, for every package).
A loop between two folders makes each a reader's prerequisite for the other."""

import pytest

from tests.helpers.import_graph import SRC, imports_in, module_name, rooms_in_a_loop, sibling_edges

PACKAGE = SRC / "batchproof"
GRAPH = {module_name(path): imports_in(path.read_text()) for path in PACKAGE.rglob("*.py")}
FOLDERS = sorted(module_name(path.parent) for path in PACKAGE.rglob("__init__.py"))


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_two_rooms_reach_each_other(folder):
    edges = sibling_edges(folder, GRAPH)
    loop = rooms_in_a_loop(edges)
    assert not loop, f"{folder}: {sorted(loop)} reach each other: " + "; ".join(
        f"{a} -> {sorted(edges[a] & loop)}" for a in sorted(loop))
