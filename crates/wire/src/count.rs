//! Counting a request's entries from its bytes, before decoding it: what a request will expand
//! into once decoded is charged to the broker's request memory first, so the count must not
//! allocate per entry.

/// The number of partition entries in a Produce request body (the frame after its header) of
/// `version` 3–13, read without decoding anything else. None if the body is malformed (the
/// decoder will refuse it anyway) or the version unknown.
pub fn produce_partition_count(version: i16, body: &[u8]) -> Option<usize> {
    if !(3..=13).contains(&version) {
        return None;
    }
    let flexible = version >= 9;
    let mut r = Reader { bytes: body };
    // transactional_id: nullable string.
    r.skip_string(flexible)?;
    r.skip(2 + 4)?; // acks, timeout_ms
    let topics = r.array_len(flexible)?;
    let mut partitions = 0usize;
    for _ in 0..topics {
        if version >= 13 {
            r.skip(16)?; // topic id
        } else {
            r.skip_string(flexible)?;
        }
        let count = r.array_len(flexible)?;
        partitions = partitions.checked_add(count)?;
        for _ in 0..count {
            r.skip(4)?; // index
            r.skip_bytes(flexible)?; // records
            if flexible {
                r.skip_tagged_fields()?;
            }
        }
        if flexible {
            r.skip_tagged_fields()?;
        }
    }
    if flexible {
        r.skip_tagged_fields()?;
    }
    Some(partitions)
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn skip(&mut self, n: usize) -> Option<()> {
        self.bytes = self.bytes.get(n..)?;
        Some(())
    }

    fn i16(&mut self) -> Option<i16> {
        let v = self.bytes.get(..2)?;
        let v = i16::from_be_bytes([v[0], v[1]]);
        self.skip(2)?;
        Some(v)
    }

    fn i32(&mut self) -> Option<i32> {
        let v = self.bytes.get(..4)?;
        let v = i32::from_be_bytes([v[0], v[1], v[2], v[3]]);
        self.skip(4)?;
        Some(v)
    }

    fn uvarint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..35).step_by(7) {
            let (&byte, rest) = self.bytes.split_first()?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// A length that must fit in what is left (every entry takes at least a byte).
    fn bounded(&self, n: u64) -> Option<usize> {
        usize::try_from(n).ok().filter(|n| *n <= self.bytes.len())
    }

    fn array_len(&mut self, flexible: bool) -> Option<usize> {
        if flexible {
            let n = self.uvarint()?.checked_sub(1)?;
            self.bounded(n)
        } else {
            let n = self.i32()?;
            self.bounded(u64::try_from(n).ok()?)
        }
    }

    fn skip_string(&mut self, flexible: bool) -> Option<()> {
        if flexible {
            match self.uvarint()? {
                0 => Some(()),
                n => self.skip(self.bounded(n - 1)?),
            }
        } else {
            match self.i16()? {
                -1 => Some(()),
                n => self.skip(self.bounded(u64::try_from(n).ok()?)?),
            }
        }
    }

    fn skip_bytes(&mut self, flexible: bool) -> Option<()> {
        if flexible {
            match self.uvarint()? {
                0 => Some(()),
                n => self.skip(self.bounded(n - 1)?),
            }
        } else {
            match self.i32()? {
                -1 => Some(()),
                n => self.skip(self.bounded(u64::try_from(n).ok()?)?),
            }
        }
    }

    fn skip_tagged_fields(&mut self) -> Option<()> {
        let count = self.uvarint()?;
        let count = self.bounded(count)?;
        for _ in 0..count {
            self.uvarint()?; // tag
            let size = self.uvarint()?;
            self.skip(self.bounded(size)?)?;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::produce_request::{
        PartitionProduceData, ProduceRequest, TopicProduceData,
    };
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn request(topics: usize, partitions: usize) -> ProduceRequest {
        let mut request = ProduceRequest::default();
        request.acks = 1;
        request.timeout_ms = 1000;
        request.topic_data = (0..topics)
            .map(|t| {
                let mut topic = TopicProduceData::default();
                topic.name = TopicName(StrBytes::from_string(format!("topic-{t}")));
                topic.partition_data = (0..partitions)
                    .map(|p| {
                        let mut data = PartitionProduceData::default();
                        data.index = p as i32;
                        data.records = (p % 2 == 0).then(|| Bytes::from(vec![7u8; p + 3]));
                        data
                    })
                    .collect();
                topic
            })
            .collect();
        request
    }

    #[test]
    fn counts_the_partitions_of_every_version() {
        for version in 3..=13 {
            let mut body = BytesMut::new();
            request(3, 5).encode(&mut body, version).unwrap();
            assert_eq!(
                produce_partition_count(version, &body),
                Some(15),
                "version {version}"
            );
        }
    }

    #[test]
    fn truncated_or_lying_bodies_are_not_counted() {
        let mut body = BytesMut::new();
        request(2, 4).encode(&mut body, 9).unwrap();
        for cut in 0..body.len() {
            assert_eq!(
                produce_partition_count(9, &body[..cut]),
                None,
                "cut at {cut}"
            );
        }
        // Classic encoding claiming two billion topics in a few bytes.
        let mut lying = vec![0xff, 0xff, 0, 1, 0, 0, 0, 0];
        lying.extend_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(produce_partition_count(3, &lying), None);
    }
}
