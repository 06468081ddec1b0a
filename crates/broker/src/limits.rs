//! Broker-wide bounds on what clients can make the broker spend: topic creations (each one a
//! rewrite of the whole catalog in storage), memory for requests being received and decoded,
//! and connections per client address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_core::Clock;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What one request other than Produce is charged per byte of its frame: decoding small array
/// entries into owned structures, then answering each, costs up to this much (measured: a
/// Metadata request of empty topic names, 2 bytes each on the wire, took ~90 bytes of memory
/// per wire byte). Legitimate requests of these kinds are kilobytes, so the overcharge costs
/// little; it means such a request can be at most 1/96 of `queued_max_request_bytes`.
pub(crate) const DECODE_EXPANSION: usize = 96;

/// What a Produce is charged per partition besides its bytes: the decoded entry, the append's
/// bookkeeping and the response entry (measured: ~620 bytes for a partition with no records,
/// which takes 6 to 8 bytes on the wire).
pub(crate) const PRODUCE_PARTITION_COST: usize = 640;

/// What a request frame of `size` bytes for `api_key` is charged when its size prefix arrives.
/// A Produce is charged for its partitions too, once they are counted (see dispatch).
pub(crate) fn frame_charge(api_key: i16, size: usize) -> usize {
    const PRODUCE: i16 = 0;
    let frame = size.saturating_add(4);
    if api_key == PRODUCE {
        frame
    } else {
        frame.saturating_mul(DECODE_EXPANSION)
    }
}

/// The broker's bounds, built from its settings.
#[derive(Debug)]
pub(crate) struct Limits {
    pub creations: CreationBudget,
    pub memory: RequestMemory,
    pub per_ip: Arc<ConnectionsPerIp>,
}

impl Limits {
    pub(crate) fn new(settings: &crate::BrokerSettings, clock: Arc<dyn Clock>) -> Self {
        Self {
            creations: CreationBudget::new(clock, settings.auto_create_topics_per_second),
            memory: RequestMemory::new(settings.queued_max_request_bytes),
            per_ip: ConnectionsPerIp::new(settings.max_connections_per_ip.max(1)),
        }
    }
}

/// A token bucket of topic auto-creations: `per_second` tokens a second, holding at most one
/// second's worth, so a burst can never create more than `per_second` at once.
#[derive(Debug)]
pub(crate) struct CreationBudget {
    clock: Arc<dyn Clock>,
    per_second: u32,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    refilled_at: Duration,
}

impl CreationBudget {
    pub(crate) fn new(clock: Arc<dyn Clock>, per_second: u32) -> Self {
        let now = clock.monotonic();
        Self {
            clock,
            per_second,
            state: Mutex::new(BucketState {
                tokens: f64::from(per_second),
                refilled_at: now,
            }),
        }
    }

    /// Takes `wanted` creations (at most one second's worth) if the bucket holds them all, else
    /// none: a request retried while the bucket refills would otherwise get a token or two per
    /// attempt, and each attempt is a rewrite of the whole catalog. Returns how many were
    /// granted.
    pub(crate) fn take(&self, wanted: usize) -> usize {
        let now = self.clock.monotonic();
        let Ok(mut state) = self.state.lock() else {
            return 0;
        };
        let elapsed = now.saturating_sub(state.refilled_at).as_secs_f64();
        let capacity = f64::from(self.per_second);
        state.tokens = (state.tokens + elapsed * capacity).min(capacity);
        state.refilled_at = now;
        let batch = (wanted as f64).min(capacity);
        if state.tokens < batch {
            return 0;
        }
        state.tokens -= batch;
        batch as usize
    }
}

/// Connections open per client address (Kafka's `max.connections.per.ip`).
#[derive(Debug)]
pub(crate) struct ConnectionsPerIp {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection counted against its address; uncounted when dropped.
#[derive(Debug)]
pub(crate) struct IpSlot {
    owner: Arc<ConnectionsPerIp>,
    ip: IpAddr,
}

impl ConnectionsPerIp {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// Counts a new connection from `ip`, or None when that address is at its limit.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<IpSlot> {
        let mut open = self.open.lock().ok()?;
        let count = open.entry(ip).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(IpSlot {
            owner: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.owner.open.lock() {
            if let Some(count) = open.get_mut(&self.ip) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    open.remove(&self.ip);
                }
            }
        }
    }
}

/// Memory for requests being received and decoded, broker-wide (Kafka's
/// `queued.max.request.bytes`). Counted in KiB so a `u32`-sized semaphore covers terabytes.
#[derive(Debug)]
pub(crate) struct RequestMemory {
    pool: Arc<Semaphore>,
    capacity_kib: u32,
}

/// Bytes of the request memory held by one request; returned when dropped.
#[derive(Debug)]
pub(crate) struct MemoryCharge {
    _permit: Option<OwnedSemaphorePermit>,
}

impl RequestMemory {
    pub(crate) fn new(bytes: usize) -> Self {
        let capacity_kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        Self {
            pool: Arc::new(Semaphore::new(capacity_kib as usize)),
            capacity_kib,
        }
    }

    fn kib(bytes: usize) -> Option<u32> {
        u32::try_from(bytes.div_ceil(1024)).ok()
    }

    /// Whether `bytes` could ever be granted (a charge above the whole pool never can).
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        Self::kib(bytes).is_some_and(|kib| kib <= self.capacity_kib)
    }

    /// Takes `bytes` if they are free right now.
    pub(crate) fn try_charge(&self, bytes: usize) -> Option<MemoryCharge> {
        let kib = Self::kib(bytes).filter(|kib| *kib <= self.capacity_kib)?;
        if kib == 0 {
            return Some(MemoryCharge { _permit: None });
        }
        let permit = Arc::clone(&self.pool).try_acquire_many_owned(kib).ok()?;
        Some(MemoryCharge {
            _permit: Some(permit),
        })
    }

    /// Waits until `bytes` are free and takes them. The future owns what it needs, so a
    /// connection can keep it across loop iterations. Resolves to None if they never can be
    /// (see `fits`).
    pub(crate) fn charge(
        &self,
        bytes: usize,
    ) -> impl std::future::Future<Output = Option<MemoryCharge>> + Send + 'static {
        let pool = Arc::clone(&self.pool);
        let kib = Self::kib(bytes).filter(|kib| *kib <= self.capacity_kib);
        async move {
            let kib = kib?;
            if kib == 0 {
                return Some(MemoryCharge { _permit: None });
            }
            let permit = pool.acquire_many_owned(kib).await.ok()?;
            Some(MemoryCharge {
                _permit: Some(permit),
            })
        }
    }

    /// Bytes not charged to any request right now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.pool.available_permits() * 1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::clock::ManualClock;

    #[test]
    fn creation_budget_refills_at_its_rate_and_never_beyond_one_second() {
        let clock = Arc::new(ManualClock::default());
        let budget = CreationBudget::new(clock.clone(), 10);
        assert_eq!(budget.take(25), 10);
        assert_eq!(budget.take(1), 0);
        clock.advance(Duration::from_millis(500));
        // Half refilled: a batch of ten waits for the rest rather than trickling out.
        assert_eq!(budget.take(25), 0);
        assert_eq!(budget.take(3), 3);
        clock.advance(Duration::from_secs(60));
        assert_eq!(budget.take(25), 10);
        assert_eq!(budget.take(1), 0);
    }

    #[test]
    fn connections_per_ip_are_counted_until_dropped() {
        let limit = ConnectionsPerIp::new(2);
        let ip: IpAddr = [127, 0, 0, 1].into();
        let other: IpAddr = [127, 0, 0, 2].into();
        let a = limit.admit(ip);
        let b = limit.admit(ip);
        assert!(a.is_some() && b.is_some());
        assert!(limit.admit(ip).is_none());
        assert!(limit.admit(other).is_some());
        drop(a);
        assert!(limit.admit(ip).is_some());
    }

    #[tokio::test]
    async fn request_memory_refuses_what_can_never_fit_and_returns_charges() {
        let memory = RequestMemory::new(1 << 20);
        assert!(!memory.fits((1 << 20) + 1024));
        assert!(memory.charge(2 << 20).await.is_none());
        let charge = memory.charge(600 << 10).await;
        assert!(charge.is_some());
        assert_eq!(memory.available(), 424 << 10);
        let waiting = memory.charge(600 << 10);
        tokio::pin!(waiting);
        assert!(futures::poll!(&mut waiting).is_pending());
        drop(charge);
        assert!(waiting.await.is_some());
    }
}
