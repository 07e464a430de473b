"""Wrap vLLM log lines the way runtimes and collectors deliver them to a bucket.

Each builder follows the shape its own documentation gives (named per builder); none of
these collectors runs here, so the fixtures are built from those documents:

- CRI: the Kubernetes CRI logging format (kubernetes/design-proposals
  "kubelet-cri-logging.md"; kubelet's ``pkg/kubelet/kuberuntime/logs``): one
  ``<RFC3339Nano> <stream> <P|F> <text>`` per line, long lines split into ``P`` pieces.
- Docker: the json-file logging driver (docs.docker.com "JSON File logging driver"):
  ``{"log": "...\\n", "stream": "stdout", "time": "<RFC3339Nano>"}``, lines over 16 KiB
  split into records whose text lacks the newline.
- Fluent Bit: the ``tail`` input with the ``kubernetes`` filter and the ``s3`` output's
  ``json_lines`` format (docs.fluentbit.io "Amazon S3", "Kubernetes" filter): the record's
  ``date`` key (``json_date_key``, epoch seconds by default), ``log``, ``stream``, and
  ``kubernetes.{pod_name, namespace_name, container_name, ...}``.
- Vector: the ``kubernetes_logs`` source's event (vector.dev "Kubernetes logs" source,
  output fields) with the ``aws_s3`` sink's ``json`` codec: ``message``, ``timestamp``,
  ``stream``, ``source_type``, ``kubernetes.{pod_name, pod_namespace, container_name}``.
- Loki: logcli ``query --output jsonl`` (grafana.com "LogCLI"), and the push API body
  ``{"streams": [{"stream": {...}, "values": [["<unix ns>", "<line>"]]}]}``
  (grafana.com "Loki HTTP API", POST /loki/api/v1/push) that Alloy's ``loki.write`` and
  Promtail send, with the Kubernetes discovery labels ``namespace``, ``pod``, ``container``.
- OTLP: OTLP/JSON ``ExportLogsServiceRequest`` (opentelemetry.io "OTLP Specification",
  JSON encoding) as the collector-contrib ``awss3exporter`` writes with ``otlp_json``;
  ``k8s.*`` resource attributes of the ``k8sattributes`` processor.
- CloudWatch: a subscription filter's payload (docs.aws.amazon.com "Subscription
  filters", the ``DATA_MESSAGE`` shape), delivered by Firehose, which concatenates
  records; and an export task's lines (``<ISO 8601> <message>``, "Exporting log data to
  Amazon S3").
- GCP: Cloud Logging's ``LogEntry`` (cloud.google.com "LogEntry" reference) as a sink
  writes it to Cloud Storage, ``resource.type = k8s_container``.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

BASE = datetime(2026, 12, 1, 19, 3, 0, 123456, tzinfo=UTC)


_VLLM_STAMP = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def stamp(i: int, line: str = "") -> datetime:
    """The time a collector gives line ``i``: the line's own second (2026, UTC) when it has one.

    A real collector's stamp is a few milliseconds later than vLLM's; the whole second is
    used here so that an envelope's rows can be compared with the bare log's.
    """
    m = _VLLM_STAMP.search(line)
    if m:
        month, day, h, mi, s = map(int, m.groups())
        return datetime(2026, month, day, h, mi, s, tzinfo=UTC)
    return BASE + timedelta(milliseconds=10 * i)


def rfc3339_nano(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond:06d}000Z"


def ns(t: datetime) -> str:
    return str(int(t.timestamp()) * 10**9 + t.microsecond * 1000)


POD = {"namespace": "llm", "pod": "decode-0", "container": "vllm"}


def cri(lines: list[str], split_at: int | None = None) -> str:
    out = []
    for i, line in enumerate(lines):
        when = rfc3339_nano(stamp(i, line))
        if split_at and len(line) > split_at:
            pieces = [line[j : j + split_at] for j in range(0, len(line), split_at)]
            out += [f"{when} stdout P {p}" for p in pieces[:-1]]
            out.append(f"{when} stdout F {pieces[-1]}")
        else:
            out.append(f"{when} stdout F {line}")
    return "\n".join(out) + "\n"


def docker(lines: list[str], split_at: int | None = None) -> str:
    out = []
    for i, line in enumerate(lines):
        when = rfc3339_nano(stamp(i, line))
        pieces = [line]
        if split_at and len(line) > split_at:
            pieces = [line[j : j + split_at] for j in range(0, len(line), split_at)]
        for k, piece in enumerate(pieces):
            text = piece + ("\n" if k == len(pieces) - 1 else "")
            out.append(json.dumps({"log": text, "stream": "stdout", "time": when}))
    return "\n".join(out) + "\n"


def _k8s_meta(pod: dict) -> dict:
    return {
        "pod_name": pod["pod"],
        "namespace_name": pod["namespace"],
        "pod_id": "5d1c1e8e-0c9b-4f5e-9a55-3f1f6c0a1b2c",
        "labels": {"app": "vllm"},
        "host": "gpu-node-7",
        "container_name": pod["container"],
        "docker_id": "a" * 64,
        "container_hash": "vllm/vllm-openai@sha256:" + "b" * 64,
        "container_image": "vllm/vllm-openai:v0.33.0",
    }


def fluentbit(lines: list[str], pods: list[dict] | None = None) -> str:
    out = []
    for i, line in enumerate(lines):
        pod = (pods or [POD])[i % len(pods or [POD])]
        t = stamp(i, line)
        out.append(json.dumps({
            "date": t.timestamp(),
            "time": rfc3339_nano(t),
            "stream": "stdout",
            "logtag": "F",
            "log": line,
            "kubernetes": _k8s_meta(pod),
        }))
    return "\n".join(out) + "\n"


def vector(lines: list[str], pods: list[dict] | None = None) -> str:
    out = []
    for i, line in enumerate(lines):
        pod = (pods or [POD])[i % len(pods or [POD])]
        out.append(json.dumps({
            "file": f"/var/log/pods/{pod['namespace']}_{pod['pod']}_5d1c/{pod['container']}/0.log",
            "kubernetes": {
                "container_id": "containerd://" + "c" * 64,
                "container_image": "vllm/vllm-openai:v0.33.0",
                "container_name": pod["container"],
                "pod_ip": "10.0.3.17",
                "pod_labels": {"app": "vllm"},
                "pod_name": pod["pod"],
                "pod_namespace": pod["namespace"],
                "pod_node_name": "gpu-node-7",
                "pod_uid": "5d1c1e8e-0c9b-4f5e-9a55-3f1f6c0a1b2c",
            },
            "message": line,
            "source_type": "kubernetes_logs",
            "stream": "stdout",
            "timestamp": rfc3339_nano(stamp(i, line)),
        }))
    return "\n".join(out) + "\n"


def loki_jsonl(lines: list[str], pods: list[dict] | None = None) -> str:
    out = []
    for i, line in enumerate(lines):
        pod = (pods or [POD])[i % len(pods or [POD])]
        labels = {"namespace": pod["namespace"], "pod": pod["pod"], "container": pod["container"],
                  "job": f"{pod['namespace']}/{pod['pod']}", "stream": "stdout"}  # fmt: skip
        out.append(json.dumps({"labels": labels, "line": line, "timestamp": rfc3339_nano(stamp(i, line))}))
    return "\n".join(out) + "\n"


def loki_push(lines: list[str], pods: list[dict] | None = None) -> str:
    streams: dict[str, dict] = {}
    for i, line in enumerate(lines):
        pod = (pods or [POD])[i % len(pods or [POD])]
        stream = streams.setdefault(pod["pod"], {
            "stream": {"namespace": pod["namespace"], "pod": pod["pod"], "container": pod["container"]},
            "values": [],
        })
        stream["values"].append([ns(stamp(i, line)), line])
    return json.dumps({"streams": list(streams.values())}) + "\n"


def otlp(lines: list[str], pods: list[dict] | None = None) -> str:
    resources: dict[str, dict] = {}
    for i, line in enumerate(lines):
        pod = (pods or [POD])[i % len(pods or [POD])]
        resource = resources.setdefault(pod["pod"], {
            "resource": {"attributes": [
                {"key": "k8s.namespace.name", "value": {"stringValue": pod["namespace"]}},
                {"key": "k8s.pod.name", "value": {"stringValue": pod["pod"]}},
                {"key": "k8s.container.name", "value": {"stringValue": pod["container"]}},
            ]},
            "scopeLogs": [{"scope": {}, "logRecords": []}],
        })
        resource["scopeLogs"][0]["logRecords"].append({
            "timeUnixNano": ns(stamp(i, line)),
            "observedTimeUnixNano": ns(stamp(i, line)),
            "body": {"stringValue": line},
            "attributes": [{"key": "log.iostream", "value": {"stringValue": "stdout"}}],
        })
    return json.dumps({"resourceLogs": list(resources.values())}) + "\n"


def cloudwatch_subscription(lines: list[str], per_record: int = 2) -> str:
    """Firehose's S3 object: DATA_MESSAGE payloads concatenated with nothing between them."""
    records = []
    for start in range(0, len(lines), per_record):
        events = [
            {"id": str(37000000000000000000 + start + k),
             "timestamp": int(stamp(start + k, line).timestamp() * 1000),
             "message": line}
            for k, line in enumerate(lines[start : start + per_record])
        ]
        records.append(json.dumps({
            "messageType": "DATA_MESSAGE",
            "owner": "123456789012",
            "logGroup": "/aws/containerinsights/prod/application",
            "logStream": "gpu-node-7-application.var.log.containers.decode-0_llm_vllm-" + "d" * 64 + ".log",
            "subscriptionFilters": ["to-s3"],
            "logEvents": events,
        }))
    return "".join(records) + "\n"


def cloudwatch_export(lines: list[str]) -> str:
    out = []
    for i, line in enumerate(lines):
        t = stamp(i, line)
        out.append(f"{t.strftime('%Y-%m-%dT%H:%M:%S.')}{t.microsecond // 1000:03d}Z {line}\n")
    return "".join(out)


def gcp(lines: list[str], pods: list[dict] | None = None) -> str:
    out = []
    for i, line in enumerate(lines):
        pod = (pods or [POD])[i % len(pods or [POD])]
        out.append(json.dumps({
            "insertId": f"k3c8q{i:06d}",
            "textPayload": line,
            "resource": {"type": "k8s_container", "labels": {
                "project_id": "prod-inference", "location": "us-central1", "cluster_name": "gpu",
                "namespace_name": pod["namespace"], "pod_name": pod["pod"],
                "container_name": pod["container"],
            }},
            "timestamp": rfc3339_nano(stamp(i, line)),
            "severity": "INFO",
            "labels": {"k8s-pod/app": "vllm"},
            "logName": "projects/prod-inference/logs/stdout",
            "receiveTimestamp": rfc3339_nano(stamp(i, line) + timedelta(seconds=1)),
        }))
    return "\n".join(out) + "\n"


WRAPPERS = {
    "cri": cri,
    "docker": docker,
    "fluentbit": fluentbit,
    "vector": vector,
    "loki": loki_jsonl,
    "loki_push": loki_push,
    "otlp": otlp,
    "cloudwatch": cloudwatch_subscription,
    "gcp": gcp,
}
