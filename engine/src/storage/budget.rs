//! One budget for every byte of host disk the daemon hands to sandboxes. Images are sparse, so
//! what they take grows as sandboxes write; the budget counts each at its full size, so that
//! however they fill, together they never take more than the operator allowed.

use std::sync::{Arc, Mutex};

use super::StorageError;

/// The budget and what is taken of it, in MiB.
#[derive(Debug)]
pub struct DiskBudget {
    total_mib: u64,
    taken_mib: Mutex<u64>,
}

/// A share of the budget, given back when dropped.
#[derive(Debug)]
pub struct BudgetLease {
    budget: Arc<DiskBudget>,
    mib: u64,
}

impl Drop for BudgetLease {
    fn drop(&mut self) {
        let mut taken = self.budget.taken();
        *taken = taken.saturating_sub(self.mib);
    }
}

impl BudgetLease {
    /// Takes `mib` more into this lease, for `what`, or says how much is left (the lease is
    /// unchanged then).
    pub fn grow(&mut self, what: &str, mib: u64) -> Result<(), StorageError> {
        let mut more = self.budget.take(what, mib)?;
        // Now counted in `self`: `more` gives nothing back when it drops.
        self.mib += std::mem::take(&mut more.mib);
        Ok(())
    }

    /// What it holds.
    pub fn mib(&self) -> u64 {
        self.mib
    }
}

impl DiskBudget {
    /// A budget of `total_mib`.
    pub(crate) fn new(total_mib: u64) -> Arc<Self> {
        Arc::new(DiskBudget {
            total_mib,
            taken_mib: Mutex::new(0),
        })
    }

    fn taken(&self) -> std::sync::MutexGuard<'_, u64> {
        self.taken_mib.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The whole budget.
    pub(crate) fn total_mib(&self) -> u64 {
        self.total_mib
    }

    /// What is taken now.
    pub fn taken_mib(&self) -> u64 {
        *self.taken()
    }

    /// Takes `mib` for `what`, or says how much is left.
    pub(crate) fn take(
        self: &Arc<Self>,
        what: &str,
        mib: u64,
    ) -> Result<BudgetLease, StorageError> {
        let mut taken = self.taken();
        let left = self.total_mib.saturating_sub(*taken);
        if mib > left {
            return Err(StorageError::OverBudget {
                what: what.to_string(),
                asked_mib: mib,
                left_mib: left,
                budget_mib: self.total_mib,
            });
        }
        *taken += mib;
        Ok(BudgetLease {
            budget: self.clone(),
            mib,
        })
    }

    /// What is left now.
    pub(crate) fn left_mib(&self) -> u64 {
        self.total_mib.saturating_sub(*self.taken())
    }

    /// Takes `mib` even past the budget: for what is already on disk (caches made before a
    /// restart, perhaps under a larger budget). New requests then wait for room.
    pub(crate) fn take_existing(self: &Arc<Self>, mib: u64) -> BudgetLease {
        *self.taken() += mib;
        BudgetLease {
            budget: self.clone(),
            mib,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_come_back_and_refusals_say_what_is_left() {
        let budget = DiskBudget::new(100);
        let a = budget.take("scratch of sb-1", 60).expect("fits");
        let e = budget.take("cache cargo", 50).expect_err("over");
        assert!(
            e.to_string().contains("needs 50 MiB") && e.to_string().contains("only 40 MiB"),
            "{e}"
        );
        drop(a);
        assert_eq!(budget.taken_mib(), 0);
        let _b = budget
            .take("cache cargo", 100)
            .expect("fits after the return");
        let _old = budget.take_existing(30);
        assert_eq!(budget.left_mib(), 0);
        assert_eq!(budget.taken_mib(), 130);
        assert!(budget.take("anything", 1).is_err());
    }

    #[test]
    fn a_lease_grows_within_the_budget_and_gives_everything_back() {
        let budget = DiskBudget::new(100);
        let mut lease = budget.take("upload", 0).expect("nothing");
        lease.grow("upload", 30).expect("fits");
        lease.grow("upload", 50).expect("fits");
        assert_eq!((lease.mib(), budget.left_mib()), (80, 20));
        assert!(lease.grow("upload", 21).is_err());
        assert_eq!(lease.mib(), 80, "a refused growth changes nothing");
        drop(lease);
        assert_eq!(budget.left_mib(), 100);
    }
}
