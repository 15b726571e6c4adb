"""The local server's context window and tokenizer, shaped as the servers llmchat meets shape theirs.

``POST /tokenize`` (at the server root, as on llama.cpp and vLLM) takes llama.cpp's ``{"content": TEXT}`` and
answers ``{"tokens": [...]}``; given vLLM's ``{"prompt": TEXT}`` instead it answers vLLM's ``{"count",
"max_model_len", "tokens"}``. ``GET /props`` states the window as llama.cpp's does (``n_ctx``). Token ids are
the positions of the reply generator's tokens in a stable hash: what a client needs is their number, which is
what ``usage.prompt_tokens`` counts (with ``template_overhead`` more a message, as a chat template costs). A
chat that does not fit the window is refused with vLLM's 400; an image to a server without ``vision`` with a
400 like llama.cpp's.
"""

from __future__ import annotations

import zlib
from typing import Any

from llmchat.core.config import ServerSettings
from llmchat.core.server._http import HTTPFailure
from llmchat.core.server._replies import count_prompt_tokens, tokenize
from llmchat.core.server._requests import ChatRequest


def model_meta(settings: ServerSettings) -> dict[str, Any]:
    """What a model object says of the window: vLLM's ``max_model_len`` and llama.cpp's ``meta``."""
    if not settings.context_window:
        return {}
    return {"max_model_len": settings.context_window, "meta": {"n_ctx_train": settings.context_window}}


def props_body(settings: ServerSettings) -> dict[str, Any]:
    """The answer to ``GET /props`` as llama.cpp's server gives it: the window as
    ``default_generation_settings.n_ctx`` (the shape of recent versions; older ones put ``n_ctx`` at the top,
    which it also states)."""
    return {"default_generation_settings": {"n_ctx": settings.context_window, "params": {}},
            "n_ctx": settings.context_window, "total_slots": 1, "model_path": settings.models[0],
            "build_info": "llmchat serve"}


def tokenize_body(payload: dict[str, Any], settings: ServerSettings) -> dict[str, Any]:
    """The answer to ``POST /tokenize``; HTTPFailure 400 when neither ``content`` nor ``prompt`` is text."""
    vllm = "content" not in payload and "prompt" in payload
    text = payload.get("prompt" if vllm else "content")
    if not isinstance(text, str):
        raise HTTPFailure(400, "'content' (or vLLM's 'prompt') must be a string", param="content")
    tokens = [zlib.crc32(t.encode()) & 0xFFFF for t in tokenize(text)]
    if vllm:
        return {"count": len(tokens), "max_model_len": settings.context_window or None, "tokens": tokens}
    return {"tokens": tokens}


def check_request(request: ChatRequest, settings: ServerSettings) -> None:
    """Refuse what this server cannot take: an image without ``vision``, a prompt past the window."""
    if not settings.vision and any(_has_image(m.get("content")) for m in request.messages):
        raise HTTPFailure(400, f"image input is not supported by {request.model} (llmchat serve without "
                          "--vision)", param="messages")
    window = settings.context_window
    if not window:
        return
    prompt = count_prompt_tokens(request.messages, settings.template_overhead)
    completion = request.max_tokens if request.max_tokens is not None else 0
    if prompt + completion > window:
        raise HTTPFailure(
            400,
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). "
            "Please reduce the length of the messages or completion.",
            param="messages",
        )


def _has_image(content: object) -> bool:
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image_url" for p in content)
