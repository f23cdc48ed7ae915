"""Prints the requirements that pyproject.toml declares for the given extras, one per line.

The images install their dependencies from this list before the source is copied (so a source
change does not reinstall torch): `python3 pyproject_deps.py pyproject.toml executor`. Extras that
name the project itself (all = ["llmserve[scheduler,executor]"]) are expanded. Needs Python 3.11
(tomllib) and nothing else.
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    name = project["name"]
    optional = project.get("optional-dependencies", {})
    self_ref = re.compile(rf"^\s*{re.escape(name)}\s*\[([^\]]*)\]\s*$")
    out: list[str] = list(project.get("dependencies", []))
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop(0).strip()
        if not extra or extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"pyproject_deps: no extra {extra!r} in {sorted(optional)}")
        seen.add(extra)
        for req in optional[extra]:
            m = self_ref.match(req)
            if m:
                todo.extend(m.group(1).split(","))
            elif req not in out:
                out.append(req)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: pyproject_deps.py PYPROJECT [EXTRA[,EXTRA...] ...]", file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        pyproject = tomllib.load(f)
    extras = [e for arg in argv[1:] for e in arg.split(",")]
    print("\n".join(requirements(pyproject, extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
