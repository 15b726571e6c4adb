"""The typed settings model: one frozen dataclass per TOML section.

Defaults live here and nowhere else. ``_config.py`` fills these from the TOML file, the environment and the
command line, and validates every value; ``config.example.toml`` documents each field with its default (a test
checks that the two agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

#: ``True`` negotiates HTTP/2 by ALPN over https (http:// stays HTTP/1.1); ``"h2c"`` speaks HTTP/2 with prior
#: knowledge over plain http://; ``False`` is HTTP/1.1 everywhere.
Http2Mode = bool | Literal["h2c"]
CachePolicy = Literal["deterministic", "always", "off"]


@dataclass(frozen=True, kw_only=True)
class HttpSettings:
    """How the one shared connection pool per provider behaves."""

    http2: Http2Mode = True
    """HTTP/2 over https by ALPN (true), HTTP/1.1 only (false), or prior-knowledge h2c over http:// ("h2c")."""
    max_connections: int = 10
    """Most connections open at once to one provider."""
    max_keepalive_connections: int = 10
    """Most idle connections kept open for reuse."""
    keepalive_expiry_s: float = 30.0
    """An idle connection is closed after this many seconds."""
    connect_timeout_s: float = 10.0
    """Give up opening a connection (DNS, TCP and TLS) after this many seconds."""
    read_timeout_s: float = 120.0
    """Give up when no byte has arrived for this many seconds (keep it at 60 or more: models think before they
    speak)."""
    write_timeout_s: float = 30.0
    """Give up sending a request body after this many seconds."""
    pool_timeout_s: float = 10.0
    """Give up waiting for a free connection from the pool after this many seconds."""
    verify: bool | str = True
    """TLS verification: true, false, or the path of a CA bundle. SSL_CERT_FILE is honoured when true."""
    trust_env: bool = True
    """Take proxies (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY, lower-case too) and SSL_CERT_FILE from the
    environment."""
    proxy: str = ""
    """A proxy for every request, http://host:port (http://user:password@host:port with credentials, which
    are never shown); it wins over HTTPS_PROXY / HTTP_PROXY / ALL_PROXY, NO_PROXY still applies (with
    trust_env). https:// targets tunnel through it (CONNECT), http:// ones go through it as HTTP/1.1. Empty:
    the environment's, if any."""
    warmup: bool = True
    """Open the connection to the active provider before the first prompt (GET /v1/models)."""
    keepalive_ping_s: float = 30.0
    """While idle, ping the provider this often to keep the connection warm; 0 turns it off."""
    max_requests_per_connection: int = 999
    """Open a fresh connection after this many requests on one, letting those in flight finish; 0 never does.
    999 stays just under the 1,000 after which nginx (keepalive_requests, HTTP/1.1 and HTTP/2) and hypercorn
    retire a connection. A server's GOAWAY is honoured either way: no new request goes on that connection, and
    one the server did not take is sent again at once on a new one."""


@dataclass(frozen=True, kw_only=True)
class ProviderSettings:
    """One OpenAI-compatible endpoint under ``[providers.NAME]``."""

    name: str = ""
    """The provider's name: the NAME in [providers.NAME] (set by the loader, not written in the file)."""
    base_url: str = "https://api.openai.com/v1"
    """The API root, up to and including /v1. A query in it (Azure's ?api-version=...) goes on every request,
    after the path; a user:password@ in it is refused: the key goes in api_key or api_key_env."""
    api_key: str | None = field(default=None, repr=False)
    """The API key itself. Prefer api_key_env, so the key stays out of the file."""
    api_key_env: str | None = None
    """The name of an environment variable that holds the API key."""
    model: str | None = None
    """The model to use when none is named."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra headers sent with every request (for example an organisation id)."""
    http: dict[str, object] = field(default_factory=dict)
    """Overrides of [http] keys for this provider only, for example { http2 = "h2c" }."""
    metrics_url: str = ""
    """The server's Prometheus /metrics URL (vLLM, llama.cpp with --metrics, llmchat serve): its queue and
    KV-cache use tell server saturation from network delay. Empty reads none."""
    metrics_interval_s: float = 2.0
    """Seconds between scrapes of metrics_url while the chat app or llmchat bench runs (llmchat ask scrapes
    once, beside its request)."""
    rate_limit_rpm: int = 0
    """Requests per minute this provider allows: the client-side limiter's request bucket (llmchat batch,
    the app, llmchat bench --rate-limit-client) holds requests back before the provider would answer 429.
    0 learns the limit from the provider's x-ratelimit-* headers alone."""
    rate_limit_tpm: int = 0
    """Tokens per minute this provider allows (prompt estimate plus max_tokens per request, as OpenAI counts
    them): the limiter's token bucket. 0 learns it from the x-ratelimit-*-tokens headers alone."""
    batch_discount: float = 0.5
    """The share taken off the price of a request sent through the provider's Batch API (OpenAI's is 0.5,
    half price): llmchat batch --estimate prices its Batch API path with it."""
    context_window: int = 0
    """The model's context window in tokens, for fitting a long conversation into it; 0 learns it from the
    server's /models (vLLM's max_model_len, llama.cpp's meta.n_ctx_train), else fits nothing."""


@dataclass(frozen=True, kw_only=True)
class RetrySettings:
    """When and how long to retry a failed request."""

    max_attempts: int = 4
    """Attempts in all, the first included; 1 turns retries off."""
    base_delay_s: float = 0.5
    """The first backoff step; waits grow as full-jitter exponential from here."""
    max_delay_s: float = 60.0
    """The longest single wait; a server that asks for more fails fast and says when to try again."""
    total_budget_s: float = 120.0
    """The most time spent waiting between attempts of one request, all waits together."""


@dataclass(frozen=True, kw_only=True)
class CacheSettings:
    """The disk cache for batch-mode replies and embeddings."""

    policy: CachePolicy = "deterministic"
    """deterministic: only requests with temperature 0 or a fixed seed; always: every batch request; off."""
    path: str = ""
    """The cache folder; empty means $XDG_CACHE_HOME/llmchat."""
    ttl_s: float = 604800.0
    """Entries expire after this many seconds (default one week); 0 keeps them until evicted."""
    size_limit_mb: int = 512
    """The folder's size cap in MiB; the least recently stored entries go first."""
    replay_streams: bool = False
    """Serve a stream request whose reply is cached as a fast replayed stream, marked as a cache hit."""


@dataclass(frozen=True, kw_only=True)
class BatchSettings:
    """The micro-batcher that groups requests for `llmchat batch` and fan-out."""

    max_size: int = 10
    """A batch goes out when this many requests are queued..."""
    window_ms: float = 100.0
    """...or when the first of them has waited this long."""
    concurrency: int = 10
    """Most requests of a batch in flight at once over the shared pool."""
    completion_window: str = "24h"
    """`--via batch-api`: how long the provider may take over a batch, in hours or days ("24h", "7d");
    OpenAI accepts only 24h."""
    poll_interval_s: float = 10.0
    """`--via batch-api`: how often the batch's status is asked for while it runs."""


@dataclass(frozen=True, kw_only=True)
class UISettings:
    """The chat app."""

    theme: str = "textual-dark"
    """A Textual theme name, such as nord, gruvbox or dracula (an unknown one is an error)."""
    sla_ttft_ms: float = 200.0
    """Stream mode: a time to first token above this is coloured as a miss."""
    sla_total_ms: float = 3000.0
    """Batch mode: a total latency above this is coloured as a miss."""
    stall_s: float = 3.0
    """Seconds without a token after which a reply shows as stalled (under it, and as a badge in the HUD)."""
    headroom_warn: float = 0.1
    """Colour the HUD's rate-limit line of requests or tokens when less than this share of the provider's limit
    is left (0.1: under 10 %), with the share beside the colour."""
    hud_history: int = 60
    """How many recent requests the HUD charts and percentiles cover."""
    show_hud: bool = True
    """Show the HUD at start (it folds away by itself on narrow terminals)."""
    stream: bool = True
    """Start in stream mode (true) or batch mode (false)."""
    prices: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per-model prices per million tokens (input_per_mtok, output_per_mtok), for the HUD's estimated cost."""
    temperature: float | None = None
    """Sampling temperature, 0 to 2, sent with every request of a new conversation; not set sends none (the
    server's default). 0 makes batch replies cacheable under cache policy "deterministic". The palette
    changes it per conversation, which keeps it."""
    seed: int | None = None
    """A fixed seed sent with every request of a new conversation; not set sends none. A seed makes batch
    replies cacheable under cache policy "deterministic". The palette changes it per conversation."""
    max_tokens: int | None = None
    """The longest reply, in tokens, asked of every request of a new conversation; not set leaves it to the
    server. The palette changes it per conversation."""
    show_thinking: bool = False
    """Keep a reply's thinking (a reasoning model's) open after its answer begins; false folds it to one line
    saying how long the model thought. It streams open either way; Ctrl+T (reply.thinking) opens or folds it."""
    export_dir: str = ""
    """The folder the app's exports go to (an absolute path, or one starting with ~/); empty means
    $XDG_DATA_HOME/llmchat/exports. An export never replaces a file: a taken name gets a number."""
    attachment_max_kb: int = 512
    """The largest file that can be attached to a message (/file PATH, the attach key, llmchat ask -f), in
    KB; a text file goes in as a fenced block, an image as a data URI for vision models."""


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """`llmchat serve`, the local OpenAI-compatible server. Flags override these; a profile sets them first."""

    host: str = "127.0.0.1"
    """The address to listen on."""
    port: int = 8000
    """The port to listen on; 0 takes a free one."""
    profile: str = ""
    """A named latency and fault profile (instant, chat, slow, flaky) applied before the keys below."""
    models: list[str] = field(default_factory=lambda: ["llmchat-local", "llmchat-local-large"])
    """The model ids the server offers; the first is its default."""
    ttft_ms: float = 0.0
    """Time to the first content token."""
    tokens_per_s: float = 0.0
    """Generation speed; 0 is unlimited (tokens are coalesced per write so the server is never the bottleneck)."""
    jitter_ms: float = 0.0
    """Random extra delay, up to this much, per token and on the first token."""
    cold_start_ms: float = 0.0
    """Extra delay on the first request for a model after start or after idle_unload_s without traffic."""
    idle_unload_s: float = 300.0
    """A model unused this long is "unloaded" and pays cold_start_ms again."""
    rate_limit: int = 0
    """Requests per minute per API key before 429 with Retry-After; 0 is no limit. A bucket that refills
    continuously, as OpenAI's does; every reply says its state in x-ratelimit-*-requests headers."""
    rate_limit_tokens: int = 0
    """Tokens per minute per API key (prompt plus max_tokens, charged as a request arrives) before 429; 0 is
    no limit. Replies carry x-ratelimit-*-tokens headers."""
    rate_limit_window_s: float = 60.0
    """The span both limits count over: 60 is per minute, as providers' are; a shorter one makes a test quick."""
    error_rate: float = 0.0
    """Probability that a request fails with 500, 502 or 503."""
    drop_rate: float = 0.0
    """Probability that a stream's connection is cut mid-way."""
    stall_ms: float = 0.0
    """A pause this long in the middle of every stream."""
    max_concurrency: int = 0
    """Generate at most this many chat replies at once; the rest queue for a slot (server_timing's started_ns
    and /metrics show it); 0 is no limit."""
    api_key: str = field(default="", repr=False)
    """Require this bearer token (401 without it); empty accepts any."""
    embedding_dim: int = 256
    """The length of the vectors /v1/embeddings returns."""
    default_max_tokens: int = 300
    """Reply length when a request sets no max_tokens."""
    seed: int = 0
    """Seed of the fault dice, so a flaky run can be repeated."""
    certfile: str = ""
    """Serve TLS (HTTP/2 by ALPN) with this certificate; see keyfile."""
    keyfile: str = ""
    """The private key for certfile."""
    tls: bool = False
    """Serve TLS with a self-signed certificate for 127.0.0.1 and localhost when no certfile is given."""
    close_after_stream: bool = False
    """Emulate llama.cpp: after a stream, the next request on that HTTP/1.1 keep-alive connection is cut unanswered."""
    buffer_stream: bool = False
    """Act as a buffering proxy does (nginx's proxy_buffering): send a stream's headers at once but hold its
    chunks until the reply is complete, then send them in one write."""
    split_surrogates: bool = False
    """Stream each emoji as a JSON surrogate-pair escape split across two chunks (\\ud83d in one, \\ude80 in the
    next), each chunk valid JSON on its own, as some servers do; clients must join the pair."""
    reasoning_tokens: int = 0
    """Start every reply with this many tokens of thinking, streamed as reasoning_content deltas (as vLLM and
    DeepSeek send them) before the answer; 0 sends none."""
    reasoning_inline: bool = False
    """Send the thinking inside the content as a <think>...</think> block instead (llama.cpp without a
    reasoning format); the tags arrive cut across chunks."""
    reasoning_open_in_prompt: bool = False
    """Send the thinking inline without its opening <think>, as an R1-style template that opens the tag in the
    prompt streams it: thinking, then </think>, then the answer (implies reasoning_inline)."""
    refuse: bool = False
    """Answer every chat with a refusal, as OpenAI sends one: delta.refusal pieces with content null
    (message.refusal in a whole reply), finish_reason "stop"."""
    tool_call: bool = False
    """Answer with a call to the request's first tool (get_weather when it offers none) instead of text: its
    arguments streamed in pieces, finish_reason "tool_calls"."""
    rtt_ms: float = 0.0
    """Delay bytes in each direction by half of this, so new connections and TLS handshakes cost what they
    cost across regions."""
    max_requests_per_connection: int = 1000
    """Retire a connection after this many requests, as nginx does by default (keepalive_requests): HTTP/1.1
    with Connection: close on the last response, HTTP/2 with a GOAWAY as the last request arrives, finishing
    the streams up to it; 0 keeps connections open for good (long benchmarks)."""
    batch_turnaround_s: float = 0.0
    """The Batch API (/v1/batches): a batch's lines are spread over this many seconds before it completes; 0
    runs them as fast as the reply path allows."""
    batch_fail_share: float = 0.0
    """The share of each batch's lines that fail with a 500 in its error file (which ones: by the seed)."""
    batch_expire: bool = False
    """Each batch expires once half its lines are done (at the end of its turnaround): the rest are in the error
    file as batch_expired, as OpenAI writes them."""
    context_window: int = 0
    """The context window /v1/models reports (as vLLM's max_model_len and llama.cpp's meta.n_ctx_train) and
    GET /props states (as llama.cpp's n_ctx); a chat whose prompt and max_tokens do not fit in it is refused
    with 400, as vLLM does; 0 reports none."""
    template_overhead: int = 0
    """Tokens per message that usage.prompt_tokens (and the window check) count beyond OpenAI's 4 of framing,
    as a chat template does (llama.cpp's costs about 10 more); /tokenize still counts the text alone."""
    timings: bool = False
    """Send llama.cpp's timings object (prompt_n, prompt_ms, predicted_n, predicted_ms, ...) in the last
    chunk of a stream and in every whole reply, beside server_timing."""
    bunch: int = 1
    """Send this many paced stream events per write (as llama-server over loopback often delivers several
    in one read); 1 writes each token as it is due."""
    prefill_tokens_per_s: float = 0.0
    """Prompt processing speed: the first token waits (prompt tokens / this) longer, as on a real server,
    where a longer history costs prefill time; 0 adds none."""
    vision: bool = False
    """Take image_url parts in chat messages; without it they are refused with 400, as by a llama.cpp
    server started without a vision projector."""


@dataclass(frozen=True, kw_only=True)
class LogSettings:
    """Logs llmchat writes besides its own warnings."""

    requests_path: str = ""
    """Append one JSON line per request (its timing record, never a key) to this file; empty writes none."""
    include_text: bool = False
    """Also write each request's prompt and reply text in the request log."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything llmchat can be told, resolved from defaults, file, environment and flags (later wins)."""

    default_provider: str = ""
    """The provider used when none is named; empty means the only one, or the local server if there is none."""
    providers: dict[str, ProviderSettings] = field(default_factory=dict)
    """Named providers, [providers.NAME]."""
    http: HttpSettings = field(default_factory=HttpSettings)
    retry: RetrySettings = field(default_factory=RetrySettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    batch: BatchSettings = field(default_factory=BatchSettings)
    ui: UISettings = field(default_factory=UISettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    log: LogSettings = field(default_factory=LogSettings)
    keymap: dict[str, str] = field(default_factory=dict)
    """Key binding id = keys, for example "prompt.send" = "ctrl+s" (quoted: ids hold dots); F1 in the app
    lists every id with its key, and an unknown id or key is an error naming the closest id."""
