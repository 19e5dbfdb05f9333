//! The agent's markers: with `crucible.boot_marker=1` the agent writes one byte to I/O port
//! [`PORT`] at each turn of its life that the VMM must know about, and the VMM traps the write.
//! [`READY`] once it is listening (so "guest ready" is timed without any vsock traffic, and the
//! boot watchdog knows the guest made it); [`STOP_REQUESTED`] or [`STOP_FAILED`] just before it
//! resets the VM. A VM that resets with neither stop marker did not end because the agent
//! ended it: its kernel panicked or `/init` died, and the VMM reports a crash, never a clean
//! stop ([`Verdict::judge`]).
//!
//! The guest needs `ioperm(2)` for this (`CONFIG_X86_IOPL_IOPERM` in the guest kernel).

/// The I/O port. Unused by anything the VMM emulates (on real hardware it is the legacy floppy
/// controller, harmless to poke).
pub const PORT: u16 = 0x03f0;

/// The agent is listening and has sent its hello.
pub const READY: u8 = 123;

/// The agent ends the VM because it was asked to: a shutdown request, the end of the boot
/// self-test.
pub const STOP_REQUESTED: u8 = 124;

/// The agent ends the VM because it cannot go on: it panicked, the sandbox's storage is
/// missing, it has nothing to serve on.
pub const STOP_FAILED: u8 = 125;

/// The stop marker the agent wrote before the VM reset, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// [`STOP_REQUESTED`].
    Requested,
    /// [`STOP_FAILED`].
    Failed,
}

impl Stop {
    /// The stop a marker byte stands for, if it is one.
    pub fn from_value(value: u8) -> Option<Stop> {
        match value {
            STOP_REQUESTED => Some(Stop::Requested),
            STOP_FAILED => Some(Stop::Failed),
            _ => None,
        }
    }

    /// The byte the agent writes.
    pub fn value(self) -> u8 {
        match self {
            Stop::Requested => STOP_REQUESTED,
            Stop::Failed => STOP_FAILED,
        }
    }
}

/// What the markers say about a VM whose guest reset or powered off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A clean stop: the agent ended the VM on request, or the guest writes no markers.
    Clean,
    /// The guest died: why, for the VMM's exit message.
    Crashed(&'static str),
}

impl Verdict {
    /// Judges a guest-initiated reset or power-off. `expected`: the command line asked for the
    /// markers (`crucible.boot_marker=1`); `ready`: [`READY`] was written; `stop`: the last
    /// stop marker written.
    pub fn judge(expected: bool, ready: bool, stop: Option<Stop>) -> Verdict {
        match (expected, ready, stop) {
            (false, _, _) | (true, _, Some(Stop::Requested)) => Verdict::Clean,
            (true, _, Some(Stop::Failed)) => Verdict::Crashed(
                "the agent ended the VM after a failure (its reason is on the console)",
            ),
            (true, false, None) => Verdict::Crashed(
                "the guest stopped before its agent was ready: the kernel panicked or /init \
                 exited (see the console)",
            ),
            (true, true, None) => Verdict::Crashed(
                "the guest reset although its agent did not end it: a kernel panic, or the \
                 agent died (see the console)",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_requested_stop_is_clean_when_markers_are_expected() {
        assert_eq!(
            Verdict::judge(true, true, Some(Stop::Requested)),
            Verdict::Clean
        );
        // A self-test that ends the VM before READY is still a requested stop.
        assert_eq!(
            Verdict::judge(true, false, Some(Stop::Requested)),
            Verdict::Clean
        );
        for (ready, stop, says) in [
            (false, None, "before its agent was ready"),
            (true, None, "did not end it"),
            (true, Some(Stop::Failed), "after a failure"),
        ] {
            match Verdict::judge(true, ready, stop) {
                Verdict::Crashed(why) => assert!(why.contains(says), "{why}"),
                Verdict::Clean => panic!("{ready} {stop:?} judged clean"),
            }
        }
    }

    #[test]
    fn a_guest_that_writes_no_markers_stops_cleanly() {
        for stop in [None, Some(Stop::Failed), Some(Stop::Requested)] {
            assert_eq!(Verdict::judge(false, false, stop), Verdict::Clean);
        }
    }

    #[test]
    fn marker_values_are_distinct_and_round_trip() {
        assert_eq!(Stop::from_value(READY), None);
        for stop in [Stop::Requested, Stop::Failed] {
            assert_eq!(Stop::from_value(stop.value()), Some(stop));
            assert_ne!(stop.value(), READY);
        }
    }
}
