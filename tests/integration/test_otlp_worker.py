"""OTLP traces through Kafka: spans made and encoded by the OpenTelemetry SDK, published to
the OTLP topic as the Collector's Kafka exporter would (both encodings, a trace split
across messages, messages sent twice), relayed by the worker as request records and paged
at a real receiver, the same alerts as ``ragwatch replay`` of the same spans."""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.sim_requests import RequestSimConfig, RequestSimulator
from ragwatch.commands.replay import replay
from ragwatch.config import Settings
from ragwatch.receiver import WebhookReceiver
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.notifier.webhook import rfc3339
from tests.integration.conftest import read_records
from tests.otel_spans import Fleet, otlp_json, otlp_proto


def test_spans_through_kafka_page_as_their_replay_does(
    rw_env: dict[str, str],
    receiver: WebhookReceiver,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
    tmp_path: Path,
) -> None:
    env = {**rw_env, "RAGWATCH_WEBHOOK_URLS": receiver.url}
    settings = make_settings(env)
    topic = settings.otlp_topic_name()
    assert topic is not None
    worker = start_ragwatch(["worker"], env)
    start_ragwatch(["notify"], env)
    # 72 recorded requests a minute and the fault at minute 30: the latency baselines
    # judge after 1,500 values (issue 30), reached at minute 21
    cfg = RequestSimConfig(
        services=2, scenario="retrieval", batch_s=10.0, base_qps=12.0, fault_start_s=1800.0
    )
    fleet = Fleet()
    publisher = KafkaPublisher(settings.kafka_config())
    recording = tmp_path / "traces.otlp.jsonl"
    with recording.open("wb") as f:
        for n, (_, batch) in enumerate(itertools.islice(RequestSimulator(cfg).ticks(), 480)):
            for e in batch:  # 80 minutes of event time; the fault starts at minute 30
                spans = fleet.spans(e)
                if not spans:
                    continue
                f.write(otlp_json(spans) + b"\n")
                half = len(spans) // 2  # one trace's spans in two messages, two encodings
                for part in (spans[:half], spans[half:]):
                    encode = otlp_proto if n % 2 else otlp_json
                    publisher.write(topic, e.service, encode(part))
                    if n % 17 == 0:  # at-least-once: some messages arrive twice
                        publisher.write(topic, e.service, encode(part))
    assert publisher.flush(30) == 0
    publisher.close()

    def paged(body: dict[str, Any]) -> bool:
        return any(
            a["status"] == "firing" and a["labels"]["alertname"] == "RetrievalSlowdown"
            for a in body["alerts"]
        )

    body = receiver.wait_for(paged, timeout_s=90)
    assert body is not None, worker.output()[-3000:]
    live = {
        (a["labels"]["alertname"], a["labels"].get("instance"), a["startsAt"])
        for b in receiver.bodies
        for a in b["alerts"]
        if a["status"] == "firing"
    }
    out = io.StringIO()
    assert replay([recording], load_rules(), out, as_json=True, err=io.StringIO()) == 0
    offline = {
        (t["labels"]["alertname"], t["labels"].get("instance"), rfc3339(t["starts_at"]))
        for t in map(orjson.loads, out.getvalue().splitlines())
        if t.get("kind") != "summary" and t.get("status") == "firing"
    }
    assert live == offline and {i for _, i, _ in live} == {"rag-api-1"}
    # the relay's records, on the requests topic keyed by service, as the SDK sends them
    relayed = read_records(settings, settings.topic("requests"), 100)
    assert {r.key().decode() for r in relayed} <= {svc for svc, _ in fleet.services}
    assert worker.stop() == 0
