"""A process and all its descendants, from /proc/<pid>/stat (Linux)."""

from pathlib import Path


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now running."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name, in parentheses, may hold spaces and parentheses: split after the last ")".
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # it ended while we read
    return parents


def process_tree(root: int) -> set[int]:
    """`root` and every process descended from it (Ray's processes are the children and
    grandchildren of the process that started a local instance)."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree
