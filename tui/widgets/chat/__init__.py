"""The conversation widgets: messages, the scrolling conversation, and the prompt."""

from __future__ import annotations

from llmchat.tui.widgets.chat._conversation import Conversation
from llmchat.tui.widgets.chat._message import ChatMessage, Status, UserMessage
from llmchat.tui.widgets.chat._prompt import PromptInput
from llmchat.tui.widgets.chat._thinking import ReplyExtras, ThinkingBlock, ToolCallCard, history_widgets

__all__ = [
    "ChatMessage", "Conversation", "PromptInput", "ReplyExtras", "Status", "ThinkingBlock", "ToolCallCard",
    "UserMessage", "history_widgets",
]
