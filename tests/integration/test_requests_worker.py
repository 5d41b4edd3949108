"""Request telemetry end to end: simulated RAG requests through Tansu into the worker's
RequestPipeline, the retrieval slowdown paged at a real HTTP receiver and stored in Redis."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import redis

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.sim_requests import RequestSimConfig, RequestSimulator
from ragwatch.codec import encode
from ragwatch.config import Settings
from ragwatch.receiver import WebhookReceiver
from ragwatch.store import Keys
from tests.integration.conftest import wait_until


def test_retrieval_slowdown_is_paged_with_its_baseline(
    rw_env: dict[str, str],
    receiver: WebhookReceiver,
    redis_client: redis.Redis,
    start_ragwatch: Callable[..., Any],
    make_settings: Callable[[dict[str, str]], Settings],
) -> None:
    env = {**rw_env, "RAGWATCH_WEBHOOK_URLS": receiver.url}
    settings = make_settings(env)
    worker = start_ragwatch(["worker"], env)
    start_ragwatch(["notify"], env)
    sim = RequestSimulator(RequestSimConfig(services=1, instances=2, scenario="retrieval"))
    target = sim.fault_target
    assert target is not None
    publisher = KafkaPublisher(settings.kafka_config())
    for _, (_, envelopes) in zip(range(int(45 * 60 / 10)), sim.ticks(), strict=False):
        for e in envelopes:  # 45 minutes of event time; the fault starts at minute 20
            publisher.write(settings.topic("requests"), e.service, encode(e))
    assert publisher.flush(30) == 0
    publisher.close()

    def paged(body: dict[str, Any]) -> bool:
        return any(
            a["status"] == "firing" and a["labels"]["alertname"] == "RetrievalSlowdown"
            for a in body["alerts"]
        )

    body = receiver.wait_for(paged, timeout_s=60)
    assert body is not None, worker.output()[-3000:]
    (alert,) = body["alerts"]
    assert alert["labels"]["service"] == target.service
    assert alert["labels"]["instance"] == target.instance
    assert alert["value"] > 3 and 80 < alert["expected"] < 150  # ratio; baseline P99 in ms
    assert "retrieval P99" in alert["annotations"]["summary"]
    # Only the slowed instance pages, and nothing else fires on the healthy one.
    assert all(
        a["labels"].get("instance") == target.instance for b in receiver.bodies for a in b["alerts"]
    )
    keys = Keys(env["RAGWATCH_REDIS_PREFIX"])
    wait_until(lambda: redis_client.hexists(keys.services, target.service), 10, "the snapshot")
    snap = orjson.loads(redis_client.hget(keys.services, target.service) or b"{}")
    assert {i["instance"] for i in snap["instances"]} == {
        f"{target.service}-0",
        f"{target.service}-1",
    }
    assert worker.stop() == 0
