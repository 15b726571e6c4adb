"""A conversation as a tree: every message has a parent (None for the first), and the conversation remembers one
leaf, whose path from the root is the *current branch*: what the chat shows, what resuming sends, what an
export writes.

A regenerated reply is a sibling of the reply it replaces (same parent, the same user message); an edited user
message is a sibling of the message it edits. Siblings are "alternatives", numbered in the order they were
made. Pure: no I/O; :mod:`llmchat.core.history._db` reads the rows and keeps ``leaf_id``.

A parent always has a smaller id than its children (it was saved first), so a branch in id order is a branch
from the root down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def children_of(links: Iterable[tuple[int, int | None]]) -> dict[int | None, list[int]]:
    """``{parent_id: [child ids, oldest first]}`` from ``(id, parent_id)`` pairs; roots are under None."""
    out: dict[int | None, list[int]] = {}
    for msg_id, parent in sorted(links):
        out.setdefault(parent, []).append(msg_id)
    return out


def branch_ids(parents: Mapping[int, int | None], leaf: int | None) -> list[int]:
    """The ids from the root down to ``leaf``; [] for no leaf. A leaf that is not in ``parents`` (a message
    removed by hand) falls back to the newest message, so a conversation never loads empty by mistake."""
    if leaf not in parents:
        leaf = max(parents) if parents else None
    path: list[int] = []
    seen: set[int] = set()
    while leaf is not None and leaf not in seen:  # a cycle made by hand must not hang the app
        seen.add(leaf)
        path.append(leaf)
        leaf = parents.get(leaf)
    path.reverse()
    return path


def newest_leaf_under(children: Mapping[int | None, Sequence[int]], msg_id: int) -> int:
    """The leaf reached from ``msg_id`` by following the newest child at each step: the branch a switch to
    ``msg_id`` shows (the alternative's own latest continuation)."""
    seen = {msg_id}
    while kids := children.get(msg_id):
        msg_id = kids[-1]
        if msg_id in seen:
            break
        seen.add(msg_id)
    return msg_id


def alternatives(children: Mapping[int | None, Sequence[int]], parents: Mapping[int, int | None],
                 msg_id: int) -> tuple[int, ...]:
    """Every alternative of ``msg_id``, itself included, oldest first."""
    return tuple(children.get(parents.get(msg_id), (msg_id,)))
