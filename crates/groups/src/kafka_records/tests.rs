//! Byte layouts derived by hand from Kafka's message JSON files (field order, int16 string
//! lengths for non-flexible versions, unsigned-varint length + 1 for compact strings and
//! arrays, a tagged-field count after every flexible struct).

use super::*;

fn offset(seq: u64, group: &str, topic: &str, p: i32, at: i64) -> PersistRecord {
    PersistRecord {
        seq,
        group_id: group.into(),
        body: RecordBody::Offset {
            partition: TopicPartition::new(topic, p),
            value: OffsetValue {
                offset: Offset(at),
                leader_epoch: None,
                metadata: "m".into(),
                commit_timestamp_ms: 7,
            },
        },
    }
}

fn replay_of(records: &[KafkaRecord]) -> Vec<PersistRecord> {
    let mut replay = Replay::new();
    for r in records {
        replay.push(&r.key, r.value.as_deref()).unwrap();
    }
    replay.finish()
}

fn one(records: Vec<KafkaRecord>) -> KafkaRecord {
    assert_eq!(records.len(), 1);
    records.into_iter().next().unwrap()
}

#[test]
fn an_offset_commit_is_kafkas_offset_commit_key_and_value_v3() {
    let r = one(encode(&offset(1, "g", "t", 1, 5), 0));
    // key version 1, group "g", topic "t", partition 1
    assert_eq!(&r.key[..], &[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 1]);
    let mut value = vec![0, 3];
    value.extend_from_slice(&5i64.to_be_bytes());
    value.extend_from_slice(&[0xff; 4]); // leaderEpoch -1: none
    value.extend_from_slice(&[0, 1, b'm']);
    value.extend_from_slice(&7i64.to_be_bytes());
    assert_eq!(r.value.as_deref(), Some(&value[..]));
    assert_eq!(replay_of(&[r]), vec![offset(1, "g", "t", 1, 5)]);

    let tombstone = one(encode(
        &PersistRecord {
            seq: 2,
            group_id: "g".into(),
            body: RecordBody::OffsetTombstone {
                partition: TopicPartition::new("t", 1),
            },
        },
        0,
    ));
    assert_eq!(
        tombstone.key,
        Bytes::from_static(&[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 1])
    );
    assert_eq!(tombstone.value, None);
}

#[test]
fn offset_values_kafka_wrote_in_older_versions_are_read() {
    // v1 (with an expire timestamp, no leader epoch), as Kafka writes when one is given.
    let mut v1 = vec![0, 1];
    v1.extend_from_slice(&42i64.to_be_bytes());
    v1.extend_from_slice(&[0, 0]);
    v1.extend_from_slice(&9i64.to_be_bytes());
    v1.extend_from_slice(&10i64.to_be_bytes());
    let v = decode_offset_value(&v1).unwrap();
    assert_eq!(v.offset, Offset(42));
    assert_eq!(v.leader_epoch, None);
    assert_eq!(v.commit_timestamp_ms, 9);
    // An epoch is kept.
    let mut with_epoch = offset(1, "g", "t", 0, 3);
    if let RecordBody::Offset { value, .. } = &mut with_epoch.body {
        value.leader_epoch = Some(4);
    }
    assert_eq!(replay_of(&encode(&with_epoch, 0)), vec![with_epoch]);
    assert!(decode_offset_value(&v1[..10]).is_err());
}

#[test]
fn classic_group_metadata_is_group_metadata_value_v3() {
    let record = PersistRecord {
        seq: 1,
        group_id: "g".into(),
        body: RecordBody::GroupMetadata(GroupMetadataValue {
            protocol_type: Some("consumer".into()),
            generation_id: 3,
            protocol_name: Some("range".into()),
            leader: None,
            members: vec![PersistedMember {
                member_id: "m".into(),
                group_instance_id: None,
                client_id: "c".into(),
                client_host: "/h".into(),
                rebalance_timeout_ms: 30_000,
                session_timeout_ms: 10_000,
                subscription: Bytes::from_static(&[1, 2]),
                assignment: Bytes::from_static(&[3]),
            }],
        }),
    };
    let r = one(encode(&record, 0x0102));
    assert_eq!(&r.key[..], &[0, 2, 0, 1, b'g']);
    let mut v = vec![0, 3, 0, 8];
    v.extend_from_slice(b"consumer");
    v.extend_from_slice(&3i32.to_be_bytes());
    v.extend_from_slice(&[0, 5]);
    v.extend_from_slice(b"range");
    v.extend_from_slice(&[0xff, 0xff]); // leader: null
    v.extend_from_slice(&0x0102i64.to_be_bytes()); // currentStateTimestamp
    v.extend_from_slice(&1i32.to_be_bytes());
    v.extend_from_slice(&[0, 1, b'm', 0xff, 0xff, 0, 1, b'c', 0, 2, b'/', b'h']);
    v.extend_from_slice(&30_000i32.to_be_bytes());
    v.extend_from_slice(&10_000i32.to_be_bytes());
    v.extend_from_slice(&[0, 0, 0, 2, 1, 2, 0, 0, 0, 1, 3]);
    assert_eq!(r.value.as_deref(), Some(&v[..]));
    assert_eq!(replay_of(&[r]), vec![record]);
}

fn topic(n: u8) -> TopicId {
    TopicId([n; 16])
}

fn consumer_group(seq: u64, epoch: i32) -> PersistRecord {
    PersistRecord {
        seq,
        group_id: "g".into(),
        body: RecordBody::ConsumerGroupMetadata(ConsumerGroupValue {
            group_epoch: epoch,
            assignment_epoch: epoch - 1,
            topics: [("t".to_string(), (topic(7), 3))].into(),
        }),
    }
}

fn member(seq: u64, id: &str, epoch: i32) -> PersistRecord {
    PersistRecord {
        seq,
        group_id: "g".into(),
        body: RecordBody::ConsumerMember {
            member_id: id.into(),
            value: Some(ConsumerMemberValue {
                instance_id: Some("i".into()),
                rack_id: None,
                client_id: "c".into(),
                client_host: "/h".into(),
                subscribed_topic_names: vec!["t".into()],
                subscribed_topic_regex: None,
                server_assignor: Some("uniform".into()),
                rebalance_timeout_ms: 5000,
                member_epoch: epoch,
                previous_member_epoch: epoch - 1,
                state: ConsumerMemberState::UnrevokedPartitions,
                assigned: [(topic(7), [0, 1].into())].into(),
                pending_revocation: [(topic(7), [2].into())].into(),
                target: [(topic(7), [0].into())].into(),
                classic: None,
            }),
        },
    }
}

#[test]
fn a_consumer_groups_metadata_is_kafkas_records_3_4_and_6() {
    let records = encode(&consumer_group(1, 9), 0);
    assert_eq!(records.len(), 3);
    let by_key: BTreeMap<Vec<u8>, Option<Bytes>> = records
        .iter()
        .map(|r| (r.key.to_vec(), r.value.clone()))
        .collect();
    // ConsumerGroupMetadataValue v0: epoch, no tagged fields.
    assert_eq!(
        by_key[&vec![0, 3, 0, 1, b'g']].as_deref(),
        Some(&[0, 0, 0, 0, 0, 9, 0][..])
    );
    // ConsumerGroupTargetAssignmentMetadataValue v0: assignment epoch.
    assert_eq!(
        by_key[&vec![0, 6, 0, 1, b'g']].as_deref(),
        Some(&[0, 0, 0, 0, 0, 8, 0][..])
    );
    // ConsumerGroupPartitionMetadataValue v0: one topic (id, compact name, partitions, empty
    // PartitionMetadata, tags), then the value's tags.
    let mut v = vec![0, 0, 2];
    v.extend_from_slice(&[7; 16]);
    v.extend_from_slice(&[2, b't', 0, 0, 0, 3, 1, 0, 0]);
    assert_eq!(by_key[&vec![0, 4, 0, 1, b'g']].as_deref(), Some(&v[..]));
    assert_eq!(replay_of(&records), vec![consumer_group(1, 9)]);
}

#[test]
fn a_consumer_member_is_kafkas_records_5_7_and_8() {
    let records = encode(&member(1, "m", 4), 0);
    let by_key: BTreeMap<Vec<u8>, Option<Bytes>> = records
        .iter()
        .map(|r| (r.key.to_vec(), r.value.clone()))
        .collect();
    let key = |t: u8| vec![0, t, 0, 1, b'g', 0, 1, b'm'];
    // ConsumerGroupMemberMetadataValue v0.
    let mut meta = vec![0, 0, 2, b'i', 0, 2, b'c', 3, b'/', b'h', 2, 2, b't', 0];
    meta.extend_from_slice(&5000i32.to_be_bytes());
    meta.extend_from_slice(&[8]);
    meta.extend_from_slice(b"uniform");
    meta.push(0);
    assert_eq!(by_key[&key(5)].as_deref(), Some(&meta[..]));
    // ConsumerGroupTargetAssignmentMemberValue v0: [ {topic id, [0]} ].
    let mut target = vec![0, 0, 2];
    target.extend_from_slice(&[7; 16]);
    target.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0]);
    assert_eq!(by_key[&key(7)].as_deref(), Some(&target[..]));
    // ConsumerGroupCurrentMemberAssignmentValue v0: epochs, state 1 (UNREVOKED_PARTITIONS),
    // assigned [0, 1], pending revocation [2].
    let mut current = vec![0, 0, 0, 0, 0, 4, 0, 0, 0, 3, 1, 2];
    current.extend_from_slice(&[7; 16]);
    current.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2]);
    current.extend_from_slice(&[7; 16]);
    current.extend_from_slice(&[2, 0, 0, 0, 2, 0, 0]);
    assert_eq!(by_key[&key(8)].as_deref(), Some(&current[..]));
    assert_eq!(replay_of(&records), vec![member(1, "m", 4)]);

    let gone = encode(
        &PersistRecord {
            seq: 2,
            group_id: "g".into(),
            body: RecordBody::ConsumerMember {
                member_id: "m".into(),
                value: None,
            },
        },
        0,
    );
    assert_eq!(gone.len(), 3);
    assert!(gone.iter().all(|r| r.value.is_none()));
    let mut all = records.clone();
    all.extend(gone);
    assert_eq!(replay_of(&all), vec![]);
}

#[test]
fn a_classic_protocol_member_keeps_its_metadata_in_tag_0() {
    let mut record = member(1, "m", 4);
    if let RecordBody::ConsumerMember { value: Some(v), .. } = &mut record.body {
        v.classic = Some(Box::new(ClassicMemberMetadata {
            session_timeout_ms: 45_000,
            protocols: vec![ClassicProtocol {
                name: "range".into(),
                metadata: Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
            }],
        }));
    }
    let records = encode(&record, 0);
    let meta = records[0].value.clone().unwrap();
    // The plain fields end with the assignor name; then one tagged field, tag 0, holding a
    // present nullable struct: session timeout, one protocol (name, 6 bytes), no tags.
    let mut tail = vec![1, 0, 21, 1];
    tail.extend_from_slice(&45_000i32.to_be_bytes());
    tail.extend_from_slice(&[
        2, 6, b'r', b'a', b'n', b'g', b'e', 7, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    assert!(meta.ends_with(&tail), "{meta:?}");
    assert_eq!(replay_of(&records), vec![record]);
}

#[test]
fn unknown_tagged_fields_of_later_kafka_versions_are_skipped() {
    // ConsumerGroupMetadataValue with one tagged field (tag 0, 8 bytes), as Kafka 4.1 adds.
    let mut v = vec![0, 0, 0, 0, 0, 9, 1, 0, 8];
    v.extend_from_slice(&[0xab; 8]);
    let mut replay = Replay::new();
    replay.push(&[0, 3, 0, 1, b'g'], Some(&v)).unwrap();
    let out = replay.finish();
    assert!(matches!(
        &out[0].body,
        RecordBody::ConsumerGroupMetadata(ConsumerGroupValue { group_epoch: 9, .. })
    ));
}

#[test]
fn a_group_tombstone_deletes_every_metadata_key_of_either_type() {
    let tombstone = PersistRecord {
        seq: 3,
        group_id: "g".into(),
        body: RecordBody::GroupTombstone,
    };
    let records = encode(&tombstone, 0);
    let keys: Vec<Vec<u8>> = records.iter().map(|r| r.key.to_vec()).collect();
    assert_eq!(
        keys,
        vec![
            vec![0, 2, 0, 1, b'g'],
            vec![0, 3, 0, 1, b'g'],
            vec![0, 4, 0, 1, b'g'],
            vec![0, 6, 0, 1, b'g'],
        ]
    );
    assert!(records.iter().all(|r| r.value.is_none()));
    let mut log = encode(&consumer_group(1, 5), 0);
    log.extend(records);
    let out = replay_of(&log);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].body, RecordBody::GroupTombstone);
}

#[test]
fn classic_metadata_after_consumer_parts_discards_them_and_before_them_loses() {
    let classic = PersistRecord {
        seq: 2,
        group_id: "g".into(),
        body: RecordBody::GroupMetadata(GroupMetadataValue {
            protocol_type: Some("consumer".into()),
            generation_id: 1,
            protocol_name: None,
            leader: None,
            members: vec![],
        }),
    };
    // Consumer, then classic: only the classic record is replayed.
    let mut log = encode(&consumer_group(1, 5), 0);
    log.extend(encode(&member(1, "m", 5), 0));
    log.extend(encode(&classic, 0));
    let out = replay_of(&log);
    assert_eq!(out.len(), 1);
    assert!(matches!(out[0].body, RecordBody::GroupMetadata(_)));
    // Classic, then consumer: the consumer records come after it.
    let mut log = encode(&classic, 0);
    log.extend(encode(&consumer_group(3, 6), 0));
    let out = replay_of(&log);
    assert!(matches!(out[0].body, RecordBody::GroupMetadata(_)));
    assert!(matches!(out[1].body, RecordBody::ConsumerGroupMetadata(_)));
}

#[test]
fn a_pending_transactional_offset_has_a_strata_key_version_and_a_tombstone_when_resolved() {
    let pending = PersistRecord {
        seq: 1,
        group_id: "g".into(),
        body: RecordBody::TxnOffset {
            producer_id: 5,
            partition: TopicPartition::new("t", 2),
            value: Some(OffsetValue {
                offset: Offset(10),
                leader_epoch: Some(1),
                metadata: String::new(),
                commit_timestamp_ms: 3,
            }),
        },
    };
    let r = one(encode(&pending, 0));
    let mut key = vec![0x03, 0xe8, 0, 1, b'g'];
    key.extend_from_slice(&5i64.to_be_bytes());
    key.extend_from_slice(&[0, 1, b't', 0, 0, 0, 2]);
    assert_eq!(&r.key[..], &key[..]);
    assert_eq!(&r.value.as_deref().unwrap()[..2], &[0, 3]);
    assert_eq!(replay_of(std::slice::from_ref(&r)), vec![pending]);
    let resolved = one(encode(
        &PersistRecord {
            seq: 2,
            group_id: "g".into(),
            body: RecordBody::TxnOffset {
                producer_id: 5,
                partition: TopicPartition::new("t", 2),
                value: None,
            },
        },
        0,
    ));
    assert_eq!(resolved.key, r.key);
    assert_eq!(resolved.value, None);
}

#[test]
fn older_builds_json_records_replay_first_in_their_sequence_order() {
    // An older build wrote seq 2 before seq 1 (concurrent batches); then this build's record.
    let mut replay = Replay::new();
    replay.push_legacy(offset(2, "g", "t", 0, 20));
    replay.push_legacy(offset(1, "g", "t", 0, 10));
    for r in encode(&offset(0, "g", "t", 0, 30), 0) {
        replay.push(&r.key, r.value.as_deref()).unwrap();
    }
    assert_eq!(replay.legacy_count(), 2);
    let out = replay.finish();
    let offsets: Vec<(u64, i64)> = out
        .iter()
        .map(|r| match &r.body {
            RecordBody::Offset { value, .. } => (r.seq, value.offset.get()),
            _ => panic!("not an offset"),
        })
        .collect();
    assert_eq!(offsets, vec![(1, 10), (2, 20), (3, 30)]);
    assert!(Replay::is_legacy_value(Some(b"{\"seq\":1}")));
    assert!(!Replay::is_legacy_value(Some(&[0, 3])));
    assert!(!Replay::is_legacy_value(None));
}

#[test]
fn damaged_records_are_errors_not_panics() {
    let mut replay = Replay::new();
    assert!(replay.push(&[0], None).is_err());
    assert!(replay.push(&[0, 99, 0, 1, b'g'], None).is_err());
    assert!(replay
        .push(
            &[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 1],
            Some(&[0, 3, 1])
        )
        .is_err());
    // A compact array claiming more entries than bytes left.
    assert!(replay
        .push(&[0, 7, 0, 1, b'g', 0, 1, b'm'], Some(&[0, 0, 0xff, 0x7f]))
        .is_err());
    assert_eq!(replay.finish(), vec![]);
}
