"""The private names of our dependencies that llmchat still uses, pinned: an upgrade that moves one fails here,
with the name, the installed version, who relies on it and what to do, instead of silently undoing the render
performance or crashing every stream.

Each test checks that the name is there with the signature (or type) our code assumes, and, where our code
overrides a hook, that the library still calls it (an override nobody calls does nothing, quietly). The
transport's hooks into httpx, httpcore and h2 are pinned beside the code that relies on them, in
tests/test_transport_lifecycle.py (test_the_private_names_the_transport_relies_on_are_still_there); hypercorn's
H2Protocol name lookup in tests/test_server_keepalive.py.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def _version(dist: str) -> str:
    return f"{dist} {importlib.metadata.version(dist)}"


def _gone(dist: str, name: str, user: str, fix: str) -> str:
    return f"{_version(dist)} has no {name} any more: {user} relies on it. {fix}"


def require(dist: str, owner: object, name: str, *, user: str, fix: str) -> Any:
    """``owner.name`` (looked up without running a property), or a failure naming it, who uses it and the fix."""
    try:
        return inspect.getattr_static(owner, name)
    except AttributeError:
        where = getattr(owner, "__qualname__", type(owner).__qualname__)
        pytest.fail(_gone(dist, f"{where}.{name}", user, fix))


def require_parameters(dist: str, func: Callable[..., object], names: list[str], *, user: str, fix: str) -> None:
    """``func`` takes exactly the parameters ``names`` (self included), in that order."""
    found = list(inspect.signature(func).parameters)
    assert found == names, (
        f"{_version(dist)} changed {func.__qualname__}{inspect.signature(func)}: {user} calls or overrides it "
        f"as ({', '.join(names)}). {fix}"
    )


# -- Textual ------------------------------------------------------------------------------------------------

RENDER_FIX = (
    "Re-measure benchmarks/render.py without the override: if Textual no longer lays the screen out twice for a "
    "new virtual size, delete it; else port it to the new name and keep the figures in the commit."
)


def test_textual_widget_size_updated_is_still_the_hook_our_chat_widgets_override() -> None:
    from textual.widget import Widget

    user = "tui/widgets/chat/_frozen.py (FrozenLines) and _conversation.py (Conversation)"
    hook = require("textual", Widget, "_size_updated", user=user, fix=RENDER_FIX)
    require_parameters("textual", hook, ["self", "size", "virtual_size", "container_size", "layout"],
                       user=user, fix=RENDER_FIX)
    # Textual calls it on each widget it lays out (Screen's layout pass): an override it no longer calls
    # would silently cost the second layout again.
    callers = [p.name for p in Path(inspect.getfile(Widget)).parent.rglob("*.py")
               if "._size_updated(" in p.read_text(encoding="utf-8")]
    assert callers, _gone("textual", "a caller of Widget._size_updated", user, RENDER_FIX)


def test_textual_styles_cache_keeps_painted_rows_where_frozen_lines_saves_them() -> None:
    from textual.geometry import Size
    from textual.widget import Widget

    user = "tui/widgets/chat/_frozen.py (FrozenLines._size_updated keeps the rows painted before a resize)"
    fix = ("Find where Textual's StylesCache now keeps its rendered lines and the rows marked dirty, and update "
           "FrozenLines._size_updated; or drop the row saving there (replies then repaint every row on resize).")
    widget = Widget()
    cache = require("textual", widget, "_styles_cache", user=user, fix=fix)
    assert isinstance(require("textual", cache, "_cache", user=user, fix=fix), dict), (
        _gone("textual", "StylesCache._cache as a dict of row -> Strip", user, fix))
    assert isinstance(require("textual", cache, "_dirty_lines", user=user, fix=fix), set), (
        _gone("textual", "StylesCache._dirty_lines as a set of rows", user, fix))
    assert isinstance(require("textual", widget, "_size", user=user, fix=fix), Size), (
        _gone("textual", "Widget._size as a Size", user, fix))


def test_textual_anchor_released_is_still_the_other_half_of_the_anchor_state() -> None:
    from textual.containers import VerticalScroll

    user = "tui/widgets/chat/_conversation.py (Conversation.following and the re-anchoring after a scroll)"
    fix = ("Textual keeps whether an anchor was released by scrolling in a private flag; find its new name or a "
           "public way to read it and update Conversation.")
    released = require("textual", VerticalScroll(), "_anchor_released", user=user, fix=fix)
    assert isinstance(released, bool), _gone("textual", "a bool Widget._anchor_released", user, fix)


def test_textual_screen_timer_update_is_what_the_metrics_benchmark_times() -> None:
    from textual.screen import Screen

    user = "benchmarks/metrics.py (times the screen's refresh by wrapping it)"
    fix = "Find the method Textual's screen now refreshes through and wrap that one in benchmarks/metrics.py."
    hook = require("textual", Screen, "_on_timer_update", user=user, fix=fix)
    require_parameters("textual", hook, ["self"], user=user, fix=fix)


def test_textual_footer_key_is_still_the_widget_our_footer_relabels() -> None:
    # Footer.compose yields FooterKey widgets; tui/widgets/footer.py reads their key and key_display, writes a
    # shorter description before they mount, and finds the palette's key by its class. There is no public
    # seam for "one label per key that fits": Footer has no hook between its bindings and its widgets.
    module = pytest.importorskip("textual.widgets._footer")
    user = "tui/widgets/footer.py:KeyFooter (short labels so every key fits the width)"
    fix = "Find where Textual's Footer now makes a widget per key and relabel those in KeyFooter.compose."
    key = require("textual", module, "FooterKey", user=user, fix=fix)
    require_parameters("textual", key.__init__, ["self", "key", "key_display", "description", "action",
                                                 "disabled", "tooltip", "classes"], user=user, fix=fix)
    assert {"key", "key_display", "description"} <= _fields_set_by(key.__init__), _gone(
        "textual", "FooterKey's key / key_display / description attributes", user, fix)
    from textual.widgets import Footer

    assert "-command-palette" in inspect.getsource(Footer.compose), _gone(
        "textual", "the -command-palette class on Footer's palette key", user, fix)
    require("textual", Footer, "compact", user=user, fix=fix)


# -- Rich ---------------------------------------------------------------------------------------------------


def _fields_set_by(init: Callable[..., object]) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    return {
        node.attr for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name) and node.value.id == "self"
    }


def test_rich_markdown_init_sets_exactly_the_fields_our_token_markdown_sets() -> None:
    # _TokenMarkdown skips Rich's Markdown.__init__ (it would parse the text again) and sets its fields by
    # hand: a field Rich adds would be missing when its elements render.
    from rich.markdown import Markdown

    from llmchat.tui.widgets.chat._render import _TokenMarkdown

    rich_fields = _fields_set_by(Markdown.__init__)
    ours = _fields_set_by(_TokenMarkdown.__init__) - {"renderer"}
    missing, extra = sorted(rich_fields - ours), sorted(ours - rich_fields)
    assert (missing, extra) == ([], []), (
        f"{_version('rich')} Markdown.__init__ sets {sorted(rich_fields)}: tui/widgets/chat/_render.py "
        f"(_TokenMarkdown.__init__) sets them by hand and misses {missing}, sets {extra} Rich no longer has. "
        "Set the same fields there, with the values Rich's __init__ gives them."
    )


def test_rich_markdown_elements_still_has_the_entries_we_replace() -> None:
    from rich.markdown import Markdown

    user = "tui/widgets/chat/_render.py (_TokenMarkdown replaces headings, rules, code blocks and tables)"
    fix = "Find the token names Rich's Markdown now dispatches on and key _TokenMarkdown.elements by them."
    elements = require("rich", Markdown, "elements", user=user, fix=fix)
    missing = sorted({"heading_open", "hr", "fence", "code_block", "table_open"} - set(elements))
    assert missing == [], _gone("rich", f"Markdown.elements entries {missing}", user, fix)


def test_rich_console_still_takes_an_environment_of_its_own() -> None:
    from rich.console import Console

    user = "tui/widgets/chat/_render.py (MarkdownRenderer's console, Console(_environ={}))"
    fix = ("Without it the renderer's colours would follow the user's NO_COLOR / TERM / COLUMNS; pass the "
           "environment however Rich now takes it, or pin each of those settings explicitly.")
    params = inspect.signature(Console.__init__).parameters
    assert "_environ" in params, _gone("rich", "Console(_environ=...)", user, fix)
    console = Console(_environ={"NO_COLOR": "1", "COLUMNS": "7"}, width=80, force_terminal=True)
    assert console.no_color and console.width == 80, _gone("rich", "Console honouring _environ", user, fix)


# -- diskcache -----------------------------------------------------------------------------------------------


def test_diskcache_still_retries_its_locks_through_sql_retry(tmp_path: Path) -> None:
    import diskcache
    import diskcache.core

    user = "core/policy/_cache_disk.py (BoundedCache overrides Cache._sql_retry to bound diskcache's lock waits)"
    fix = ("Find how diskcache now retries 'database is locked' and bound it there: a locked cache must be a miss "
           "within the request's budget, not a minute's stall.")
    for name in ("_sql_retry", "_sql"):
        assert isinstance(require("diskcache", diskcache.Cache, name, user=user, fix=fix), property), (
            _gone("diskcache", f"Cache.{name} as a property", user, fix))
    calls = inspect.getsource(diskcache.core).count("self._sql_retry")
    assert calls > 0, _gone("diskcache", "a caller of Cache._sql_retry", user, fix)
    cache = diskcache.Cache(str(tmp_path / "c"))
    try:
        require("diskcache", cache, "_timeout", user=user, fix=fix)
    finally:
        cache.close()
    directory = require("diskcache", diskcache.Disk(str(tmp_path / "c")), "_directory",
                        user="core/policy/_cache_disk.py (SafeDisk.fetch opens value files inside it)",
                        fix="Find where diskcache's Disk now keeps its folder and read it there in SafeDisk.")
    assert directory == str(tmp_path / "c")


# -- hypercorn -----------------------------------------------------------------------------------------------


def test_hypercorn_h2_protocol_hooks_the_retiring_server_overrides() -> None:
    from hypercorn.protocol.h2 import H2Protocol

    user = ("core/server/_retire.py (RetiringH2Protocol: `llmchat serve --max-requests-per-connection` retires "
            "an HTTP/2 connection with a GOAWAY that lets the streams in flight finish)")
    fix = "Port RetiringH2Protocol to hypercorn's new hooks; tests/test_server_keepalive.py then shows it works."
    for name, params in (("_create_stream", ["self", "request"]), ("_send_data", ["self", "stream_id"]),
                         ("_flush", ["self"])):
        require_parameters("hypercorn", require("hypercorn", H2Protocol, name, user=user, fix=fix), params,
                           user=user, fix=fix)


# -- the competing clients' decoders (benchmarks only: the bench extra) ---------------------------------------


@pytest.mark.parametrize(("module", "names"), [
    ("httpx._decoders", ["TextChunker", "TextDecoder"]),
    ("httpx_sse._decoders", ["SSEDecoder", "SSELineDecoder"]),
    ("openai._streaming", ["SSEDecoder"]),
])
def test_the_decoders_benchmarks_sse_decode_compares_against(module: str, names: list[str]) -> None:
    found = pytest.importorskip(module.split(".")[0])
    mod = importlib.import_module(module)
    dist = {"httpx": "httpx", "httpx_sse": "httpx-sse", "openai": "openai"}[found.__name__]
    for name in names:
        require(dist, mod, name, user="benchmarks/sse_decode.py (measures each client's own SSE decoder)",
                fix="Import the decoder from where the library now keeps it.")
