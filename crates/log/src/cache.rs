//! The tail cache shared by all readers: recent durable batches of every partition, bounded
//! by one broker-wide byte budget and evicted oldest-first across partitions.
//!
//! Consumers that keep up read from here without touching storage. Each partition keeps its
//! cached batches in offset order; the global FIFO below decides which to drop. A partition
//! never drops cached batches itself, so the byte count here is exact.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

use crate::partition::Partition;

#[derive(Debug, Clone)]
pub struct CachedBatch {
    pub base_offset: i64,
    pub last_offset: i64,
    pub bytes: Bytes,
}

#[derive(Debug)]
pub struct TailCache {
    budget: usize,
    used: AtomicUsize,
    fifo: Mutex<VecDeque<(Weak<Partition>, i64, usize)>>,
}

impl TailCache {
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            used: AtomicUsize::new(0),
            fifo: Mutex::new(VecDeque::new()),
        }
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Notes that `partition` cached a batch (already pushed to its own deque) and evicts the
    /// oldest batches broker-wide while over budget. Call without holding any partition lock.
    pub fn admitted(&self, partition: &Arc<Partition>, base_offset: i64, len: usize) {
        let mut evict = Vec::new();
        {
            let mut fifo = match self.fifo.lock() {
                Ok(f) => f,
                Err(poisoned) => poisoned.into_inner(),
            };
            fifo.push_back((Arc::downgrade(partition), base_offset, len));
            let mut used = self.used.fetch_add(len, Ordering::Relaxed) + len;
            while used > self.budget {
                let Some((weak, base, size)) = fifo.pop_front() else {
                    break;
                };
                used = self.used.fetch_sub(size, Ordering::Relaxed) - size;
                evict.push((weak, base));
            }
        }
        for (weak, base) in evict {
            if let Some(p) = weak.upgrade() {
                p.evict_cached(base);
            }
        }
    }
}
