"""The Prometheus scrape source: ``ragwatch agent --source prom --target URL ...``.

Each :meth:`PromSource.sample` scrapes every target once, in order, over HTTP (text
format 0.0.4, a deadline of ``timeout_s`` for the whole response, at most
:data:`MAX_SCRAPE_BYTES`), parses the exposition with prometheus_client and returns:

- a :class:`~ragwatch.schema.GpuEnvelope` per host for the GPUs of a dcgm-exporter
  target (framebuffer MiB -> bytes, ``fb_total = used + free + reserved``, no processes);
  a GPU without framebuffer fields (MIG instances, NVIDIA/dcgm-exporter#512) is left
  out and its fields go with the metrics; the exporter's Kubernetes labels (``namespace``,
  ``pod``, ``container``) become the GPU's, when they name one container;
- one :class:`~ragwatch.schema.MetricsEnvelope` per target: vLLM, SGLang, llama.cpp, TGI,
  Text Embeddings Inference, Triton (and left-over DCGM) metrics renamed by the table in
  :mod:`ragwatch.agents.prom_map`, and
  everything else passed through unchanged. Counters stay cumulative, as scraped;
  rates and counter resets are handled in streams.

No envelope is ever empty. A target that fails (refused, HTTP error, timeout, too
large, malformed text) is logged, counted in ``stats[url]`` and skipped; ``sample``
never raises for it. NaN and infinite values are dropped and counted (the schema
refuses them). A target's series beyond ``series_cap`` (renamed series first, then
passed-through ones, in exposition order) are dropped and counted, with one warning.

>>> text = '''# TYPE vllm:num_requests_waiting gauge
... vllm:num_requests_waiting{model_name="llama"} 3.0
... # TYPE DCGM_FI_DEV_FB_USED gauge
... DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",modelName="NVIDIA H100"} 1024
... # TYPE DCGM_FI_DEV_FB_FREE gauge
... DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1",modelName="NVIDIA H100"} 3072
... '''
>>> src = PromSource(["http://vllm:8000/metrics"], host="node-1", clock=lambda: 100.0,
...                  fetch=lambda url, timeout_s: text)
>>> gpus, metrics = src.sample()
>>> gpus.host, gpus.gpus[0].fb_used, gpus.gpus[0].fb_total
('node-1', 1073741824, 4294967296)
>>> [(s.name, s.value, s.labels["engine"]) for s in metrics.samples]
[('ragwatch_requests_waiting', 3.0, 'vllm')]
>>> src.stats["http://vllm:8000/metrics"].scrapes
1
"""

from __future__ import annotations

import http.client
import logging
import math
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ragwatch.agents import prom_map
from ragwatch.errors import RagwatchError
from ragwatch.schema import Envelope, EventEnvelope, GpuEnvelope, MetricSample, MetricsEnvelope

log = logging.getLogger(__name__)

MAX_SCRAPE_BYTES = 16 * 1024 * 1024
ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
USER_AGENT = "ragwatch-agent"
_CHUNK = 64 * 1024
_FETCH_ERRORS = (OSError, ValueError, LookupError, http.client.HTTPException, RagwatchError)

Fetch = Callable[[str, float], str]


class ScrapeError(RagwatchError):
    """A scrape target answered, but not with something ragwatch will read."""


def fetch_text(url: str, timeout_s: float, *, max_bytes: int = MAX_SCRAPE_BYTES) -> str:
    """GET ``url`` and return its body as text, within ``timeout_s`` for the whole response.

    Environment proxies are ignored (a scrape goes to the target, as Prometheus does).
    Raises OSError (refused, HTTP error status, timeout), ScrapeError (over
    ``max_bytes``) or ValueError/LookupError (undecodable body).
    """
    deadline = time.monotonic() + timeout_s
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, headers={"Accept": ACCEPT, "User-Agent": USER_AGENT})
    chunks: list[bytes] = []
    size = 0
    with opener.open(req, timeout=timeout_s) as resp:
        charset = resp.headers.get_content_charset() or "utf-8"
        while chunk := resp.read1(_CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise ScrapeError(f"response larger than {max_bytes} bytes")
            if time.monotonic() > deadline:
                raise TimeoutError(f"response not complete after {timeout_s:g}s")
            chunks.append(chunk)
    return b"".join(chunks).decode(charset)


@dataclass
class TargetStats:
    """Counters of one target since the source started."""

    scrapes: int = 0  # successful scrapes (fetched and parsed)
    fetch_errors: int = 0  # refused, HTTP error, timeout, too large
    parse_errors: int = 0  # malformed exposition text
    non_finite: int = 0  # NaN/Inf samples dropped
    duplicate_series: int = 0  # same series from two sources (deprecated twins)
    dropped_series: int = 0  # series beyond series_cap
    incomplete_gpus: int = 0  # dcgm GPUs sent as metrics for want of FB fields
    last_error: str | None = None
    up: bool | None = None  # None until the first scrape


def _finite(samples: list[MetricSample], st: TargetStats) -> list[MetricSample]:
    """The samples with finite values; the others are counted in ``st.non_finite``."""
    finite = [s for s in samples if math.isfinite(s.value)]
    st.non_finite += len(samples) - len(finite)
    return finite


@dataclass(frozen=True)
class Target:
    """One ``/metrics`` URL and the host its telemetry is filed under.

    ``host`` None: the source's ``host``. The host labels of the samples
    (``host_labels``: dcgm-exporter's ``Hostname``) name the host of their series, unless
    ``pinned``: a host named for the target on the command line (``HOST=URL``) wins.
    """

    url: str
    host: str | None = None
    pinned: bool = False


class PromSource:
    """Scrape Prometheus targets into ragwatch envelopes; see the module docstring."""

    def __init__(
        self,
        targets: Sequence[str | Target],
        *,
        host: str,
        host_labels: Sequence[str] = prom_map.HOST_LABELS,
        timeout_s: float = 5.0,
        series_cap: int = 2000,
        clock: Callable[[], float] = time.time,
        fetch: Fetch | None = None,
    ) -> None:
        if not targets:
            raise ValueError("PromSource needs at least one target")
        specs = [t if isinstance(t, Target) else Target(t) for t in targets]
        if len({t.url for t in specs}) != len(specs):
            raise ValueError("PromSource targets must be distinct")
        for t in specs:
            if urlsplit(t.url).scheme not in ("http", "https") or not urlsplit(t.url).netloc:
                raise ValueError(f"target must be an http(s) URL, got {t.url!r}")
        if not host or any(t.host == "" for t in specs):
            raise ValueError("host must not be empty")
        if timeout_s <= 0 or series_cap < 1:
            raise ValueError("timeout_s must be > 0 and series_cap >= 1")
        self.targets = tuple(t.url for t in specs)
        self._specs = {t.url: t for t in specs}
        self.host = host
        self.host_labels = tuple(host_labels)
        self.timeout_s = timeout_s
        self.series_cap = series_cap
        self.clock = clock
        self.fetch: Fetch = fetch or fetch_text
        self.stats = {url: TargetStats() for url in self.targets}
        self._xids: dict[prom_map.XidKey, float] = {}  # the last XID gauge value per GPU

    def sample(self) -> list[Envelope]:
        """Scrape every target once; GpuEnvelopes and a MetricsEnvelope per target."""
        out: list[Envelope] = []
        for url in self.targets:
            out.extend(self._scrape(url))
        return out

    def _scrape(self, url: str) -> list[Envelope]:
        st = self.stats[url]
        raw = self._read(url, st)
        if raw is None:
            return []
        ts = self.clock()
        host, labels = self.host_of(url)
        xids, raw = prom_map.xid_gauges(raw, host, labels)
        gpus, rest, incomplete = prom_map.split_gpus(_finite(raw, st), host, labels)
        st.incomplete_gpus += incomplete
        out: list[Envelope] = [
            GpuEnvelope(host=h, ts=ts, gpus=tuple(g)) for h, g in sorted(gpus.items())
        ]
        out += self._xid_events(xids, ts)
        selected, duplicates = prom_map.select(rest)
        st.duplicate_series += duplicates
        samples = self._cap(url, _finite(selected, st), st)  # a unit scale can overflow
        for h, group in prom_map.by_host(samples, host, labels).items():
            out.append(MetricsEnvelope(host=h, target=url, ts=ts, samples=tuple(group)))
        return out

    def host_of(self, url: str) -> tuple[str, tuple[str, ...]]:
        """The host a target's telemetry is filed under, and the sample labels that may
        name another (none when the host is pinned)."""
        spec = self._specs[url]
        return spec.host or self.host, () if spec.pinned else self.host_labels

    def _xid_events(self, xids: dict[prom_map.XidKey, float], ts: float) -> list[Envelope]:
        """One XID event per change of a GPU's XID gauge to a new nonzero value. The first
        value seen is where the gauge stands, not an event: it may be days old (a repeat of
        the same XID cannot be told from the gauge)."""
        out: list[Envelope] = []
        for key, value in xids.items():
            before = self._xids.get(key)
            self._xids[key] = value
            if before is not None and value != before and value > 0:
                attrs = prom_map.xid_event_attrs(key, value)
                out.append(EventEnvelope(host=key[0], ts=ts, type="xid", attrs=attrs))
        return out

    def _read(self, url: str, st: TargetStats) -> list[MetricSample] | None:
        """The target's samples, or None (logged and counted) if it cannot be read."""
        try:
            text = self.fetch(url, self.timeout_s)
        except _FETCH_ERRORS as exc:
            st.fetch_errors += 1
            self._down(url, f"fetch failed: {exc}")
            return None
        try:
            raw = prom_map.parse(text)
        except ValueError as exc:  # prometheus_client raises ValueError on malformed text
            st.parse_errors += 1
            self._down(url, f"malformed exposition: {str(exc)[:200] or 'unparsable line'}")
            return None
        if st.up is False:
            log.info("scrape target=%s is back after %s", url, st.last_error)
        st.scrapes += 1
        st.up = True
        return raw

    def _down(self, url: str, reason: str) -> None:
        st = self.stats[url]
        if st.up is not False:
            log.warning("scrape target=%s failed: %s", url, reason)
        else:
            log.debug("scrape target=%s still failing: %s", url, reason)
        st.up = False
        st.last_error = reason

    def _cap(self, url: str, samples: list[MetricSample], st: TargetStats) -> list[MetricSample]:
        if len(samples) <= self.series_cap:
            return samples
        if st.dropped_series == 0:
            log.warning(
                "scrape target=%s exposes %d series, over series_cap=%d; dropping the rest",
                url,
                len(samples),
                self.series_cap,
            )
        st.dropped_series += len(samples) - self.series_cap
        return samples[: self.series_cap]
