"""The conversation widgets: messages, the scrolling conversation, and the prompt."""

from __future__ import annotations

from llmchat.tui.widgets.chat._conversation import Conversation
from llmchat.tui.widgets.chat._message import ChatMessage, Status, UserMessage
from llmchat.tui.widgets.chat._prompt import PromptInput

__all__ = ["ChatMessage", "Conversation", "PromptInput", "Status", "UserMessage"]
