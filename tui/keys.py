"""Every key binding of the app in one registry: its id, default keys, what it does and where it applies.

An id names one binding and only one, so ``[keymap]`` in the config file moves exactly what it says. The app,
its screens and the prompt build their ``BINDINGS`` from here with :func:`binding`; a test checks that every
binding of every widget and screen under ``llmchat.tui`` is in the registry with the same keys, and that no id
is used twice. :func:`check_keymap` checks a keymap against the registry before the app starts and in
``llmchat config check``. The help screen (F1) lists the registry with the keys in effect.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from textual.binding import Binding
from textual.keys import Keys, format_key

from llmchat.core import ConfigError


@dataclass(frozen=True, slots=True)
class KeyBinding:
    """One binding of the registry."""

    id: str
    """What ``[keymap]`` calls it: ``area.verb``."""
    keys: str
    """The default keys in Textual's syntax, comma-separated: ``"shift+enter,ctrl+j,alt+enter"``."""
    label: str
    """The footer's short label."""
    help: str
    """What it does, for the help screen."""
    where: str
    """Where it applies: the chat screen, the prompt, the history list, a modal."""
    short: str = ""
    """A shorter label for a narrow footer ("" when the label is short already)."""


CHAT, PROMPT, HISTORY, HUD, CHARTS, TEXT_INPUT, SYSTEM_PROMPT, HELP, SEARCH = (
    "chat screen", "prompt", "history list", "HUD", "HUD charts", "text input box", "system prompt editor",
    "this list", "search")

REGISTRY: tuple[KeyBinding, ...] = (
    KeyBinding("help.open", "f1", "Keys", "list every key and what it does", CHAT),
    KeyBinding("mode.toggle", "ctrl+b", "Stream/Batch", "switch between stream and batch mode", CHAT,
               "Mode"),
    KeyBinding("reply.cancel", "escape", "Cancel", "cancel the reply in flight, keeping what arrived", CHAT),
    KeyBinding("reply.thinking", "ctrl+t", "Thinking", "show or fold the latest reply's thinking", CHAT),
    KeyBinding("hud.toggle", "f2", "HUD", "show or hide the HUD (over the chat when narrow)", CHAT),
    # Not f6 / f7: the prompt (a TextArea) selects the line and all its text with those.
    KeyBinding("hud.overlay", "f8", "HUD over chat", "show the HUD over the chat, at any width", CHAT,
               "Over"),
    KeyBinding("hud.charts", "f5", "Charts", "open the HUD's latency charts", CHAT),
    # Not ctrl+y / ctrl+k: the prompt (a TextArea) uses those for redo and delete-to-end-of-line.
    KeyBinding("copy.reply", "f3", "Copy reply", "copy the selected message, else the last reply", CHAT, "Copy"),
    KeyBinding("copy.code", "f4", "Copy code",
               "copy the last code block of the selected message (else the last reply); again: the one before",
               CHAT, "Code"),
    # Alt+arrows: the prompt (a TextArea) moves its cursor with the bare and Ctrl/Shift arrows.
    KeyBinding("select.previous", "alt+up", "Select ↑", "select the message before (first press: the last)",
               CHAT),
    KeyBinding("select.next", "alt+down", "Select ↓", "select the message after", CHAT),
    KeyBinding("reply.regenerate", "ctrl+r", "Regenerate",
               "ask for another reply to the last prompt; the old reply is kept as an alternative", CHAT),
    KeyBinding("message.edit", "f9", "Edit",
               "edit the selected prompt (else the last one); sending it starts a branch, Esc backs out", CHAT),
    KeyBinding("alternative.previous", "alt+left", "◀ alt",
               "show the previous alternative of the selected message (else the last one that has some)",
               CHAT),
    KeyBinding("alternative.next", "alt+right", "alt ▶",
               "show the next alternative of the selected message (else the last one that has some)", CHAT),
    KeyBinding("search.open", "ctrl+f", "Search", "search every conversation", CHAT),
    KeyBinding("history.open", "ctrl+o", "History", "list the saved conversations", CHAT, "List"),
    KeyBinding("conversation.new", "ctrl+n", "New", "start a new conversation", CHAT),
    KeyBinding("attach.file", "ctrl+l", "Attach", "attach a file to the next message (as /file PATH)", CHAT),
    KeyBinding("app.quit", "ctrl+q", "Quit", "quit llmchat", CHAT),
    KeyBinding("prompt.send", "enter", "Send", "send the prompt (kept while a reply is coming)", PROMPT),
    KeyBinding("prompt.newline", "shift+enter,ctrl+j,alt+enter", "New line",
               "insert a line break (Ctrl+J works everywhere)", PROMPT),
    # The prompt keeps focus: it hands these to the conversation before its own editing keys see them.
    KeyBinding("conversation.pageup", "pageup", "Page up", "scroll the conversation a page up", PROMPT),
    KeyBinding("conversation.pagedown", "pagedown", "Page down", "scroll the conversation a page down",
               PROMPT),
    KeyBinding("conversation.top", "ctrl+home,home", "Top",
               "scroll to the conversation's start (Home: when the prompt is empty)", PROMPT),
    KeyBinding("conversation.bottom", "ctrl+end,end", "Bottom",
               "scroll to the end and follow new text again (End: when the prompt is empty)", PROMPT),
    KeyBinding("history.resume", "enter", "Open", "open the conversation under the cursor", HISTORY),
    KeyBinding("history.rename", "r", "Rename", "rename the conversation under the cursor", HISTORY),
    KeyBinding("history.delete", "d", "Delete", "delete the conversation under the cursor", HISTORY),
    KeyBinding("history.confirm", "y", "Yes, delete", "answer yes to a delete question", HISTORY),
    KeyBinding("history.keep", "n", "Keep", "answer no to a delete question", HISTORY),
    KeyBinding("history.close", "escape", "Close", "back out of a rename or question, else close", HISTORY),
    KeyBinding("hud.detail", "d", "Latency charts", "open the latency charts", HUD),
    KeyBinding("hud.detail.close", "escape,d", "Close", "close the charts", CHARTS),
    KeyBinding("input.cancel", "escape", "Cancel", "close without changing anything", TEXT_INPUT),
    KeyBinding("system.save", "ctrl+s", "Save", "save the system prompt for this conversation",
               SYSTEM_PROMPT),
    KeyBinding("system.cancel", "escape", "Cancel", "close, keeping the system prompt as it was",
               SYSTEM_PROMPT),
    KeyBinding("search.hit", "enter", "Open", "open the conversation at the highlighted hit", SEARCH),
    KeyBinding("search.close", "escape", "Close", "close the search", SEARCH),
    KeyBinding("help.close", "escape", "Close", "close this list", HELP),
)
"""In the help screen's order: grouped by where they apply."""

BY_ID: Mapping[str, KeyBinding] = {b.id: b for b in REGISTRY}


def binding(binding_id: str, action: str, *, show: bool = True, priority: bool = False) -> Binding:
    """The Textual binding for ``binding_id`` with its default keys and label; KeyError for an unknown id."""
    entry = BY_ID[binding_id]
    return Binding(entry.keys, action, entry.label, show=show, priority=priority, id=entry.id)


def key_names(keys: str) -> tuple[str, ...]:
    """The key names a key string stands for, as Textual's key events spell them (``"?"`` is
    ``question_mark``); InvalidBinding for an empty entry such as ``"ctrl+s,"``."""
    return tuple(b.key for b in Binding.make_bindings([Binding(keys, "")]))


def effective_keys(keymap: Mapping[str, str]) -> dict[str, str]:
    """Each registry id's keys with ``keymap`` applied over the defaults (ids not in the registry ignored)."""
    return {b.id: keymap.get(b.id, b.keys) for b in REGISTRY}


_MODIFIERS = frozenset({"ctrl", "shift", "alt", "meta", "super", "hyper"})
# The key names Textual's key events use besides characters: "f1", "enter", "pageup", "ctrl+a"'s "a"...
_NAMED = frozenset(k.value.rpartition("+")[2] for k in Keys if not k.value.startswith("<"))


def _known(key: str) -> bool:
    *modifiers, base = key.split("+")
    if not base or any(m not in _MODIFIERS for m in modifiers):
        return False
    if len(base) == 1:
        # Textual spells a bare "?" as question_mark itself, but not after a modifier: "ctrl+?" never matches.
        return base.isalnum() or not modifiers
    # A character key by its Unicode name, in Textual's spelling ("question_mark", "slash").
    return base in _NAMED or len(format_key(base)) == 1


def _closest(name: str) -> str | None:
    """The id ``name`` most likely means: the closest whole id, else the id whose last part is closest
    (``send`` is ``prompt.send``)."""
    close = difflib.get_close_matches(name, list(BY_ID), n=1)
    if close:
        return close[0]
    by_last = {b.id.rpartition(".")[2]: b.id for b in reversed(REGISTRY)}  # the first in the registry wins
    close = difflib.get_close_matches(name.rpartition(".")[2], list(by_last), n=1)
    return by_last[close[0]] if close else None


def check_keymap(keymap: Mapping[str, str]) -> None:
    """Raise ConfigError (one line, exit status 2) for the first id the registry does not have, with the
    closest one, or the first key string no key event can match."""
    for binding_id, keys in keymap.items():
        if binding_id not in BY_ID:
            close = _closest(binding_id)
            hint = f'did you mean "{close}"?' if close else "the ids: " + ", ".join(BY_ID)
            raise ConfigError(f'keymap: "{binding_id}" is not a key binding id ({hint})')
        names = [k.strip() for k in keys.split(",")]
        bad = next((k for k in names if not _known(key_names(k)[0] if k else k)), None)
        if bad is not None:
            shown = f'"{bad}" in "{keys}"' if len(names) > 1 else f'"{keys}"'
            raise ConfigError(
                f'keymap: {shown} for "{binding_id}" is not a key Textual knows; write keys like "ctrl+s", '
                '"f6" or "shift+enter", several separated by commas'
            )


_LABELS = {"escape": "Esc", "enter": "Enter", "pageup": "PgUp", "pagedown": "PgDn", "delete": "Del",
           "backspace": "Backspace"}


def key_label(keys: str) -> str:
    """How a person reads a key string: ``"ctrl+o"`` is ``Ctrl+O``, ``"escape,d"`` is ``Esc / d``."""
    labels = []
    for key in key_names(keys):
        *modifiers, base = key.split("+")
        name = _LABELS.get(base) or format_key(base)
        if len(name) > 1 and name.isascii():
            name = name[0].upper() + name[1:]
        elif modifiers:
            name = name.upper()
        labels.append("+".join([*(m.capitalize() for m in modifiers), name]))
    return " / ".join(labels)


__all__ = [
    "BY_ID", "REGISTRY", "KeyBinding", "binding", "check_keymap", "effective_keys", "key_label", "key_names",
]
