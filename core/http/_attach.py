"""Files attached to a message, in the shapes OpenAI-compatible servers take.

A text file goes into the message's text as a fenced block under its name (the fence longer than any run of
backticks inside, so a Markdown file with code in it stays whole); an image (PNG, JPEG, GIF, WebP, told by
its first bytes, not its name) goes in as an ``image_url`` part with a ``data:`` URI, which vision models on
OpenAI, vLLM, llama.cpp (with a projector) and Ollama take. Anything else is one line saying why it cannot go.
``/file PATH`` lines in a prompt name attachments; :func:`split_file_lines` takes them out.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llmchat.core.errors import UsageError

_IMAGES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
_FILE_LINE = re.compile(r"^/file[ \t]+(.+?)[ \t]*$", re.M)
_BACKTICKS = re.compile(r"`{3,}")


class AttachmentError(UsageError):
    """A file that cannot be attached: missing, unreadable, binary or too large (one line, with the fix)."""


@dataclass(frozen=True, slots=True)
class Attachment:
    """One file, read and ready to go into a message."""

    name: str
    """The file's name as shown (its path as given)."""
    kind: Literal["text", "image"]
    size: int
    """Bytes on disk."""
    text: str = ""
    """A text file's content."""
    mime: str = ""
    data: bytes = b""
    """An image's bytes."""

    def block(self) -> str:
        """A text file as a fenced block under its name; an image as a one-line mention (what history keeps)."""
        if self.kind == "image":
            return f"[image: {self.name}, {_size(self.size)}]"
        longest = max((len(m) for m in _BACKTICKS.findall(self.text)), default=2)
        fence = "`" * max(3, longest + 1)
        lang = Path(self.name).suffix.lstrip(".")
        body = self.text if self.text.endswith("\n") or not self.text else self.text + "\n"
        return f"`{self.name}`:\n{fence}{lang}\n{body}{fence}"

    def data_uri(self) -> str:
        """An image as a ``data:`` URI."""
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 1024 else f"{n / 1024:,.0f} KB"


def image_type(head: bytes) -> str:
    """The image MIME type ``head`` (a file's first bytes) starts with, else ""."""
    for magic, mime in _IMAGES:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return ""


def read_attachment(path: str | Path, *, max_bytes: int, name: str | None = None) -> Attachment:
    """Read ``path`` as an attachment. Raises AttachmentError, one line naming the file, for a missing,
    unreadable, too large or binary (not UTF-8 text, not an image) file."""
    p = Path(path).expanduser()
    shown = name or str(path)
    try:
        if p.is_dir():
            raise AttachmentError(f"cannot attach {shown}: it is a folder; name a file in it")
        size = p.stat().st_size
        if size > max_bytes:
            raise AttachmentError(
                f"cannot attach {shown}: it is {_size(size)}, over the {_size(max_bytes)} limit; attach a "
                "part of it or raise ui.attachment_max_kb")
        data = p.read_bytes()[: max_bytes + 1]
    except FileNotFoundError:
        raise AttachmentError(f"cannot attach {shown}: no such file; check the path") from None
    except PermissionError:
        raise AttachmentError(f"cannot attach {shown}: permission denied; check the file's permissions") from None
    except OSError as exc:
        raise AttachmentError(f"cannot attach {shown}: {exc.strerror or exc}; check the path") from None
    if len(data) > max_bytes:  # it grew since stat
        raise AttachmentError(f"cannot attach {shown}: it is over the {_size(max_bytes)} limit; raise "
                              "ui.attachment_max_kb")
    mime = image_type(data[:16])
    if mime:
        return Attachment(shown, "image", len(data), mime=mime, data=data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
        binary = True
    else:
        binary = "\x00" in text
    if binary:
        raise AttachmentError(
            f"cannot attach {shown}: it is a binary file, not UTF-8 text or a PNG, JPEG, GIF or WebP image; "
            "attach its text instead")
    return Attachment(shown, "text", len(data), text=text.removeprefix("\ufeff"))


def split_file_lines(prompt: str) -> tuple[str, list[str]]:
    """The prompt without its ``/file PATH`` lines, and those paths in order."""
    paths = [m.group(1) for m in _FILE_LINE.finditer(prompt)]
    if not paths:
        return prompt, []
    return _FILE_LINE.sub("", prompt).strip("\n"), paths


def message_text(prompt: str, attachments: Sequence[Attachment]) -> str:
    """The text a message keeps (history, export): the prompt, then each file's block."""
    return "\n\n".join([prompt] * bool(prompt) + [a.block() for a in attachments])


def message_content(prompt: str, attachments: Sequence[Attachment]) -> str | list[dict[str, Any]]:
    """What goes on the wire as the message's ``content``: the text alone, or, with images, a list of a text
    part and one ``image_url`` part per image."""
    text = message_text(prompt, [a for a in attachments if a.kind == "text"])
    images = [a for a in attachments if a.kind == "image"]
    if not images:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts += [{"type": "image_url", "image_url": {"url": a.data_uri()}} for a in images]
    return parts
