//! The order in which one connection's Produce requests append (see [`ProduceTurn`]).

use tokio::sync::oneshot;

/// Opens when a Produce may assign offsets; the connection keeps the last one handed out, for
/// the next Produce it reads.
pub type Gate = oneshot::Receiver<()>;

/// A Produce request's place in its connection's append order.
///
/// Requests on one connection run concurrently, but Kafka appends a connection's produce
/// requests in the order they arrived — a producer without idempotence relies on that for
/// per-partition order when it pipelines. Each Produce gets its turn when its frame is read:
/// a gate its predecessor opens, and the gate of its successor. It assigns offsets only once
/// its gate opened, and opens the next as soon as its batches are queued (before they are
/// durable), so pipelining still overlaps the storage writes.
///
/// One gate per request, not one counter every request watches: a librdkafka producer at
/// linger.ms 0 pipelines hundreds of one-record requests, and a shared counter woke every one
/// of them at each pass — work that grew with the backlog, so a backlog that formed never
/// drained (docs/BENCHMARKS.md, "A backlog that never drained").
#[derive(Debug)]
pub struct ProduceTurn {
    /// Opens when the previous Produce of the connection has queued its batches, or gave up
    /// its turn; None once open (or for the connection's first Produce).
    after: Option<Gate>,
    /// The next Produce's gate; None once opened.
    next: Option<oneshot::Sender<()>>,
}

impl ProduceTurn {
    /// The turn after the one whose gate is `previous` (None: nobody before); the connection
    /// keeps the returned receiver as the gate of the Produce after this one.
    pub fn new(previous: Option<Gate>) -> (Self, Gate) {
        let (next, gate) = oneshot::channel();
        let turn = Self {
            after: previous,
            next: Some(next),
        };
        (turn, gate)
    }

    /// Waits until every earlier Produce of the connection has queued its batches.
    pub async fn wait(&mut self) {
        if let Some(after) = self.after.as_mut() {
            // A dropped sender opens the gate too: its turn forwarded or passed (see Drop).
            let _ = after.await;
            self.after = None;
        }
    }

    /// Lets the next Produce of the connection go.
    pub fn pass(&mut self) {
        if let Some(next) = self.next.take() {
            let _ = next.send(());
        }
    }
}

impl Drop for ProduceTurn {
    fn drop(&mut self) {
        let Some(next) = self.next.take() else {
            return;
        };
        match (self.after.take(), tokio::runtime::Handle::try_current()) {
            // Dropped before its own gate opened (an error path, a cancelled wait): the next
            // Produce still waits for ours to open, so the order holds past a request that
            // never appended.
            (Some(after), Ok(runtime)) => {
                runtime.spawn(async move {
                    let _ = after.await;
                    let _ = next.send(());
                });
            }
            _ => {
                let _ = next.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    use futures::task::ArcWake;

    use super::ProduceTurn;

    /// `n` turns in arrival order, as a connection hands them out.
    fn turns(n: usize) -> Vec<ProduceTurn> {
        let mut gate = None;
        (0..n)
            .map(|_| {
                let (turn, next) = ProduceTurn::new(gate.take());
                gate = Some(next);
                turn
            })
            .collect()
    }

    #[tokio::test]
    async fn turns_open_in_arrival_order_whatever_order_they_start_in() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, mut turn) in turns(5).into_iter().enumerate().rev() {
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                turn.wait().await;
                order.lock().unwrap().push(i);
                turn.pass();
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    struct CountingWaker(AtomicUsize);

    impl ArcWake for CountingWaker {
        fn wake_by_ref(this: &Arc<Self>) {
            this.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_pass_wakes_only_the_next_turn() {
        let mut turns = turns(64);
        let mut first = turns.remove(0);
        let wakers: Vec<Arc<CountingWaker>> = (0..turns.len())
            .map(|_| Arc::new(CountingWaker(AtomicUsize::new(0))))
            .collect();
        let mut waits: Vec<_> = turns.iter_mut().map(|t| Box::pin(t.wait())).collect();
        for (wait, waker) in waits.iter_mut().zip(&wakers) {
            let waker = futures::task::waker(Arc::clone(waker));
            let mut cx = Context::from_waker(&waker);
            assert!(wait.as_mut().poll(&mut cx).is_pending());
        }
        first.pass();
        let woken: Vec<usize> = wakers.iter().map(|w| w.0.load(Ordering::SeqCst)).collect();
        // A counter every turn watched woke all 63: work per pass that grew with the backlog.
        assert_eq!(woken[0], 1);
        assert!(woken[1..].iter().all(|&n| n == 0), "{woken:?}");
        let waker = futures::task::waker(Arc::clone(&wakers[0]));
        assert!(matches!(
            waits[0].as_mut().poll(&mut Context::from_waker(&waker)),
            Poll::Ready(())
        ));
    }

    #[tokio::test]
    async fn a_turn_dropped_before_its_gate_opened_still_waits_for_the_one_before() {
        let mut turns = turns(3).into_iter();
        let (mut a, b, mut c) = (
            turns.next().unwrap(),
            turns.next().unwrap(),
            turns.next().unwrap(),
        );
        a.wait().await;
        drop(b);
        let mut c_wait = Box::pin(async move {
            c.wait().await;
            c
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
            assert!(futures::poll!(c_wait.as_mut()).is_pending());
        }
        a.pass();
        c_wait.await;
    }

    #[test]
    fn a_turn_dropped_after_its_gate_opened_passes() {
        let mut turns = turns(2).into_iter();
        let (mut a, mut b) = (turns.next().unwrap(), turns.next().unwrap());
        futures::executor::block_on(a.wait());
        drop(a);
        futures::executor::block_on(b.wait());
    }
}
