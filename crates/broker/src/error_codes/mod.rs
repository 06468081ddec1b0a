//! The error codes in the responses the broker sends, tallied per request so `/metrics` can
//! count them per API and code (`strata_request_errors_total`, Kafka's `ErrorsPerSec`).
//!
//! Like Kafka's `AbstractResponse.errorCounts`, every outcome counts: a Produce to three
//! partitions counts three codes, `NONE` included, so the share of failures per API is one
//! division away. Which fields hold the codes is read off kafka-protocol's message structs by
//! `scripts/gen-error-codes.py` (in `generated.rs`); `dispatch::respond` requires the trait,
//! so a response the broker encodes cannot be left out.

use std::sync::Mutex;

/// A response whose error codes can be listed.
pub(crate) trait ErrorCodes {
    /// Calls `tally` with each error code the response carries (0 for success).
    fn error_codes(&self, tally: &mut dyn FnMut(i16));
}

impl<T: ErrorCodes> ErrorCodes for Vec<T> {
    fn error_codes(&self, tally: &mut dyn FnMut(i16)) {
        for item in self {
            item.error_codes(tally);
        }
    }
}

impl<T: ErrorCodes> ErrorCodes for Option<T> {
    fn error_codes(&self, tally: &mut dyn FnMut(i16)) {
        if let Some(item) = self {
            item.error_codes(tally);
        }
    }
}

/// `error_codes!(module::Struct; codes [fields holding a code]; nested [fields to descend])`.
macro_rules! error_codes {
    ($ty:ty; codes [$($code:ident),*]; nested [$($nested:ident),*]) => {
        impl $crate::error_codes::ErrorCodes for $ty {
            fn error_codes(&self, _tally: &mut dyn FnMut(i16)) {
                $(_tally(self.$code);)*
                $($crate::error_codes::ErrorCodes::error_codes(&self.$nested, _tally);)*
            }
        }
    };
}

/// A response that can carry a quota throttle (`throttle_time_ms`), or has no such field
/// (SASL exchanges, which Kafka never throttles).
pub(crate) trait ThrottleTime {
    fn set_throttle_time_ms(&mut self, ms: i32);
}

/// `throttle_time!(module::Response; throttle_time_ms | none)`.
macro_rules! throttle_time {
    ($ty:ty; throttle_time_ms) => {
        impl $crate::error_codes::ThrottleTime for $ty {
            fn set_throttle_time_ms(&mut self, ms: i32) {
                self.throttle_time_ms = ms;
            }
        }
    };
    ($ty:ty; none) => {
        impl $crate::error_codes::ThrottleTime for $ty {
            fn set_throttle_time_ms(&mut self, _ms: i32) {}
        }
    };
}

mod generated;

/// The codes one request's response carried, with how often each appeared. A request names a
/// handful of distinct codes, so a short list beats a map.
#[derive(Debug, Default)]
pub(crate) struct ErrorTally {
    counts: Mutex<Vec<(i16, u64)>>,
}

impl ErrorTally {
    pub(crate) fn add(&self, code: i16) {
        if let Ok(mut counts) = self.counts.lock() {
            match counts.iter_mut().find(|(c, _)| *c == code) {
                Some((_, n)) => *n += 1,
                None => counts.push((code, 1)),
            }
        }
    }

    pub(crate) fn add_response(&self, response: &dyn ErrorCodes) {
        if let Ok(mut counts) = self.counts.lock() {
            response.error_codes(
                &mut |code| match counts.iter_mut().find(|(c, _)| *c == code) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((code, 1)),
                },
            );
        }
    }

    /// The codes and their counts, emptying the tally.
    pub(crate) fn take(&self) -> Vec<(i16, u64)> {
        self.counts
            .lock()
            .map(|mut counts| std::mem::take(&mut *counts))
            .unwrap_or_default()
    }
}

/// Kafka's name of an error code, as `kafka-topics` and the broker's own metrics spell it:
/// `NONE`, `NOT_LEADER_OR_FOLLOWER`, `UNKNOWN_SERVER_ERROR`… A code kafka-protocol does not know
/// is named by its number.
pub fn error_name(code: i16) -> String {
    match kafka_protocol::error::ResponseError::try_from_code(code) {
        None => "NONE".to_string(),
        Some(kafka_protocol::error::ResponseError::Unknown(code)) => format!("CODE_{code}"),
        Some(error) => screaming_snake(&format!("{error:?}")),
    }
}

/// `NotLeaderOrFollower` → `NOT_LEADER_OR_FOLLOWER`.
fn screaming_snake(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, ch) in camel.chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
    };

    #[test]
    fn error_codes_have_kafkas_names() {
        assert_eq!(error_name(0), "NONE");
        assert_eq!(error_name(6), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(29), "TOPIC_AUTHORIZATION_FAILED");
        assert_eq!(error_name(22), "ILLEGAL_GENERATION");
        assert_eq!(error_name(32000), "CODE_32000");
    }

    #[test]
    fn a_response_tallies_every_partitions_code() {
        let partition = |index, error_code| {
            let mut p = PartitionProduceResponse::default();
            p.index = index;
            p.error_code = error_code;
            p
        };
        let mut topic = TopicProduceResponse::default();
        topic.partition_responses = vec![partition(0, 0), partition(1, 6), partition(2, 0)];
        let mut response = ProduceResponse::default();
        response.responses = vec![topic];
        let tally = ErrorTally::default();
        tally.add_response(&response);
        tally.add(6);
        let mut counts = tally.take();
        counts.sort_unstable();
        assert_eq!(counts, vec![(0, 2), (6, 2)]);
        assert!(tally.take().is_empty());
    }
}
