"""The project's shape: what CI runs, the command line, who imports httpx (test_surface.py: the public surface
and the import contract)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import llmchat.core
from llmchat.tui.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```sh\n(.+?)\n```", text)


def test_readme_opens_with_the_install_and_the_test_command() -> None:
    commands = _readme_commands()
    assert len(commands) >= 2
    start, tests = commands[0], commands[1]
    assert "pip install" in start and start.rstrip().endswith("llmchat")
    assert "pip install" in tests and '".[test]"' in tests and "pytest" in tests


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    test_command = _readme_commands()[1]
    assert test_command in ci.splitlines(), "the .ci/run test line must be README's test command, verbatim"


def test_ci_runs_the_static_checks_before_the_tests() -> None:
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "scripts/check" in lines, ".ci/run must run scripts/check on a line of its own"
    assert lines.index("scripts/check") < lines.index(_readme_commands()[1]), "the checks run before the tests"
    assert os.access(ROOT / "scripts" / "check", os.X_OK), "scripts/check must be executable"


def test_ci_runs_the_real_peer_tier_after_the_tests() -> None:
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "scripts/realpeer" in lines, ".ci/run must run the real-peer tier on a line of its own"
    assert lines.index("scripts/realpeer") > lines.index(_readme_commands()[1]), "the tier runs after the tests"
    assert os.access(ROOT / "scripts" / "realpeer", os.X_OK), "scripts/realpeer must be executable"
    assert "scripts/realpeer" in (ROOT / "README.md").read_text(encoding="utf-8"), "README names the tier"


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    help_text = parser.format_help()
    for name in ("chat", "ask", "serve", "bench", "proxy", "batch", "config", "cache", "export"):
        assert re.search(rf"^\s+{name}\s", help_text, re.M), name


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert capsys.readouterr().out.strip() == f"llmchat {llmchat.core.__version__}"


def _imports(folder: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def test_only_the_transport_imports_httpx() -> None:
    users = sorted(p for p, names in _imports(ROOT / "core").items() if "httpx" in names)
    assert users == ["core/http/_transport.py"]
    # The whole HTTP stack, so swapping it (httpx2 and httpcore2, say) is one module's change.
    stack = {"httpx", "httpcore", "h2", "h11"}
    users = sorted(p for p, names in _imports(ROOT / "core").items() if names & stack)
    assert users == ["core/http/_transport.py"]


def test_console_script_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "llmchat.tui", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "serve" in out.stdout


def test_ask_imports_neither_the_server_nor_hypercorn_nor_textual() -> None:
    # What `llmchat ask` loads before it talks to anyone: the command line and the ask command.
    code = (
        "import sys; from llmchat.tui.cli import parse_args; parse_args(['ask', 'hi']); "
        "import llmchat.tui.commands.ask; "
        "print(sorted({m.split('.')[0] if not m.startswith('llmchat') else m for m in sys.modules "
        "if m.startswith(('hypercorn', 'textual', 'llmchat.core.server._start', 'llmchat.tui.app'))}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_local_server_has_an_entry_point_of_its_own() -> None:
    from llmchat.core.server import start_subprocess

    done = subprocess.run([sys.executable, "-m", "llmchat.core.server", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "--profile" in done.stdout and "--cold-start-ms" in done.stdout
    with start_subprocess(["--profile", "instant"]) as server:
        # The engine starts the engine, never the face.
        assert isinstance(server.process.args, list) and server.process.args[1:3] == ["-m", "llmchat.core.server"]


def test_default_css_only_on_the_widgets_meant_for_reuse() -> None:
    # The app's look is in tui/app.tcss, its one stylesheet. The widgets under tui/widgets/ are mounted on their
    # own too (the snapshot tests, benchmarks/render.py), so they carry the CSS they need; nothing else does.
    found = []
    for path in sorted((ROOT / "tui").rglob("*.py")):
        if path.is_relative_to(ROOT / "tui" / "widgets"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    targets = item.targets if isinstance(item, ast.Assign) else (
                        [item.target] if isinstance(item, ast.AnnAssign) else [])
                    if any(isinstance(t, ast.Name) and t.id == "DEFAULT_CSS" for t in targets):
                        found.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert found == [], "move this CSS into tui/app.tcss: " + ", ".join(found)


def test_every_package_folder_is_installed() -> None:
    # CI installs the project as a wheel (not editable): a folder missing from pyproject's package list is
    # importable here and absent there.
    import tomllib

    root = ROOT
    listed = set(tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    folders = {
        f"llmchat.{top}" + "".join(f".{part}" for part in init.parent.relative_to(root / top).parts)
        for top in ("core", "tui")
        for init in (root / top).rglob("__init__.py")
    }
    assert folders == listed, f"pyproject's packages lack {sorted(folders - listed)}, list {sorted(listed - folders)}"


def test_no_two_engine_modules_share_a_name() -> None:
    # A name says what a module holds: two `_run.py` in core/ would hold two different things under one word,
    # and a traceback or a grep would not say which. (Package `__init__` and `__main__` are the exception.)
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "core").rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not shared, f"modules of one name in core/: {shared}; name each for what it holds"
