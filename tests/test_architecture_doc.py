"""docs/architecture.md stays true to the code: every path it names exists, every ``path:Name.attr`` it names
is defined in that file, and the README links it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"

#: A path in backticks (a file with its suffix, or a folder ending in /), with an optional :Name or :Name.attr.
_REF = re.compile(r"`([\w./-]+?(?:\.py|\.tcss|\.toml|\.md|/))(?::([\w.]+))?`")


def _refs() -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in _REF.finditer(DOC.read_text(encoding="utf-8"))]


def _defines(source: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b", source, re.MULTILINE) is not None


def test_every_path_the_architecture_names_exists() -> None:
    refs = _refs()
    assert len({path for path, _ in refs}) >= 60  # the page names the code; a broken pattern would find none
    missing = sorted({path for path, _ in refs if not (ROOT / path).exists()})
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_name_the_architecture_gives_is_defined_where_it_says() -> None:
    wrong = []
    for path, name in _refs():
        if name is None:
            continue
        source = (ROOT / path).read_text(encoding="utf-8")
        if not all(_defines(source, part) for part in name.split(".")):
            wrong.append(f"{path}:{name}")
    assert not wrong, f"docs/architecture.md names what these files do not define: {wrong}"


def test_the_readme_links_the_architecture() -> None:
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
