#!/usr/bin/env python3
"""Writes docs/grafana/strata.json, the Grafana dashboard for Strata's /metrics.

The panels are listed here rather than edited in Grafana's JSON by hand: a row or a panel is
one line, and the layout (positions, ids) is computed. Run it after changing a panel:

    python3 scripts/grafana-dashboard.py

The `observability` test in tests/tests/cluster.rs checks that every metric a query names is
one the broker exports, so a renamed metric cannot leave a silently empty panel.
"""
import json
import pathlib

SEL = '{instance=~"$instance"}'


def sel(extra=""):
    """Label selector with the dashboard's instance filter, plus `extra` matchers."""
    inner = 'instance=~"$instance"' + (("," + extra) if extra else "")
    return "{" + inner + "}"


# (row title, [(panel title, unit, [(expr, legend)], description)])
ROWS = [
    ("Kafka requests", [
        ("Requests per second by API", "reqps",
         [(f"sum by (api) (rate(strata_requests_total{SEL}[$__rate_interval]))", "{{api}}")],
         "Every Kafka request answered, by API."),
        ("Request latency p99 by API", "s",
         [(f"histogram_quantile(0.99, sum by (le, api) (rate(strata_request_seconds_bucket{SEL}[$__rate_interval])))", "{{api}}")],
         "From a request's frame to its reply; includes a fetch's long poll and a produce's wait for durable storage."),
        ("Refused requests", "reqps",
         [(f"sum by (api) (rate(strata_requests_refused_total{SEL}[$__rate_interval]))", "{{api}}")],
         "Requests answered by closing the connection: unsupported versions, unreadable bodies, failed acks=0 produce."),
        ("Connections", "short",
         [(f"sum by (instance) (strata_connections{SEL})", "{{instance}}"),
          (f"sum by (instance) (rate(strata_connections_accepted_total{SEL}[$__rate_interval]))", "accepted/s {{instance}}")],
         "Client connections open now, and new connections per second."),
    ]),
    ("Topics", [
        ("Bytes in per topic", "Bps",
         [(f"sum by (topic) (rate(strata_topic_bytes_in_total{SEL}[$__rate_interval]))", "{{topic}}")],
         "Kafka's BytesInPerSec: record-batch bytes accepted."),
        ("Bytes out per topic", "Bps",
         [(f"sum by (topic) (rate(strata_topic_bytes_out_total{SEL}[$__rate_interval]))", "{{topic}}")],
         "Kafka's BytesOutPerSec: record-batch bytes sent to consumers."),
        ("Records in per topic", "short",
         [(f"sum by (topic) (rate(strata_topic_records_in_total{SEL}[$__rate_interval]))", "{{topic}}")],
         "Kafka's MessagesInPerSec."),
        ("Log end offset growth (top 10 partitions)", "short",
         [(f"topk(10, rate(strata_log_high_watermark{SEL}[$__rate_interval]))", "{{topic}}-{{partition}}")],
         "Offsets appended per second to the busiest partitions this broker serves."),
    ]),
    ("Storage", [
        ("Storage requests per second by kind", "reqps",
         [(f"sum by (op) (rate(strata_storage_requests_total{SEL}[$__rate_interval]))", "{{op}}")],
         "Requests actually sent to storage, retries included. Object stores bill per request."),
        ("Storage latency p99 by kind", "s",
         [(f"histogram_quantile(0.99, sum by (le, op) (rate(strata_storage_request_seconds_bucket{SEL}[$__rate_interval])))", "{{op}}")],
         "Single attempts."),
        ("Storage throughput", "Bps",
         [(f"sum by (direction) (rate(strata_storage_bytes_total{SEL}[$__rate_interval]))", "{{direction}}")],
         "Payload bytes written (in) and read (out)."),
        ("Storage errors and failures", "reqps",
         [(f"sum(rate(strata_storage_errors_total{SEL}[$__rate_interval]))", "errors"),
          (f"sum(rate(strata_storage_failures_total{SEL}[$__rate_interval]))", "failures")],
         "Errors include answers such as not-found; failures are what storage failed to serve."),
        ("Storage healthy", "short",
         [(f"min by (instance) (strata_storage_healthy{SEL})", "{{instance}}")],
         "1 while storage serves; 0 after 3 failed requests (or writes) in a row, when /health answers 503."),
        ("Storage requests per GB ingested", "short",
         [(f"max by (instance) (strata_storage_requests_per_gb_ingested{SEL})", "{{instance}}")],
         "The request cost of ingest; raise flush_interval/flush_bytes if it is high on an object store."),
        ("Idle request rate by area", "reqps",
         [(f"sum by (area) (rate(strata_storage_requests_by_area_total{SEL}[$__rate_interval]))", "{{area}}")],
         "Which part of the storage layout the requests touch: names the poller behind an idle broker's requests."),
    ]),
    ("Log and cache", [
        ("Partitions served", "short",
         [(f"sum by (instance) (strata_log_partitions_served{SEL})", "{{instance}}")], ""),
        ("Tail cache", "bytes",
         [(f"sum by (instance) (strata_log_cache_bytes{SEL})", "{{instance}}")],
         "Memory of the shared tail cache (cache_bytes bounds it)."),
        ("Key compaction", "Bps",
         [(f"sum(rate(strata_cleaner_bytes_read_total{SEL}[$__rate_interval]))", "read"),
          (f"sum(rate(strata_cleaner_bytes_written_total{SEL}[$__rate_interval]))", "written")],
         "The log cleaner's input and output."),
        ("Dirty ratio of compacted partitions (top 10)", "percentunit",
         [(f"topk(10, strata_log_dirty_ratio{SEL})", "{{topic}}-{{partition}}")],
         "A partition is cleaned once this passes its min.cleanable.dirty.ratio."),
    ]),
    ("Cluster", [
        ("Live brokers", "short",
         [(f"max(strata_cluster_live_brokers{SEL})", "live")], "Brokers this broker sees alive."),
        ("Partitions owned per broker", "short",
         [(f"sum by (instance) (strata_cluster_partitions_owned{SEL})", "{{instance}}")],
         "Consumer-group shards included."),
        ("Ownership changes", "short",
         [(f"sum by (change) (increase(strata_cluster_ownership_changes_total{SEL}[$__rate_interval]))", "{{change}}")],
         "Partitions acquired, handed over, dropped, and failed attempts."),
        ("Handover and acquire time", "s",
         [(f"sum(rate(strata_cluster_handover_seconds_sum{SEL}[$__rate_interval])) / sum(rate(strata_cluster_handover_seconds_count{SEL}[$__rate_interval]))", "handover mean"),
          (f"max(strata_cluster_handover_seconds_max{SEL})", "handover max"),
          (f"sum(rate(strata_cluster_acquire_seconds_sum{SEL}[$__rate_interval])) / sum(rate(strata_cluster_acquire_seconds_count{SEL}[$__rate_interval]))", "acquire mean"),
          (f"max(strata_cluster_acquire_seconds_max{SEL})", "acquire max")],
         "A partition moves by handing over ownership: no data is copied."),
        ("Draining", "short",
         [(f"max by (instance) (strata_cluster_draining{SEL})", "{{instance}}")], ""),
    ]),
    ("Transactions", [
        ("Transactions ended", "short",
         [(f"sum by (result) (rate(strata_transactions_total{SEL}[$__rate_interval]))", "{{result}}")],
         "Per second, on the transaction-coordinator shards of each broker."),
        ("Open transactions", "short",
         [(f"sum(strata_transactions_open{SEL})", "coordinated"),
          (f"sum(strata_ongoing_transactions{SEL})", "open in partitions")],
         "A transaction open for long holds back read_committed consumers (the last stable offset)."),
        ("Transaction markers", "short",
         [(f"sum by (type) (rate(strata_txn_markers_total{SEL}[$__rate_interval]))", "{{type}}")],
         "Commit and abort markers written into partitions per second."),
    ]),
    ("Consumer groups", [
        ("Consumer lag by group", "short",
         [(f"sum by (group) (strata_group_lag_sum{SEL})", "{{group}}")],
         "Records each group is behind the log end, summed over its partitions (refreshed every group_lag_interval)."),
        ("Largest partition lag", "short",
         [(f"topk(10, max by (group, topic, partition) (strata_group_lag{SEL}))", "{{group}} {{topic}}-{{partition}}")],
         "The ten partitions furthest behind, with their group."),
    ]),
    ("Share groups", [
        ("Share-group records by outcome", "short",
         [(f"sum by (outcome) (rate(strata_share_records_total{SEL}[$__rate_interval]))", "{{outcome}}")],
         "Records acquired, accepted, released, rejected and archived per second (KIP-932)."),
        ("Share-group backlog", "short",
         [(f"sum by (group) (strata_share_backlog{SEL})", "{{group}}")],
         "Records not yet acknowledged or archived, per share group."),
    ]),
    ("Security and quotas", [
        ("Authentications", "short",
         [(f"sum by (mechanism, result) (increase(strata_authentications_total{SEL}[$__rate_interval]))", "{{mechanism}} {{result}}")], ""),
        ("Authorization denied", "short",
         [(f"sum by (resource_type, operation) (increase(strata_authorization_denied_total{SEL}[$__rate_interval]))", "{{resource_type}} {{operation}}")], ""),
        ("Quota throttling", "s",
         [(f"sum by (kind) (rate(strata_quota_throttle_seconds_total{SEL}[$__rate_interval]))", "{{kind}} throttled s/s"),
          (f"sum by (kind) (rate(strata_quota_throttled_responses_total{SEL}[$__rate_interval]))", "{{kind}} responses/s")], ""),
        ("Fetch sessions", "short",
         [(f"sum by (instance) (strata_fetch_sessions{SEL})", "sessions {{instance}}"),
          (f"sum by (instance) (strata_fetch_session_partitions{SEL})", "partitions {{instance}}"),
          (f"sum by (instance) (rate(strata_fetch_session_evictions_total{SEL}[$__rate_interval]))", "evictions/s {{instance}}")], ""),
    ]),
]


def dashboard():
    panels = []
    next_id = 1
    y = 0
    for title, row_panels in ROWS:
        panels.append({"type": "row", "title": title, "id": next_id, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id += 1
        y += 1
        for i, (ptitle, unit, targets, description) in enumerate(row_panels):
            panels.append({
                "type": "timeseries",
                "title": ptitle,
                "description": description,
                "id": next_id,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 8, "x": (i % 3) * 8, "y": y + (i // 3) * 8},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}},
                "targets": [{"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend,
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                            for k, (expr, legend) in enumerate(targets)],
            })
            next_id += 1
        y += 8 * ((len(row_panels) + 2) // 3)
    return {
        "title": "Strata",
        "uid": "strata-overview",
        "description": "Kafka traffic, storage, log, cluster and security of Strata brokers (docs/METRICS.md).",
        "tags": ["strata", "kafka"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
            {"name": "instance", "type": "query", "label": "Broker",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(strata_build_info, instance)", "refId": "instances"},
             "definition": "label_values(strata_build_info, instance)",
             "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2},
        ]},
        "panels": panels,
    }


if __name__ == "__main__":
    out = pathlib.Path(__file__).resolve().parent.parent / "docs" / "grafana" / "strata.json"
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")
