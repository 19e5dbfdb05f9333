//! The kill queue (Firecracker's `muxer_killq`): connections and half-read handshakes with a
//! deadline, earliest first, so the muxer finds what is due without walking every connection
//! and knows when to arm its timer.
//!
//! Entries are never removed early: a connection whose deadline moved later, or that is gone,
//! leaves a stale entry, which the muxer recognises when it pops it (the live deadline is kept
//! on the connection, not here). Firecracker's queue is a FIFO because all its timeouts are
//! equal; ours differ (handshake, stall), so it is a min-heap. Stale entries are bounded by
//! [`KillQueue::needs_compaction`]: once they outnumber the live ones, the muxer rebuilds the
//! queue from its connections.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::RawFd;
use std::time::Instant;

use super::connection::ConnKey;

/// What a deadline belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum KillTarget {
    /// An accepted host socket still sending its `CONNECT` line (by fd).
    Handshake(RawFd),
    /// A connection.
    Conn(ConnKey),
}

/// Deadlines, earliest first.
#[derive(Debug, Default)]
pub struct KillQueue {
    heap: BinaryHeap<Reverse<(Instant, KillTarget)>>,
}

impl KillQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Kill `target` at `at` (unless the muxer finds it changed by then).
    pub fn schedule(&mut self, at: Instant, target: KillTarget) {
        self.heap.push(Reverse((at, target)));
    }

    /// The earliest deadline (to arm the timer for).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// The earliest entry if it is due at `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, KillTarget)> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }

    /// Entries, stale ones included.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether the queue is empty.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Whether stale entries have piled up: more than twice the `live` targets (plus slack so a
    /// small muxer does not rebuild all the time).
    pub fn needs_compaction(&self, live: usize) -> bool {
        self.heap.len() > 2 * live + 64
    }

    /// Replaces the contents with exactly `entries` (the live deadlines).
    pub fn rebuild(&mut self, entries: impl IntoIterator<Item = (Instant, KillTarget)>) {
        self.heap = entries.into_iter().map(Reverse).collect();
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn conn(local: u32) -> KillTarget {
        KillTarget::Conn(ConnKey { local, peer: 1 })
    }

    #[test]
    fn kill_queue_pops_only_what_is_due_earliest_first() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = KillQueue::new();
        q.schedule(t0 + ms(300), conn(3));
        q.schedule(t0 + ms(100), KillTarget::Handshake(7));
        q.schedule(t0 + ms(200), conn(2));
        assert_eq!(q.next_deadline(), Some(t0 + ms(100)));
        assert_eq!(q.pop_due(t0 + ms(99)), None);
        assert_eq!(
            q.pop_due(t0 + ms(250)),
            Some((t0 + ms(100), KillTarget::Handshake(7)))
        );
        assert_eq!(q.pop_due(t0 + ms(250)), Some((t0 + ms(200), conn(2))));
        assert_eq!(q.pop_due(t0 + ms(250)), None);
        assert_eq!(q.next_deadline(), Some(t0 + ms(300)));
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn kill_queue_asks_for_compaction_once_stale_entries_pile_up_and_rebuilds() {
        let t0 = Instant::now();
        let mut q = KillQueue::new();
        for i in 0..100 {
            q.schedule(t0 + Duration::from_secs(i), conn(1));
        }
        assert!(!q.needs_compaction(50));
        assert!(q.needs_compaction(10));
        q.rebuild([(t0, conn(1))]);
        assert_eq!(q.len(), 1);
        assert!(!q.needs_compaction(1));
        q.clear();
        assert!(q.is_empty());
        assert_eq!(q.next_deadline(), None);
    }
}
