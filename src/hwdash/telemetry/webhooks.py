"""``--webhook URL``: each alert event POSTed as JSON to a chat's incoming webhook (or any HTTP endpoint).

The body is the alert-log record of the event (:func:`hwdash.telemetry.alert_actions.alert_record`:
``kind``, ``gpu_index``, ``gpu_name``, ``pressure``, ``message``, ``host``, ``pid``... and ``diagnosis``
for a health rule) plus ``text``: one line a person reads, which Slack and Mattermost incoming webhooks
show as the message. The structured fields are the raw strings (``json.dumps`` escapes whatever they
hold); ``text`` is cleaned: no control characters or escape sequences, at most :data:`TEXT_LIMIT`
characters, ``&``, ``<``, ``>`` written as ``&amp;``, ``&lt;``, ``&gt;`` (Slack's message formatting
reads ``<...>`` as a link or a mention, ``<!channel>`` included) and ``@`` as ``＠`` (Mattermost's
``@channel``), so a GPU or host name stays text and pages nobody.

Delivery never holds up sampling. :meth:`WebhookSender.post` serialises the event and appends it to a
bounded queue (O(1), never waits on the network); when the queue is full the oldest entry is dropped
and counted. One daemon thread sends the queue in order with ``urllib`` (stdlib only), a timeout per
try, and bounded retries with exponential backoff for what may pass (no connection, a timeout, HTTP 5xx
and 429, whose ``Retry-After`` is honoured up to the backoff's cap), none for what will not (other 4xx,
and redirects, which are not followed: a POST turned into a GET would lose the alert). Counters: sent,
failed (gave up), dropped (queue full, or still queued when the monitor exits), the last error.

The URL is a secret (a Slack webhook URL is its own credential): it is never printed or logged whole,
only ``scheme://host/…`` (:func:`redact_url`). ``--webhook env:NAME`` reads it from the environment
variable ``NAME``, and ``HWDASH_WEBHOOK`` holds URLs separated by commas or white space, so it need not
appear in the shell history or ``ps``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import unicodedata
import urllib.parse
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hwdash.errors import UsageError

if TYPE_CHECKING:
    import urllib.error

# urllib.request (with http.client and email) is imported by the sender only: about 14 ms and
# 3.7 MiB that a monitor without --webhook does not load before its first frame (issue 28).

log = logging.getLogger(__name__)

WEBHOOK_ENV = "HWDASH_WEBHOOK"
"""URLs to post alerts to when no ``--webhook`` is given (commas or white space between them)."""

ENV_PREFIX = "env:"
"""``--webhook env:NAME``: the URL is the value of environment variable ``NAME``."""

FLAG = "--webhook"

SCHEMES = ("http", "https")

DEFAULT_TIMEOUT_S = 5.0
"""Seconds one try may take (connect, send, answer)."""

MAX_ATTEMPTS = 4
"""Tries per event and URL (the first and three retries) before it counts as failed."""

BACKOFF_S = 1.0
"""Wait before the first retry; doubled before each next one (1, 2, 4 s)..."""

MAX_BACKOFF_S = 30.0
"""...and never longer than this, a server's ``Retry-After`` included."""

QUEUE_SIZE = 256
"""Deliveries (event x URL) waiting for the sender; beyond it the oldest is dropped."""

TEXT_LIMIT = 300
"""Characters of ``text`` at most (before Slack's escaping): one line on a phone's notification."""

_SETTLE_S = 0.5
"""Seconds :meth:`WebhookSender.close` waits, after stopping, for a delivery between tries to count
itself failed."""

_RESPONSE_READ_LIMIT = 64 * 1024
"""Bytes of a server's answer read (and ignored) before the connection is closed."""

_ESCAPE_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|.)?")
"""An ANSI/VT escape: CSI (``ESC [ ... m``), OSC (``ESC ] ... BEL``) or a two-character one."""

_CHAT_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "@": "\uff20"})
"""The three characters Slack's message formatting asks to escape in ``text``, and ``@`` as the
full-width ``＠``: Mattermost reads ``@channel`` or ``@here`` in a webhook's text as a mention that
notifies everyone in the channel."""

_WORDS = {
    "raised": "ALERT",
    "lost": "GPU LOST",
    "blind": "BLIND",
    "cleared": "cleared",
    "recovered": "recovered",
}
"""The first word of ``text`` per event kind (a health diagnosis raised reads ``HEALTH``)."""


# -- URLs -----------------------------------------------------------------------------------------


def redact_url(url: str) -> str:
    """``scheme://host[:port]/…``: enough to tell webhooks apart, never the path, query or
    user name and password, where a webhook's secret lives."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "a URL that cannot be read"
    if not parts.scheme or not host:
        return "a URL without scheme://host"
    scheme = clean_line(parts.scheme, limit=16)
    where = clean_line(host, limit=80) + (f":{port}" if port is not None else "")
    return f"{scheme}://{where}/…"


def check_url(url: str, flag: str) -> str:
    """``url`` when it is an http or https URL with a host; else a :class:`UsageError` naming
    ``flag`` that shows only :func:`redact_url` of it."""
    if any(char.isspace() or unicodedata.category(char) == "Cc" for char in url):
        raise UsageError(f"{redact_url(url)} holds white space or control characters", flag=flag)
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        _ = parts.port  # ValueError for a port that is not a number in range
    except ValueError:
        raise UsageError(f"{redact_url(url)} is not a URL with a valid port", flag=flag) from None
    if not parts.scheme:
        raise UsageError("the URL does not start with http:// or https://", flag=flag)
    if parts.scheme.lower() not in SCHEMES:
        raise UsageError(
            f"only http:// and https:// webhooks are sent, not "
            f"{clean_line(parts.scheme, limit=16)}:// ({redact_url(url)})",
            flag=flag,
        )
    if not host:
        raise UsageError(f"{redact_url(url)}: the URL names no host", flag=flag)
    return url


def parse_webhook_urls(
    values: Sequence[str] | None,
    environ: Mapping[str, str] | None = None,
    *,
    simulated: bool = False,
) -> tuple[str, ...]:
    """The URLs to post alerts to: each ``--webhook`` value (``env:NAME`` is the value of variable
    ``NAME``), else those in ``HWDASH_WEBHOOK``; checked (http or https, a host), duplicates
    once. A bad one is a :class:`UsageError` naming the flag (or the variable). ``simulated``
    (``--demo``, a fake scenario, a replay): ``HWDASH_WEBHOOK`` is not read, so a demo never pages
    the phone a profile's variable points at; an explicit ``--webhook`` still posts (to try it)."""
    import os

    env = os.environ if environ is None else environ
    sources: list[tuple[str, str]]
    if values:
        sources = [(value, FLAG) for value in values]
    elif simulated:
        return ()
    else:
        listed = env.get(WEBHOOK_ENV, "")
        sources = [(value, WEBHOOK_ENV) for value in re.split(r"[,\s]+", listed) if value]
    urls: list[str] = []
    for value, flag in sources:
        text = value.strip()
        if text.startswith(ENV_PREFIX):
            name = text[len(ENV_PREFIX) :]
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise UsageError(
                    f"env:NAME needs the name of an environment variable, got "
                    f"{clean_line(name, limit=40)!r}",
                    flag=flag,
                )
            flag = f"{flag} env:{name}"
            text = env.get(name, "").strip()
            if not text:
                raise UsageError(f"environment variable {name} is not set or empty", flag=flag)
        if not text:
            raise UsageError("the URL is empty", flag=flag)
        url = check_url(text, flag)
        if url not in urls:
            urls.append(url)
    return tuple(urls)


# -- the message ----------------------------------------------------------------------------------


def clean_line(text: str, *, limit: int = TEXT_LIMIT) -> str:
    """``text`` as one plain line: escape sequences and control or format characters removed
    (tabs and line breaks become spaces), runs of spaces made one, at most ``limit`` characters
    (the last one ``…`` when cut)."""
    text = _ESCAPE_SEQUENCE.sub("", text[: limit * 8])  # a huge line is cut before it is read
    kept = []
    for char in text:
        if char.isspace():
            kept.append(" ")
        elif unicodedata.category(char) not in ("Cc", "Cf", "Cs"):
            kept.append(char)
    line = " ".join("".join(kept).split())
    if len(line) > limit:
        line = line[: max(0, limit - 1)].rstrip() + "…"
    return line


def webhook_text(record: Mapping[str, Any]) -> str:
    """The line a chat shows: ``hwdash HOST: ALERT: GPU 3 (NVIDIA A100...) memory 93% full...``
    (the host, the GPU and what happened: the alert's own message names the GPU), cleaned by
    :func:`clean_line` and escaped for Slack and Mattermost."""
    kind = str(record.get("kind") or "")
    word = _WORDS.get(kind, kind or "event")
    if record.get("diagnosis") and kind == "raised":
        word = "HEALTH"
    host = str(record.get("host") or "?")
    message = str(record.get("message") or "")
    line = clean_line(f"hwdash {host}: {word}: {message}")
    return line.translate(_CHAT_ESCAPES)


# -- the sender -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookStats:
    """What the sender has done so far."""

    sent: int = 0
    """Deliveries a server accepted (2xx)."""
    failed: int = 0
    """Deliveries given up: a 4xx other than 429, a redirect, or every try failed."""
    dropped: int = 0
    """Deliveries never tried: the queue was full, or they were still queued at exit."""
    last_error: str | None = None
    """The last failure (``https://host/…: HTTP 500``), None when none."""

    def to_dict(self) -> dict[str, Any]:
        """``{sent, failed, dropped, last_error}`` (``monitor --json``'s ``webhooks``)."""
        return {
            "sent": self.sent,
            "failed": self.failed,
            "dropped": self.dropped,
            "last_error": self.last_error,
        }

    def brief(self) -> str:
        """A few words for the dashboard's status line: ``webhook 3 sent, 1 failed``."""
        words = f"webhook {self.sent} sent"
        if self.failed:
            words += f", {self.failed} failed"
        if self.dropped:
            words += f", {self.dropped} dropped"
        return words

    def counts(self) -> str:
        """``3 sent, 1 failed, 0 dropped (last error: https://host/…: HTTP 500)``."""
        words = f"{self.sent} sent, {self.failed} failed, {self.dropped} dropped"
        if self.last_error:
            words += f" (last error: {self.last_error})"
        return words

    def summary(self) -> str:
        """One line for the end of ``hwdash monitor``: ``webhooks:`` and :meth:`counts`."""
        return f"webhooks: {self.counts()}"


def _opener() -> Any:
    """A urllib opener that does not follow redirects."""
    import urllib.request

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        """Redirects end the delivery (an HTTPError with the 3xx code): urllib would turn the
        POST into a GET without the alert, possibly to another host."""

        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    return urllib.request.build_opener(_NoRedirect())


def _error_words(exc: BaseException, timeout_s: float) -> str:
    """Why a try failed, in a few words that hold nothing from the URL or the server's text."""
    import urllib.error
    from http.client import HTTPException

    reason: object = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, OSError) and reason.strerror:
        return clean_line(reason.strerror, limit=80)
    if isinstance(reason, HTTPException):
        return f"bad HTTP answer ({type(reason).__name__})"
    return clean_line(str(reason) or type(reason).__name__, limit=80)


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    """A ``Retry-After`` in seconds (the delay form; a date is ignored), or None."""
    value = exc.headers.get("Retry-After") if exc.headers is not None else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None


class WebhookSender:
    """Posts alert records to webhook URLs from one daemon thread (see the module's text).

    :meth:`post` is all the sampler calls: it never waits on the network. :meth:`stats` may be
    read from any thread. :meth:`close` gives queued deliveries a grace period, then stops.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_attempts: int = MAX_ATTEMPTS,
        backoff_s: float = BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        if not urls:
            raise ValueError("a webhook sender needs at least one URL")
        if max_attempts < 1 or queue_size < 1 or not timeout_s > 0:
            raise ValueError("max_attempts and queue_size must be at least 1, timeout_s above 0")
        self.urls = tuple(urls)
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.queue_size = queue_size
        self.attempts = 0
        """Tries made (each POST, retries included)."""
        self._queue: deque[tuple[str, bytes]] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._closing = False
        self._stop = threading.Event()
        self._sent = 0
        self._failed = 0
        self._dropped = 0
        self._last_error: str | None = None
        self._opener = _opener()
        self._thread = threading.Thread(target=self._run, name="hwdash-webhook", daemon=True)
        self._thread.start()

    # -- what the sampler calls ---------------------------------------------------------------

    def post(self, record: Mapping[str, Any]) -> None:
        """Queue ``record`` (an alert-log record) with its ``text`` for every URL; returns at once."""
        try:
            body = json.dumps(
                {**record, "text": webhook_text(record)}, sort_keys=True, allow_nan=False
            ).encode("utf-8")
        except (TypeError, ValueError) as exc:  # not JSON: a NaN, an odd value
            with self._cond:
                self._failed += len(self.urls)
                self._last_error = f"the event cannot be written as JSON: {exc}"
            return
        with self._cond:
            for url in self.urls:
                if self._closing:
                    self._dropped += 1
                    continue
                if len(self._queue) >= self.queue_size:
                    self._queue.popleft()
                    self._dropped += 1
                self._queue.append((url, body))
            self._cond.notify()

    def stats(self) -> WebhookStats:
        """The counters now."""
        with self._cond:
            return WebhookStats(self._sent, self._failed, self._dropped, self._last_error)

    @property
    def queued(self) -> int:
        """Deliveries waiting (not counting one being sent)."""
        with self._cond:
            return len(self._queue)

    def close(self, timeout_s: float = 3.0) -> WebhookStats:
        """Wait up to ``timeout_s`` for the queue to be sent, then stop: what is still queued is
        dropped (counted), a delivery between tries gives up (counted failed). Returns the
        counters."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            self._closing = True
            while self._queue or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._dropped += len(self._queue)
            self._queue.clear()
            self._stop.set()
            self._cond.notify_all()
            # A delivery waiting to retry gives up at once (counted failed); one on the wire is
            # not waited for beyond a moment (its thread is a daemon).
            settle_by = time.monotonic() + _SETTLE_S
            while self._busy and (remaining := settle_by - time.monotonic()) > 0:
                self._cond.wait(remaining)
        return self.stats()

    # -- the sender thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait()
                if self._stop.is_set():
                    return
                url, body = self._queue.popleft()
                self._busy = True
            try:
                self._deliver(url, body)
            except Exception:  # a bug must not end the thread and leave the queue unsent
                log.exception("webhook delivery to %s failed unexpectedly", redact_url(url))
                with self._cond:
                    self._failed += 1
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _deliver(self, url: str, body: bytes) -> None:
        """Try up to ``max_attempts`` times, waiting between tries; count the outcome."""
        where = redact_url(url)
        for attempt in range(1, self.max_attempts + 1):
            delivered, retry, error, wait_s = self._try(url, body)
            if delivered:
                with self._cond:
                    self._sent += 1
                return
            with self._cond:
                self._last_error = f"{where}: {error}"
            if not retry or attempt == self.max_attempts:
                break
            delay = self.backoff_s * 2 ** (attempt - 1) if wait_s is None else wait_s
            if self._stop.wait(min(delay, self.max_backoff_s)):
                break  # closing: no more tries
        log.warning("webhook %s: alert not delivered: %s", where, error)
        with self._cond:
            self._failed += 1

    def _try(self, url: str, body: bytes) -> tuple[bool, bool, str, float | None]:
        """One POST: (delivered, worth retrying, why not, the server's Retry-After or None)."""
        import urllib.error
        import urllib.request
        from http.client import HTTPException

        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "hwdash-webhook"},
        )
        with self._cond:
            self.attempts += 1
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                response.read(_RESPONSE_READ_LIMIT)
            return True, False, "", None
        except urllib.error.HTTPError as exc:
            code = exc.code
            retry_after = _retry_after(exc) if code == 429 else None
            exc.close()
            if 300 <= code < 400:
                return False, False, f"HTTP {code} redirect (not followed)", None
            return False, code == 429 or code >= 500, f"HTTP {code}", retry_after
        except ValueError as exc:  # http.client.InvalidURL and the like: no retry helps
            return False, False, _error_words(exc, self.timeout_s), None
        except (OSError, HTTPException) as exc:  # URLError, timeouts, resets, bad answers
            return False, True, _error_words(exc, self.timeout_s), None
