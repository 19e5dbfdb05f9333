//! Which host CPUs a namespace sandbox's processes run on: as many as it has vCPUs, so that
//! `nproc` (and cargo, make, Go, anything sizing its work by `sched_getaffinity`) inside
//! `--vcpus 2` says 2 and inside the default says 1, as in a microVM. The cgroup's CPU quota
//! stays the limit; the set only says how many CPUs to plan for.
//!
//! Each sandbox takes the CPUs the fewest live sandboxes run on (the lowest-numbered among
//! equals) and gives them back when it goes: a host's single-vCPU sandboxes spread over all
//! of its CPUs, and a CPU that a finished job leaves idle is the next one's, rather than two
//! busy jobs sharing one CPU beside an idle one.

use std::sync::{Arc, Mutex};

/// The CPUs the daemon may run on, with how many live sandboxes run on each.
#[derive(Debug, Default)]
pub(crate) struct CpuRotation {
    cpus: Vec<u32>,
    load: Arc<Mutex<Vec<usize>>>,
}

/// The CPUs one sandbox runs on, counted as taken until dropped.
#[derive(Debug)]
pub(crate) struct CpuLease {
    cpus: Vec<u32>,
    /// Indexes into the rotation's CPUs, and the counts to give them back to.
    taken: Vec<usize>,
    load: Arc<Mutex<Vec<usize>>>,
}

impl CpuLease {
    /// The CPUs, for the supervisor's `--cpus` (empty: the daemon's whole set).
    pub(crate) fn cpus(&self) -> &[u32] {
        &self.cpus
    }
}

impl Drop for CpuLease {
    fn drop(&mut self) {
        let mut load = self.load.lock().unwrap_or_else(|p| p.into_inner());
        for &i in &self.taken {
            if let Some(count) = load.get_mut(i) {
                *count = count.saturating_sub(1);
            }
        }
    }
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
        let load = Arc::new(Mutex::new(vec![0; cpus.len()]));
        CpuRotation { cpus, load }
    }

    /// Counts as taken the CPUs that process `pid` (a sandbox's supervisor, which an earlier
    /// daemon started) runs on, unless that is all of them or cannot be read.
    pub(crate) fn adopt(&self, pid: i32) -> CpuLease {
        let mut lease = CpuLease {
            cpus: Vec::new(),
            taken: Vec::new(),
            load: self.load.clone(),
        };
        let Some(set) = (pid > 0)
            .then(|| rustix::process::Pid::from_raw(pid))
            .flatten()
            .and_then(|pid| rustix::thread::sched_getaffinity(Some(pid)).ok())
        else {
            return lease;
        };
        let taken: Vec<usize> = (0..self.cpus.len())
            .filter(|&i| set.is_set(self.cpus[i] as usize))
            .collect();
        if taken.len() >= self.cpus.len() {
            return lease;
        }
        let mut load = self.load.lock().unwrap_or_else(|p| p.into_inner());
        for &i in &taken {
            load[i] += 1;
        }
        lease.cpus = taken.iter().map(|&i| self.cpus[i]).collect();
        lease.taken = taken;
        lease
    }

    /// The CPUs for a sandbox of `vcpus` vCPUs: the `vcpus` least taken, or none (the
    /// daemon's whole set, not counted) when it has as many vCPUs as the host has CPUs, or
    /// more.
    pub(crate) fn take(&self, vcpus: u32) -> CpuLease {
        let n = vcpus as usize;
        let mut lease = CpuLease {
            cpus: Vec::new(),
            taken: Vec::new(),
            load: self.load.clone(),
        };
        if n == 0 || n >= self.cpus.len() {
            return lease;
        }
        let mut load = self.load.lock().unwrap_or_else(|p| p.into_inner());
        let mut order: Vec<usize> = (0..self.cpus.len()).collect();
        // Stable: among CPUs equally taken, the lowest-numbered first.
        order.sort_by_key(|&i| load[i]);
        order.truncate(n);
        order.sort_unstable();
        for &i in &order {
            load[i] += 1;
        }
        lease.cpus = order.iter().map(|&i| self.cpus[i]).collect();
        lease.taken = order;
        lease
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandboxes_take_the_least_taken_cpus_and_give_them_back() {
        let rotation = CpuRotation::of(vec![0, 2, 5]);
        let a = rotation.take(1);
        let b = rotation.take(1);
        assert_eq!((a.cpus(), b.cpus()), (&[0][..], &[2][..]));
        let c = rotation.take(2);
        assert_eq!(
            c.cpus(),
            &[0, 5],
            "5 is free, then the lowest of the equally taken"
        );
        drop(b);
        assert_eq!(
            rotation.take(1).cpus(),
            &[2],
            "the CPU a finished sandbox left idle"
        );
        let all = rotation.take(3);
        assert!(
            all.cpus().is_empty(),
            "as many as the host has: the whole set"
        );
        assert!(rotation.take(8).cpus().is_empty());
        drop((a, c, all));
        assert_eq!(*rotation.load.lock().expect("load"), vec![0, 0, 0]);
        assert!(CpuRotation::of(Vec::new()).take(1).cpus().is_empty());
    }

    #[test]
    fn a_process_of_an_earlier_daemon_counts_for_the_cpus_it_runs_on() {
        let rotation = CpuRotation::of_this_process();
        // This process runs on them all: nothing is counted.
        let pid = std::process::id() as i32;
        assert!(rotation.adopt(pid).cpus().is_empty());
        assert!(rotation.adopt(-1).cpus().is_empty(), "no such process");
        assert!(rotation.load.lock().expect("load").iter().all(|n| *n == 0));
    }

    #[test]
    fn this_process_runs_on_at_least_one_cpu() {
        let rotation = CpuRotation::of_this_process();
        assert!(!rotation.cpus.is_empty());
        let one = rotation.take(1);
        assert!(one.cpus().len() == 1 || rotation.cpus.len() == 1, "{one:?}");
    }
}
