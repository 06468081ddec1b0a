//! Reading a coordinator shard back: the consumer-group and transaction coordinators keep
//! their decisions as records of an internal topic's partition (`__consumer_offsets`,
//! `__transaction_state`) and rebuild a shard's state by reading that partition from its log
//! start when the shard is loaded. The reading and its rules for damaged data are the same for
//! both, so they live here.

use strata_core::{Offset, TopicPartition};
use strata_log::{LogError, LogManager};
use strata_wire::builder::{read_records, SimpleRecord};
use strata_wire::read_batch_header;

/// How much one read of the shard's partition asks for.
const READ_BYTES: usize = 4 << 20;

/// Calls `each` with the offset and record of every data record of `tp`, from its log start
/// to its end. Control batches (transaction markers) hold no coordinator record and are
/// skipped. A batch that does not decode is skipped with an error log naming `what`: losing
/// one stale fact is better than a coordinator that can never start. The read steps past each
/// batch by its header even when its records do not decode, so one bad batch cannot be
/// returned again forever; where nothing readable moves it forward, replay stops there.
pub(crate) async fn replay_records(
    log: &LogManager,
    tp: &TopicPartition,
    what: &str,
    mut each: impl FnMut(i64, SimpleRecord),
) -> Result<(), LogError> {
    let mut at = log.watermarks(tp)?.log_start;
    loop {
        let out = log.read(tp, at, READ_BYTES, true).await?;
        if out.batches.is_empty() {
            return Ok(());
        }
        let before = at;
        for batch in &out.batches {
            if let Some(header) = read_batch_header(batch) {
                at = at.max(Offset(header.last_offset().saturating_add(1)));
                if header.is_control() {
                    continue;
                }
            }
            let decoded = match read_records(batch) {
                Ok(decoded) => decoded,
                Err(e) => {
                    tracing::error!(partition = %tp, error = %e, "undecodable {what} batch skipped");
                    continue;
                }
            };
            for (offset, record) in decoded {
                at = at.max(Offset(offset.saturating_add(1)));
                each(offset, record);
            }
        }
        if at == before {
            tracing::error!(partition = %tp, offset = at.get(),
                "{what} records past this offset are unreadable; replay stopped there");
            return Ok(());
        }
    }
}
