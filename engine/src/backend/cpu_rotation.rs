//! Which host CPUs a namespace sandbox's processes run on: as many as it has vCPUs, so that
//! `nproc` (and cargo, make, Go, anything sizing its work by `sched_getaffinity`) inside
//! `--vcpus 2` says 2 and inside the default says 1, as in a microVM. The cgroup's CPU quota
//! stays the limit; the set only says how many CPUs to plan for. Sandboxes take the CPUs in
//! turn, so that a host's single-vCPU sandboxes spread over all of its CPUs.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The CPUs the daemon may run on, handed out in turn.
#[derive(Debug, Default)]
pub(crate) struct CpuRotation {
    cpus: Vec<u32>,
    next: AtomicUsize,
}

impl CpuRotation {
    /// The CPUs this process may run on (none known: sandboxes keep the daemon's set).
    pub(crate) fn of_this_process() -> Self {
        let cpus = match rustix::thread::sched_getaffinity(None) {
            Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
                .filter(|cpu| set.is_set(*cpu))
                .filter_map(|cpu| u32::try_from(cpu).ok())
                .collect(),
            Err(_) => Vec::new(),
        };
        Self::of(cpus)
    }

    fn of(cpus: Vec<u32>) -> Self {
        CpuRotation {
            cpus,
            next: AtomicUsize::new(0),
        }
    }

    /// The CPUs for a sandbox of `vcpus` vCPUs: the next `vcpus` in turn, or none (the
    /// daemon's whole set) when it has as many vCPUs as the host has CPUs, or more.
    pub(crate) fn take(&self, vcpus: u32) -> Vec<u32> {
        let (n, len) = (vcpus as usize, self.cpus.len());
        if n == 0 || n >= len {
            return Vec::new();
        }
        let start = self.next.fetch_add(n, Ordering::Relaxed) % len;
        (0..n).map(|i| self.cpus[(start + i) % len]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandboxes_take_the_cpus_in_turn_and_a_large_one_keeps_them_all() {
        let rotation = CpuRotation::of(vec![0, 2, 5]);
        assert_eq!(rotation.take(1), vec![0]);
        assert_eq!(rotation.take(1), vec![2]);
        assert_eq!(rotation.take(2), vec![5, 0]);
        assert_eq!(rotation.take(1), vec![2]);
        assert_eq!(
            rotation.take(3),
            Vec::<u32>::new(),
            "as many as the host has"
        );
        assert_eq!(rotation.take(8), Vec::<u32>::new());
        assert_eq!(CpuRotation::of(Vec::new()).take(1), Vec::<u32>::new());
    }

    #[test]
    fn this_process_runs_on_at_least_one_cpu() {
        let rotation = CpuRotation::of_this_process();
        assert!(!rotation.cpus.is_empty());
        let one = rotation.take(1);
        assert!(one.len() == 1 || rotation.cpus.len() == 1, "{one:?}");
    }
}
