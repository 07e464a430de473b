"""The envelopes a vLLM log line arrives in, and how to take it out of them.

In production a vLLM line rarely reaches a bucket bare: the container runtime wraps it
(CRI files under /var/log/pods, Docker's json-file driver), a collector wraps it again
(Fluent Bit, Vector, Loki and its exports, the OpenTelemetry Collector's S3 exporter,
CloudWatch Logs subscriptions, Google Cloud Logging sinks), and vLLM itself may log JSON
(``--logging-config`` with its JSON formatter). This module unwraps each of them to the
text line vLLM's own text formatter would have written, with the envelope's time stamp put
in front of it as a collector stamp (it carries the year and zone a vLLM stamp lacks, and
wins over it), and the instance the envelope names (namespace, pod, container). The vLLM
log parser then reads those lines exactly as it reads a bare log, so every message it
recognises is recognised in every envelope.

The shapes, each as its own documentation gives it (the tests name the page per fixture):

- ``cri``: ``<RFC 3339 nano> <stdout|stderr> <P|F>[:tags] <text>``; ``P`` marks a partial
  line that the following records of the same stream continue, up to an ``F``.
- ``docker``: ``{"log": "<text>\\n", "stream": ..., "time": ...}``; a record whose text has
  no final newline is a partial line (the driver splits lines over 16 KiB).
- ``fluentbit``: ``log`` (or ``message``) with a ``date`` (epoch seconds or ISO 8601) or a
  ``time``/``@timestamp``, and the ``kubernetes`` filter's ``pod_name``,
  ``namespace_name``, ``container_name``.
- ``vector``: ``message``, ``timestamp`` and ``kubernetes.pod_name``/``pod_namespace``/
  ``container_name`` (the ``kubernetes_logs`` source).
- ``loki``: logcli's ``--output jsonl`` records (``labels``, ``line``, ``timestamp``), the
  push API body (``streams: [{stream, values: [[ns, line], ...]}]``) and a query response
  (``data.result``), as Grafana Alloy, Promtail and Loki exports leave them.
- ``otlp``: OTLP/JSON logs (``resourceLogs`` → ``scopeLogs`` → ``logRecords``) with the
  ``k8s.*`` resource attributes, as the OpenTelemetry Collector's S3 exporter writes them.
- ``cloudwatch``: a subscription's ``DATA_MESSAGE`` (``logGroup``, ``logStream``,
  ``logEvents: [{timestamp ms, message}]``), several objects possibly on one line as
  Firehose concatenates them. (A CloudWatch *export* is ``<ISO stamp> <message>`` lines,
  which the vLLM parser reads as it stands.)
- ``gcp``: Cloud Logging's LogEntry (``textPayload`` or ``jsonPayload``, ``timestamp``,
  ``resource.labels`` of a ``k8s_container``).
- ``vllm_json``: vLLM's JSON formatter, one object per line (``asctime``, ``levelname``,
  ``name``, ``process``, ``processName``, ``vllm_process_name``, ``message``; an
  ``exc_info`` when there is a traceback). Also found inside any envelope above.

A line of an envelope that does not unwrap (not JSON, no text, no usable time) is a
reject with its line number; lines that unwrap to something other than a vLLM line are
passed on and dropped by the parser as any foreign line of a bare log is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hybridtrace.ingest.limits import LINE_LIMIT

ENVELOPES = ("cri", "docker", "fluentbit", "vector", "loki", "otlp", "cloudwatch", "gcp", "vllm_json")

RAW_LIMIT = 512
# JSON inside JSON (a collector record whose text is vLLM's JSON record) is unwrapped this
# many times at most: no envelope nests deeper, and a hostile line cannot recurse for ever.
_MAX_NESTING = 4

_CRI = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) (?P<stream>stdout|stderr) "
    r"(?P<tag>[PF])(?::\S*)?(?: (?P<text>.*))?$"
)
# A stamp the vLLM parser reads as a collector's (detect.COLLECTOR_STAMP)
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? ")
_ASCTIME = re.compile(r"^(\d{4})-(\d\d)-(\d\d) (\d\d:\d\d:\d\d)(?:[,.](\d+))?$")
_LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
# Kubernetes' container log names: /var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log and
# /var/log/containers/<pod>_<ns>_<container>-<id>.log; CloudWatch Container Insights puts
# the latter in its log stream names.
_PODS_PATH = re.compile(r"/pods/(?P<ns>[^_/]+)_(?P<pod>[^_/]+)_[^/]+/(?P<container>[^/]+)/[^/]*$")
_CONTAINERS_NAME = re.compile(
    r"(?:^|[/.])(?P<pod>[^_/.]+)_(?P<ns>[^_/]+)_(?P<container>[^_/]+)-[0-9a-f]{64}\.log$"
)


@dataclass(frozen=True)
class Instance:
    """The container a line came from, as its envelope names it; parts may be unknown."""

    namespace: str | None = None
    pod: str | None = None
    container: str | None = None

    @property
    def name(self) -> str | None:
        """The engine's name when its log does not state a NIXL engine id: the pod's."""
        return self.pod or self.container


NO_INSTANCE = Instance()


@dataclass
class Unwrapped:
    """What one chunk of an envelope object unwraps to."""

    # per instance, (line number of the envelope line, vLLM text line) in object order
    groups: dict[Instance, list[tuple[int, str]]] = field(default_factory=dict)
    rejects: list[dict] = field(default_factory=list)

    def add(self, instance: Instance, line_number: int, text: str) -> None:
        self.groups.setdefault(instance, []).append((line_number, text))


def instance_from_path(uri: str) -> Instance:
    """The container a kubelet log file belongs to, from its path; unknown otherwise."""
    m = _PODS_PATH.search(uri) or _CONTAINERS_NAME.search(uri)
    if not m:
        return NO_INSTANCE
    return Instance(m["ns"], m["pod"], m["container"])


def _raw(text: str) -> str:
    return text[:RAW_LIMIT]


def _iso(seconds: float) -> str:
    stamp = datetime.fromtimestamp(seconds, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond:06d}Z"


def _stamp(value: object) -> str | None:
    """An envelope's time as an RFC 3339 stamp: ISO strings as they are, epoch numbers converted.

    Epoch values are told apart by size: seconds (Fluent Bit's ``date``), milliseconds
    (CloudWatch), nanoseconds (Loki, OTLP; also as strings).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d{9,20}", text):
            value = int(text)
        elif re.fullmatch(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?", text):
            return text
        else:
            return None
    if isinstance(value, int | float):
        number = float(value)
        if not 0 < number < 1e20:
            return None
        if number >= 1e17:
            number /= 1e9
        elif number >= 1e14:
            number /= 1e6
        elif number >= 1e11:
            number /= 1e3
        try:
            return _iso(number)
        except (OverflowError, OSError, ValueError):
            return None
    return None


def _with_stamp(stamp: str | None, text: str) -> str:
    if stamp is None or _STAMP.match(text):
        return text  # a line that carries a collector stamp already keeps its own
    return f"{stamp} {text}"


def _is_vllm_record(obj: dict) -> bool:
    return isinstance(obj.get("message"), str) and obj.get("levelname") in _LEVELS and (
        "asctime" in obj or "name" in obj
    )


def vllm_record_lines(obj: dict, stamp: str | None) -> list[str] | None:
    """The text lines vLLM's text formatter writes for the record its JSON formatter wrote.

    The header is vLLM's own, ``(<process> pid=<pid>) LEVEL MM-DD HH:MM:SS [file:line] ``,
    repeated on each line of a multi-line message with a ``\\r`` before each line end, as
    vLLM's text formatter writes them. The record's ``asctime`` carries the year: without an
    envelope stamp it becomes the line's collector stamp (local time, as the log's --tz
    says). None when the record has no usable time.
    """
    asctime = obj.get("asctime")
    m = _ASCTIME.match(asctime) if isinstance(asctime, str) else None
    if m is None:
        return None
    year, month, day, hms, frac = m.groups()
    if stamp is None:
        stamp = f"{year}-{month}-{day} {hms}" + (f".{frac}" if frac else "")
    process = obj.get("vllm_process_name") or obj.get("processName")
    pid = obj.get("process")
    prefix = ""
    if isinstance(process, str) and re.fullmatch(r"[A-Za-z]\w*(?: rank=\d+)?", process) and (
        isinstance(pid, int) and not isinstance(pid, bool)
    ):
        prefix = f"({process} pid={pid}) "
    name = obj.get("filename") or str(obj.get("name") or "vllm").rsplit(".", 1)[-1] + ".py"
    name = re.sub(r"[\s:\]]", "_", str(name)) or "vllm.py"
    lineno = obj.get("lineno")
    lineno = lineno if isinstance(lineno, int) and not isinstance(lineno, bool) and lineno >= 0 else 0
    header = f"{stamp} {prefix}{obj['levelname']} {month}-{day} {hms} [{name}:{lineno}] "
    text = obj["message"]
    extra = obj.get("exc_info") or obj.get("exc_text") or obj.get("stack_info")
    if isinstance(extra, str) and extra:
        text = f"{text}\n{extra}"
    parts = text.split("\n")
    return [header + part + ("\r" if i < len(parts) - 1 else "") for i, part in enumerate(parts)]


def _k8s(meta: object, pod: str, namespace: str, container: str) -> Instance:
    if not isinstance(meta, dict):
        return NO_INSTANCE

    def text(key: str) -> str | None:
        value = meta.get(key)
        return value if isinstance(value, str) and value else None

    return Instance(text(namespace), text(pod), text(container))


def _labels_instance(labels: object) -> Instance:
    """Loki's and Prometheus-style labels as Alloy's and Promtail's Kubernetes discovery set them."""
    if not isinstance(labels, dict):
        return NO_INSTANCE

    def first(*keys: str) -> str | None:
        for key in keys:
            value = labels.get(key)
            if isinstance(value, str) and value:
                return value
        return None

    return Instance(
        first("namespace", "k8s_namespace_name", "namespace_name"),
        first("pod", "k8s_pod_name", "pod_name", "instance"),
        first("container", "k8s_container_name", "container_name"),
    )


def _otlp_value(value: object) -> object:
    if not isinstance(value, dict):
        return None
    for key in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if key in value:
            return value[key]
    return None


# (instance, stamp, text or nested record, partial?) for each message a record holds
_Message = tuple[Instance, str | None, object, bool]


def _messages(obj: dict, kind: str) -> list[_Message] | None:
    """The messages of one envelope record of ``kind``; None when it is not one."""
    if kind == "vllm_json":
        return [(NO_INSTANCE, None, obj, False)] if _is_vllm_record(obj) else None
    if kind == "docker":
        log = obj.get("log")
        if not isinstance(log, str):
            return None
        stamp = _stamp(obj.get("time"))
        if stamp is None:
            return None
        return [(NO_INSTANCE, stamp, log.removesuffix("\n"), not log.endswith("\n"))]
    if kind == "fluentbit":
        text = obj.get("log", obj.get("message"))
        if not isinstance(text, str):
            return None
        stamp = _stamp(obj.get("date", obj.get("time", obj.get("@timestamp", obj.get("timestamp")))))
        instance = _k8s(obj.get("kubernetes"), "pod_name", "namespace_name", "container_name")
        if instance == NO_INSTANCE and isinstance(obj.get("file"), str):
            instance = instance_from_path(obj["file"])
        return [(instance, stamp, text.removesuffix("\n"), False)]
    if kind == "vector":
        text = obj.get("message")
        if not isinstance(text, str):
            return None
        instance = _k8s(obj.get("kubernetes"), "pod_name", "pod_namespace", "container_name")
        if instance == NO_INSTANCE and isinstance(obj.get("file"), str):
            instance = instance_from_path(obj["file"])
        return [(instance, _stamp(obj.get("timestamp")), text.removesuffix("\n"), False)]
    if kind == "loki":
        if isinstance(obj.get("line"), str):  # logcli --output jsonl
            return [(_labels_instance(obj.get("labels")), _stamp(obj.get("timestamp")), obj["line"], False)]
        streams = obj.get("streams")
        if streams is None and isinstance(obj.get("data"), dict):
            streams = obj["data"].get("result")
        if not isinstance(streams, list):
            return None
        out: list[_Message] = []
        for stream in streams:
            if not isinstance(stream, dict) or not isinstance(stream.get("values"), list):
                return None
            instance = _labels_instance(stream.get("stream"))
            for value in stream["values"]:
                if not (isinstance(value, list) and len(value) >= 2 and isinstance(value[1], str)):
                    return None
                out.append((instance, _stamp(value[0]), value[1], False))
        return out
    if kind == "otlp":
        resources = obj.get("resourceLogs")
        if not isinstance(resources, list):
            return None
        out = []
        for resource in resources:
            if not isinstance(resource, dict):
                return None
            attrs = (resource.get("resource") or {}).get("attributes") or []
            labels = {
                a["key"]: _otlp_value(a.get("value")) for a in attrs if isinstance(a, dict) and "key" in a
            }
            instance = Instance(
                labels.get("k8s.namespace.name"), labels.get("k8s.pod.name"), labels.get("k8s.container.name")
            )
            for scope in resource.get("scopeLogs") or []:
                for record in (scope or {}).get("logRecords") or []:
                    if not isinstance(record, dict):
                        return None
                    body = _otlp_value(record.get("body"))
                    if not isinstance(body, str):
                        return None
                    stamp = _stamp(record.get("timeUnixNano") or record.get("observedTimeUnixNano"))
                    out.append((instance, stamp, body, False))
        return out
    if kind == "cloudwatch":
        events = obj.get("logEvents")
        if obj.get("messageType") == "CONTROL_MESSAGE":
            return []
        if not isinstance(events, list):
            return None
        stream = obj.get("logStream")
        instance = instance_from_path(stream) if isinstance(stream, str) else NO_INSTANCE
        if instance == NO_INSTANCE and isinstance(stream, str) and stream:
            instance = Instance(None, stream, None)
        out = []
        for event in events:
            if not (isinstance(event, dict) and isinstance(event.get("message"), str)):
                return None
            out.append((instance, _stamp(event.get("timestamp")), event["message"], False))
        return out
    if kind == "gcp":
        resource = obj.get("resource")
        labels = resource.get("labels") if isinstance(resource, dict) else None
        instance = _k8s(labels, "pod_name", "namespace_name", "container_name")
        stamp = _stamp(obj.get("timestamp") or obj.get("receiveTimestamp"))
        if isinstance(obj.get("textPayload"), str):
            return [(instance, stamp, obj["textPayload"].removesuffix("\n"), False)]
        payload = obj.get("jsonPayload")
        if isinstance(payload, dict):
            if _is_vllm_record(payload):
                return [(instance, stamp, payload, False)]
            if isinstance(payload.get("message"), str):
                return [(instance, stamp, payload["message"], False)]
        return None
    return None


def _kind_of(obj: dict) -> str | None:
    """Which envelope one JSON record is, by its keys."""
    if _is_vllm_record(obj):
        return "vllm_json"
    if "resourceLogs" in obj:
        return "otlp"
    if "logEvents" in obj or obj.get("messageType") == "CONTROL_MESSAGE":
        return "cloudwatch"
    if "streams" in obj or ("line" in obj and "labels" in obj) or (
        isinstance(obj.get("data"), dict) and "result" in obj["data"]
    ):
        return "loki"
    if ("textPayload" in obj or "jsonPayload" in obj) and ("resource" in obj or "logName" in obj):
        return "gcp"
    if "log" in obj:
        if set(obj) <= {"log", "stream", "time", "attrs"} and "time" in obj:
            return "docker"
        return "fluentbit"
    if "message" in obj and ("timestamp" in obj or "source_type" in obj or "kubernetes" in obj):
        return "vector"
    if "message" in obj and any(k in obj for k in ("date", "@timestamp", "time")):
        return "fluentbit"
    return None


def _json_objects(text: str) -> list[object] | None:
    """The JSON values on one line (Firehose puts several objects on one), or None."""
    decoder = json.JSONDecoder()
    out: list[object] = []
    at, end = 0, len(text)
    try:
        while at < end:
            while at < end and text[at] in " \t\r":
                at += 1
            if at >= end:
                break
            value, at = decoder.raw_decode(text, at)
            out.append(value)
    except (ValueError, RecursionError):
        return None
    return out


def sniff(lines: list[str]) -> str | None:
    """The envelope of an object whose first whole lines are ``lines``, when one holds vLLM lines.

    An object is an envelope when its first non-blank lines are records of one kind and at
    least one of them unwraps to a vLLM line; ``looks_like_vllm`` is the vLLM parser's test.
    """
    from hybridtrace.ingest.vllm_log import looks_like_vllm_log

    kinds: list[str] = []
    for text in lines:
        if not text.strip():
            continue
        if len(text) > LINE_LIMIT:
            break
        if _CRI.match(text):
            kinds.append("cri")
            continue
        if not text.lstrip().startswith("{"):
            break
        values = _json_objects(text)
        if not values or not all(isinstance(v, dict) for v in values):
            break
        kind = _kind_of(values[0])
        if kind is None:
            break
        kinds.append(kind)
        if len(kinds) >= 20:
            break
    # The most common kind first, then the others (ties in the order they came): the one
    # whose records unwrap to vLLM lines. Broken lines of another kind among the first (JSON
    # the collector could not write whole) must not hide the envelope the others are in.
    candidates = sorted(dict.fromkeys(kinds), key=lambda k: (-kinds.count(k), kinds.index(k)))
    head = [t for t in lines[:200] if len(t) <= LINE_LIMIT]
    for kind in candidates:
        probe = Unwrapper(kind).feed(head, 1, final=True)
        sample = "\n".join(text for group in probe.groups.values() for _, text in group[:50])
        if looks_like_vllm_log(sample):
            return kind
    return None


class Unwrapper:
    """Unwraps the lines of one envelope object, chunk after chunk, keeping partial lines."""

    def __init__(self, kind: str, path_instance: Instance = NO_INSTANCE) -> None:
        if kind not in ENVELOPES:
            raise ValueError(f"unknown envelope {kind!r}")
        self.kind = kind
        # a kubelet file names its container only by its path
        self.path_instance = path_instance
        # per (instance, stream): the envelope line a partial line began on, and its text so far
        self.partial: dict[tuple[Instance, str], tuple[int, str | None, list[str]]] = {}

    def held_from(self) -> int | None:
        """The first envelope line of a partial line still waiting for its end."""
        return min((first for first, _, _ in self.partial.values()), default=None)

    def feed(self, texts: list[str], first_line: int, final: bool) -> Unwrapped:
        out = Unwrapped()
        for i, text in enumerate(texts):
            number = first_line + i
            if not text.strip():
                continue
            if len(text) > LINE_LIMIT:
                out.rejects.append({"line_number": number, "reason": f"{self.kind} line longer than "
                                    f"{LINE_LIMIT} characters", "raw": _raw(text)})  # fmt: skip
                continue
            if self.kind == "cri":
                self._cri(out, number, text)
            else:
                self._json(out, number, text)
        if final:
            for (instance, _), (first, stamp, parts) in self.partial.items():
                # the runtime never wrote the end of this line: it is read as it stands
                self._emit(out, instance, first, stamp, "".join(parts), 0)
            self.partial.clear()
        return out

    def _cri(self, out: Unwrapped, number: int, text: str) -> None:
        m = _CRI.match(text)
        if m is None:
            out.rejects.append({"line_number": number, "reason": "not a CRI log line", "raw": _raw(text)})
            return
        self._piece(out, self.path_instance, m["stream"], number, m["ts"], m["text"] or "", m["tag"] == "P")

    def _piece(self, out: Unwrapped, instance: Instance, stream: str, number: int, stamp: str | None,
               text: str, partial: bool) -> None:  # fmt: skip
        key = (instance, stream)
        if key in self.partial:
            first, first_stamp, parts = self.partial[key]
            parts.append(text)
            if sum(len(p) for p in parts) > LINE_LIMIT:
                # a line joined past the size bound: what came is read, the rest is not joined
                del self.partial[key]
                out.rejects.append({"line_number": first, "reason": f"{self.kind} partial line longer than "
                                    f"{LINE_LIMIT} characters", "raw": _raw(parts[0])})  # fmt: skip
                return
            if partial:
                return
            del self.partial[key]
            self._emit(out, instance, first, first_stamp, "".join(parts), 0)
            return
        if partial:
            self.partial[key] = (number, stamp, [text])
            return
        self._emit(out, instance, number, stamp, text, 0)

    def _json(self, out: Unwrapped, number: int, text: str) -> None:
        values = _json_objects(text)
        if not values or not all(isinstance(v, dict) for v in values):
            out.rejects.append({"line_number": number, "reason": f"not a {self.kind} JSON record",
                                "raw": _raw(text)})  # fmt: skip
            return
        for obj in values:
            messages = _messages(obj, self.kind)
            if messages is None:
                # a record of another kind among the lines (a collector may mix them): by its keys
                other = _kind_of(obj)
                messages = _messages(obj, other) if other else None
            if messages is None:
                out.rejects.append({"line_number": number, "reason": f"not a {self.kind} record",
                                    "raw": _raw(text)})  # fmt: skip
                return
            for instance, stamp, message, partial in messages:
                instance = instance if instance != NO_INSTANCE else self.path_instance
                if isinstance(message, dict):
                    self._record(out, instance, number, stamp, message, 1)
                elif self.kind == "docker":
                    stream = obj.get("stream") if isinstance(obj.get("stream"), str) else ""
                    self._piece(out, instance, stream, number, stamp, message, partial)
                else:
                    self._emit(out, instance, number, stamp, message, 0)

    def _emit(self, out: Unwrapped, instance: Instance, number: int, stamp: str | None, text: str,
              depth: int) -> None:  # fmt: skip
        stripped = text.lstrip()
        if stripped.startswith("{") and depth < _MAX_NESTING:
            # the text is a record itself: vLLM's JSON, or a collector's record forwarded whole
            values = _json_objects(stripped)
            if values and len(values) == 1 and isinstance(values[0], dict):
                obj = values[0]
                kind = _kind_of(obj)
                if kind == "vllm_json":
                    self._record(out, instance, number, stamp, obj, depth + 1)
                    return
                messages = _messages(obj, kind) if kind else None
                if messages is not None:
                    for inner, inner_stamp, message, _ in messages:
                        who = inner if inner != NO_INSTANCE else instance
                        when = stamp or inner_stamp
                        if isinstance(message, dict):
                            self._record(out, who, number, when, message, depth + 1)
                        else:
                            self._emit(out, who, number, when, message, depth + 1)
                    return
        for part in text.split("\n"):
            out.add(instance, number, _with_stamp(stamp, part))

    def _record(self, out: Unwrapped, instance: Instance, number: int, stamp: str | None, obj: dict,
                depth: int) -> None:  # fmt: skip
        lines = vllm_record_lines(obj, stamp)
        if lines is None:
            out.rejects.append({"line_number": number, "reason": "vLLM JSON record without a usable asctime",
                                "raw": _raw(json.dumps(obj)[:RAW_LIMIT])})  # fmt: skip
            return
        for line in lines:
            out.add(instance, number, line)
