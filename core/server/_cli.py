"""The local server's command line, shared by `llmchat serve` and `python -m llmchat.core.server`.

Settings, later wins: the defaults, the profile (``--profile``, or ``server.profile`` in the config), the
config file's ``[server]`` section, then each flag given. Exit status 0 after a clean shutdown, 2 for a bad flag
value, 1 when the address cannot be bound. The engine never starts the face: ``start_subprocess`` runs
``python -m llmchat.core.server``, which needs nothing of ``llmchat.tui``. Only ``run`` imports the server
itself (hypercorn): building the parser stays cheap, so `llmchat --help` and `llmchat ask` never pay for it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from llmchat.core.config import ServerSettings, load_settings
from llmchat.core.errors import LLMChatError
from llmchat.core.server._profiles import PROFILE_SUMMARIES, resolve_settings

DESCRIPTION = (
    "Serve /v1/chat/completions, /v1/embeddings, /v1/models, the Batch API (/v1/files, /v1/batches) and "
    "/health over HTTP/1.1 and h2c (or h2 and HTTP/1.1 over TLS), with deterministic replies and a latency "
    "and fault profile."
)
METRICS_HELP = (
    "serve Prometheus metrics (requests by route and status, in flight, tokens sent) at "
    "http://127.0.0.1:PORT/metrics; 0 takes a free port (needs the metrics extra)"
)

# flag dest -> ServerSettings field, for the flags whose names differ
_FIELD = {"model": "models"}

EPILOG = (
    "profiles (explicit flags win over the profile):\n"
    + "\n".join(f"  {name:<8} {summary}" for name, summary in PROFILE_SUMMARIES.items())
    + (
        "\n\nWith --tokens-per-s 0 (unlimited) the server sends every token that is due in one write,"
        "\nup to 16 KiB, so it is never the bottleneck of a client benchmark. The last chunk before [DONE]"
        "\nand every whole reply carry server_timing: time.monotonic_ns() stamps of request received,"
        "\nfirst token sent and last token sent."
    )
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every server flag (not --config and --metrics-port, which the caller adds its own way)."""
    a = p.add_argument
    a("--host", help="the address to listen on (default 127.0.0.1)")
    a("--port", type=int, help="the port (default 8000; 0 takes a free one)")
    a("--profile", choices=list(PROFILE_SUMMARIES), help="a named latency and fault profile (see below)")
    a(
        "--model",
        action="append",
        metavar="ID",
        help="a model id to offer; repeat for more (the first is the default)",
    )
    a("--ttft-ms", type=float, metavar="MS", help="time to the first content token")
    a("--tokens-per-s", type=float, metavar="N", help="generation speed; 0 is unlimited")
    a("--jitter-ms", type=float, metavar="MS", help="random extra delay, up to this, per token")
    a(
        "--cold-start-ms",
        type=float,
        metavar="MS",
        help="extra delay on a model's first request after start or after --idle-unload-s without traffic",
    )
    a(
        "--idle-unload-s",
        type=float,
        metavar="S",
        help="a model unused this long pays the cold start again (0 never)",
    )
    a("--rate-limit", type=int, metavar="N", help="requests per minute per API key before 429 (0: no limit); "
      "a refilling bucket, its state in x-ratelimit-*-requests headers")
    a("--rate-limit-tokens", type=int, metavar="N",
      help="tokens per minute per API key (prompt plus max_tokens) before 429 (0: no limit)")
    a("--rate-limit-window-s", type=float, metavar="S",
      help="the span both limits count over (default 60: per minute; shorter makes a test quick)")
    a("--error-rate", type=float, metavar="P", help="probability of a 500/502/503 reply")
    a("--drop-rate", type=float, metavar="P", help="probability that a stream's connection is cut mid-way")
    a("--stall-ms", type=float, metavar="MS", help="a pause this long in the middle of every stream")
    a(
        "--max-concurrency",
        type=int,
        metavar="N",
        help="generate at most N chat replies at once; the rest queue (server_timing and /metrics show the "
        "wait; 0: no limit)",
    )
    a("--api-key", metavar="KEY", help="require this bearer token (401 without it)")
    a("--embedding-dim", type=int, metavar="N", help="length of /v1/embeddings vectors (default 256)")
    a("--seed", type=int, help="seed of the fault dice, so a flaky run repeats")
    a(
        "--tls",
        action="store_true",
        default=None,
        help="serve https (h2 by ALPN) with a self-signed certificate for 127.0.0.1 and localhost "
        "(prints its path)",
    )
    a("--certfile", metavar="PEM", help="serve https with this certificate (needs --keyfile)")
    a("--keyfile", metavar="PEM", help="the private key for --certfile")
    a(
        "--rtt-ms",
        type=float,
        metavar="MS",
        help="emulate a network round trip: delay bytes by half of this each way, so new connections and "
        "TLS handshakes cost what they do across regions (a proxy in front of the server; see llmchat proxy)",
    )
    a(
        "--max-requests-per-connection",
        type=int,
        metavar="N",
        help="retire a connection after N requests, as nginx does (default 1000): HTTP/1.1 with "
        "Connection: close, HTTP/2 with a GOAWAY that lets the streams in flight finish; 0: never",
    )
    a(
        "--close-after-stream",
        action="store_true",
        default=None,
        help="emulate llama.cpp: after a stream, hang up on the next request of that HTTP/1.1 connection",
    )
    a(
        "--buffer-stream",
        action="store_true",
        default=None,
        help="act as a buffering proxy: hold a stream's chunks until its end, then send them in one write",
    )
    a(
        "--split-surrogates",
        action="store_true",
        default=None,
        help="stream each emoji as a surrogate-pair escape split across two chunks (each valid JSON alone)",
    )
    a(
        "--batch-turnaround-s",
        type=float,
        metavar="S",
        help="the Batch API (/v1/files, /v1/batches): spread a batch's lines over S seconds before it "
        "completes (default 0: as fast as the reply path goes)",
    )
    a(
        "--batch-fail-share",
        type=float,
        metavar="P",
        help="the share of each batch's lines that fail with a 500 in its error file (by --seed)",
    )
    a(
        "--batch-expire",
        action="store_true",
        default=None,
        help="batches expire once half their lines are done; the rest are batch_expired in the error file",
    )
    a(
        "--reasoning-tokens",
        type=int,
        metavar="N",
        help="think first: N tokens of reasoning in reasoning_content deltas before every answer (0: none)",
    )
    a(
        "--reasoning-inline",
        action="store_true",
        default=None,
        help="send the thinking inline in the content as <think>...</think> instead (tags cut across chunks)",
    )
    a(
        "--reasoning-open-in-prompt",
        action="store_true",
        default=None,
        help="send the inline thinking without its opening <think> (a template that opens it in the prompt): "
        "thinking</think>answer",
    )
    a(
        "--refuse",
        action="store_true",
        default=None,
        help="answer every chat with a refusal as OpenAI sends one (delta.refusal, message.refusal)",
    )
    a(
        "--tool-call",
        action="store_true",
        default=None,
        help="answer with a call to the request's first tool (get_weather if none), arguments streamed in "
        "pieces, finish_reason tool_calls",
    )
    a(
        "--context-window",
        type=int,
        metavar="N",
        help="report a context window of N tokens in /v1/models (vLLM's max_model_len, llama.cpp's "
        "meta.n_ctx_train) and GET /props (llama.cpp's n_ctx), and refuse a chat that does not fit in it "
        "with 400, as vLLM does",
    )
    a(
        "--template-overhead",
        type=int,
        metavar="N",
        help="count N more tokens per message in usage.prompt_tokens and the window check than OpenAI's 4 "
        "(as llama.cpp's chat template does; /tokenize counts the text alone)",
    )
    a(
        "--timings",
        action="store_true",
        default=None,
        help="send llama.cpp's timings object (prompt_n, prompt_ms, predicted_n, predicted_ms, ...) in the "
        "last chunk and every whole reply",
    )
    a(
        "--bunch",
        type=int,
        metavar="N",
        help="send N paced stream events per write, as llama-server over loopback often delivers several in "
        "one read (default 1)",
    )
    a(
        "--prefill-tokens-per-s",
        type=float,
        metavar="N",
        help="prompt processing speed: the first token waits prompt tokens / N longer (reported as prefill in "
        "server_timing), so a longer history costs time as on a real server; 0 adds none",
    )
    a(
        "--vision",
        action="store_true",
        default=None,
        help="take image_url parts in chat messages (without it they are refused with 400, as by llama.cpp "
        "without a vision projector)",
    )
    p.set_defaults(func=run)


def config_values(config: str | None) -> dict[str, Any]:
    """The [server] keys the config file and LLMCHAT_SERVER__* set, as a layer over the profile.

    Keys equal to their defaults are left out, so a profile named on the command line still applies; the
    price is that a key written out at its default value cannot override a profile (name it as a flag).
    """
    server = load_settings(config).server
    defaults = ServerSettings()
    return {f.name: getattr(server, f.name) for f in dataclasses.fields(server)
            if getattr(server, f.name) != getattr(defaults, f.name)}


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerSettings keys the command line gave explicitly."""
    names = (
        "host",
        "port",
        "profile",
        "model",
        "ttft_ms",
        "tokens_per_s",
        "jitter_ms",
        "cold_start_ms",
        "idle_unload_s",
        "rate_limit",
        "rate_limit_tokens",
        "rate_limit_window_s",
        "error_rate",
        "drop_rate",
        "stall_ms",
        "max_concurrency",
        "api_key",
        "embedding_dim",
        "seed",
        "tls",
        "certfile",
        "keyfile",
        "close_after_stream",
        "buffer_stream",
        "split_surrogates",
        "context_window",
        "template_overhead",
        "timings",
        "bunch",
        "prefill_tokens_per_s",
        "vision",
        "rtt_ms",
        "max_requests_per_connection",
        "batch_turnaround_s",
        "batch_fail_share",
        "batch_expire",
        "reasoning_tokens",
        "reasoning_inline",
        "reasoning_open_in_prompt",
        "refuse",
        "tool_call",
    )
    return {_FIELD.get(n, n): getattr(args, n) for n in names if getattr(args, n, None) is not None}


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM with the settings ``args`` give (``args.config``, ``args.metrics_port``);
    returns 0 after a clean shutdown. Raises LLMChatError (UsageError for a bad value) with one line."""
    from llmchat.core.observe._prometheus import MetricsServer
    from llmchat.core.server._metrics import ServerMetrics
    from llmchat.core.server._start import serve

    settings = resolve_settings(config_values(args.config), flag_values(args))
    metrics, exposed = None, None
    if args.metrics_port is not None:
        metrics = ServerMetrics()
        exposed = MetricsServer(metrics.registry, args.metrics_port)
        # Before the ready line: whoever waits for that line may scrape at once.
        print(f"llmchat server metrics on {exposed.url}", flush=True)
    try:
        asyncio.run(serve(settings, ready=lambda line: print(line, flush=True), metrics=metrics))
    finally:
        if exposed is not None:
            exposed.close()
    return 0


def _port(text: str) -> int:
    value = int(text) if text.lstrip("-").isdigit() else -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 65535, got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        print(f"llmchat serve: {message}; see `python -m llmchat.core.server --help`", file=sys.stderr)
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m llmchat.core.server [flags]``: the server on its own, as `llmchat serve` runs it."""
    parser = _Parser(prog="python -m llmchat.core.server", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="PATH", help="the config file (its [server] section)")
    parser.add_argument("--metrics-port", type=_port, metavar="PORT", help=METRICS_HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except LLMChatError as exc:
        print(f"llmchat: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
