//! Client quotas over TCP: AlterClientQuotas and DescribeClientQuotas, and a client over its
//! quota answered with its throttle and not read meanwhile.

use std::time::Instant;

use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;

use super::*;

pub(super) fn alter(
    entity: &[(&'static str, Option<&'static str>)],
    ops: &[(&'static str, f64, bool)],
) -> AlterClientQuotasRequest {
    let mut entry = EntryData::default();
    entry.entity = entity
        .iter()
        .map(|(t, n)| {
            let mut e = EntityData::default();
            e.entity_type = StrBytes::from_static_str(t);
            e.entity_name = n.map(StrBytes::from_static_str);
            e
        })
        .collect();
    entry.ops = ops
        .iter()
        .map(|(key, value, remove)| {
            let mut op = OpData::default();
            op.key = StrBytes::from_static_str(key);
            op.value = *value;
            op.remove = *remove;
            op
        })
        .collect();
    let mut request = AlterClientQuotasRequest::default();
    request.entries = vec![entry];
    request
}

#[tokio::test]
async fn quotas_are_altered_validated_and_described_with_kafkas_errors() {
    let broker = start().await;
    let mut client = broker.client().await;
    for version in [0, 1] {
        let bad: AlterClientQuotasResponse = client
            .call(
                ApiKey::AlterClientQuotas,
                version,
                &alter(&[("user", Some("u"))], &[("bogus_rate", 1.0, false)]),
            )
            .await;
        assert_eq!(bad.entries[0].error_code, 42, "INVALID_REQUEST");
        let negative: AlterClientQuotasResponse = client
            .call(
                ApiKey::AlterClientQuotas,
                version,
                &alter(
                    &[("user", Some("u"))],
                    &[("producer_byte_rate", -5.0, false)],
                ),
            )
            .await;
        assert_eq!(negative.entries[0].error_code, 42);
    }
    let mut validate_only = alter(&[("user", None)], &[("consumer_byte_rate", 100.0, false)]);
    validate_only.validate_only = true;
    let checked: AlterClientQuotasResponse = client
        .call(ApiKey::AlterClientQuotas, 1, &validate_only)
        .await;
    assert_eq!(checked.entries[0].error_code, 0);
    let ok: AlterClientQuotasResponse = client
        .call(
            ApiKey::AlterClientQuotas,
            1,
            &alter(
                &[("user", Some("u")), ("client-id", None)],
                &[("producer_byte_rate", 1000.0, false)],
            ),
        )
        .await;
    assert_eq!(ok.entries[0].error_code, 0);

    let mut describe = DescribeClientQuotasRequest::default();
    let mut component = ComponentData::default();
    component.entity_type = StrBytes::from_static_str("user");
    component.match_type = 2;
    component._match = None;
    describe.components = vec![component];
    let described: DescribeClientQuotasResponse = client
        .call(ApiKey::DescribeClientQuotas, 1, &describe)
        .await;
    assert_eq!(described.error_code, 0);
    let entries = described.entries.unwrap();
    assert_eq!(entries.len(), 1, "the validate-only change was not made");
    assert_eq!(entries[0].entity.len(), 2);
    assert_eq!(entries[0].values[0].key.as_str(), "producer_byte_rate");
    assert_eq!(entries[0].values[0].value, 1000.0);
    describe.strict = true;
    let strict: DescribeClientQuotasResponse = client
        .call(ApiKey::DescribeClientQuotas, 0, &describe)
        .await;
    assert!(strict.entries.unwrap().is_empty());
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_quota_gets_its_throttle_and_is_not_read_until_it_passes() {
    let throttle = Duration::from_secs(2);
    let broker = start_with(|s| s.quota_max_throttle = throttle).await;
    let mut client = broker.client().await;
    create_topic(&mut client, "slow").await;
    // A byte a second: any produce is far over, so each throttle is the cap.
    let set: AlterClientQuotasResponse = client
        .call(
            ApiKey::AlterClientQuotas,
            1,
            &alter(
                &[("client-id", Some("broker-test"))],
                &[("producer_byte_rate", 1.0, false)],
            ),
        )
        .await;
    assert_eq!(set.entries[0].error_code, 0);
    let records = record_batch(&[b"over the quota"], 0);
    let sent = Instant::now();
    let first: ProduceResponse = client
        .call(
            ApiKey::Produce,
            9,
            &produce_request("slow", -1, records.clone()),
        )
        .await;
    assert_eq!(first.throttle_time_ms, 2000);
    assert_eq!(first.responses[0].partition_responses[0].error_code, 0);
    // Muted: the next request is read only once the throttle has passed since the first
    // answer, which came after `sent` (a lower bound only, so it cannot fail by slowness).
    let second: ProduceResponse = client
        .call(ApiKey::Produce, 9, &produce_request("slow", -1, records))
        .await;
    assert!(
        sent.elapsed() >= throttle,
        "answered {:?} after",
        sent.elapsed()
    );
    assert_eq!(second.throttle_time_ms, 2000);
    broker.shutdown().await;
}

/// An over-quota Fetch is answered as Kafka answers it: a fetch reads no more than the
/// quota allows over its whole window (but at least one batch), and one that goes over the
/// quota gets `throttle_time_ms` and no partitions, its records left for a later fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_quota_fetch_is_answered_empty_and_a_fetch_reads_at_most_the_quota_window() {
    let broker = start_with(|s| s.quota_max_throttle = Duration::from_millis(100)).await;
    let mut client = broker.client().await;
    create_topic(&mut client, "metered").await;
    let big = vec![b'x'; 1500];
    for value in [&b"small"[..], &big[..]] {
        let produced: ProduceResponse = client
            .call(
                ApiKey::Produce,
                9,
                &produce_request("metered", -1, record_batch(&[value], 0)),
            )
            .await;
        assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);
    }
    // 100 bytes a second over 11 one-second windows: at most 1,000 bytes a fetch.
    let set: AlterClientQuotasResponse = client
        .call(
            ApiKey::AlterClientQuotas,
            1,
            &alter(
                &[("client-id", Some("broker-test"))],
                &[("consumer_byte_rate", 100.0, false)],
            ),
        )
        .await;
    assert_eq!(set.entries[0].error_code, 0);
    let records_of = |response: &FetchResponse| -> usize {
        response
            .responses
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
            .sum()
    };

    let first: FetchResponse = client
        .call(ApiKey::Fetch, 12, &fetch_request("metered", 0, 0, 0))
        .await;
    let bytes = records_of(&first);
    assert!(
        bytes > 0 && bytes < 1000,
        "only the small batch: {bytes} bytes"
    );
    assert_eq!(first.throttle_time_ms, 0);

    let second: FetchResponse = client
        .call(ApiKey::Fetch, 12, &fetch_request("metered", 1, 0, 0))
        .await;
    assert!(second.throttle_time_ms > 0, "{second:?}");
    assert!(second.responses.is_empty(), "{:?}", second.responses);
    broker.shutdown().await;
}
