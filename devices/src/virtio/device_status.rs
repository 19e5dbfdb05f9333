//! The device status state machine (virtio spec 2.1 and 3.1.1) as one explicit table: what a
//! driver's write to the `Status` register does, given the current status. The transport
//! ([`super::mmio`]) applies the outcome; this file decides it and does nothing else, so every
//! row is tested on its own.
//!
//! The driver initialises a device one bit at a time, each write holding every bit before it:
//! `ACKNOWLEDGE`, then `DRIVER`, then `FEATURES_OK` (feature negotiation done), then
//! `DRIVER_OK` (the device goes live). Beyond the table, a write of 0 resets the device from any
//! state, and a write with `FAILED` (the driver gave up) adds `FAILED` from any state. Anything
//! else (skipping a step, clearing a bit, repeating a step, writing past `DEVICE_NEEDS_RESET`) is
//! a protocol violation: the status stays as it was, and the transport counts and logs it.
//! Staying put rather than setting `FAILED` keeps `FAILED` the driver's bit, as the spec has it;
//! the device's own error bit, `DEVICE_NEEDS_RESET`, is set only when activation fails.

use super::status::{ACKNOWLEDGE, DRIVER, DRIVER_OK, FAILED, FEATURES_OK};

/// The initialisation steps: (current status, status written). The last row activates the
/// device.
pub const TRANSITIONS: [(u32, u32); 4] = [
    (0, ACKNOWLEDGE),
    (ACKNOWLEDGE, ACKNOWLEDGE | DRIVER),
    (ACKNOWLEDGE | DRIVER, ACKNOWLEDGE | DRIVER | FEATURES_OK),
    (
        ACKNOWLEDGE | DRIVER | FEATURES_OK,
        ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
    ),
];

/// The status in which the device is live.
pub const LIVE: u32 = ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK;

/// What a write to `Status` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWrite {
    /// 0: reset the device and the transport (from any state, 0 included).
    Reset,
    /// A row of [`TRANSITIONS`]: the status becomes `to`.
    Step {
        /// The new status.
        to: u32,
        /// `to` is [`LIVE`]: hand the queues to the device.
        activate: bool,
    },
    /// The driver set `FAILED`: it is added to the current status, nothing else changes.
    Fail,
    /// Not allowed from the current status: the status stays; a protocol violation.
    Invalid,
}

/// What writing `written` does when the status is `current`.
pub fn on_write(current: u32, written: u32) -> StatusWrite {
    if written == 0 {
        return StatusWrite::Reset;
    }
    if written & FAILED != 0 {
        return StatusWrite::Fail;
    }
    if TRANSITIONS.contains(&(current, written)) {
        return StatusWrite::Step {
            to: written,
            activate: written == LIVE,
        };
    }
    StatusWrite::Invalid
}

/// Feature registers may be written only while the driver negotiates: `DRIVER` set, and none of
/// `FEATURES_OK`, `FAILED`, `DEVICE_NEEDS_RESET`.
pub fn features_writable(status: u32) -> bool {
    status & (DRIVER | FEATURES_OK | FAILED | super::status::DEVICE_NEEDS_RESET) == DRIVER
}

/// Queue registers may be written only between `FEATURES_OK` and `DRIVER_OK`, and not once the
/// driver or the device has failed.
pub fn queues_writable(status: u32) -> bool {
    status & (FEATURES_OK | DRIVER_OK | FAILED | super::status::DEVICE_NEEDS_RESET) == FEATURES_OK
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::status::DEVICE_NEEDS_RESET;

    const A: u32 = ACKNOWLEDGE;
    const AD: u32 = ACKNOWLEDGE | DRIVER;
    const ADF: u32 = ACKNOWLEDGE | DRIVER | FEATURES_OK;

    /// Every status a transport can be in, the device's error bit included.
    const STATES: [u32; 9] = [
        0,
        A,
        AD,
        ADF,
        LIVE,
        AD | FAILED,
        LIVE | FAILED,
        LIVE | DEVICE_NEEDS_RESET,
        LIVE | DEVICE_NEEDS_RESET | FAILED,
    ];

    #[test]
    fn each_initialisation_step_advances_one_bit_and_only_the_last_activates() {
        assert_eq!(
            on_write(0, A),
            StatusWrite::Step {
                to: A,
                activate: false
            }
        );
        assert_eq!(
            on_write(A, AD),
            StatusWrite::Step {
                to: AD,
                activate: false
            }
        );
        assert_eq!(
            on_write(AD, ADF),
            StatusWrite::Step {
                to: ADF,
                activate: false
            }
        );
        assert_eq!(
            on_write(ADF, LIVE),
            StatusWrite::Step {
                to: LIVE,
                activate: true
            }
        );
    }

    #[test]
    fn zero_resets_from_every_state() {
        for s in STATES {
            assert_eq!(on_write(s, 0), StatusWrite::Reset, "from {s:#x}");
        }
    }

    #[test]
    fn failed_is_added_from_every_state_whatever_else_is_written() {
        for s in STATES {
            assert_eq!(on_write(s, s | FAILED), StatusWrite::Fail, "from {s:#x}");
            assert_eq!(on_write(s, FAILED), StatusWrite::Fail, "from {s:#x}");
        }
        // FAILED wins over a step written with it: the device is not activated.
        assert_eq!(on_write(ADF, LIVE | FAILED), StatusWrite::Fail);
    }

    #[test]
    fn skipping_repeating_or_clearing_a_step_is_invalid() {
        let invalid = [
            (0, AD),                                               // two steps at once
            (0, DRIVER),                                           // DRIVER without ACKNOWLEDGE
            (A, ADF),                                              // FEATURES_OK before DRIVER
            (AD, AD | DRIVER_OK),                                  // DRIVER_OK before FEATURES_OK
            (A, A),                                                // a repeated step
            (LIVE, LIVE),                                          // activating twice
            (ADF, A),                                              // clearing bits
            (LIVE, ADF),                                           // un-activating
            (AD, AD | 0x10),                                       // an undefined bit
            (LIVE | DEVICE_NEEDS_RESET, LIVE),                     // clearing the device's bit
            (ADF | DEVICE_NEEDS_RESET, LIVE | DEVICE_NEEDS_RESET), // going live after an error
            (AD | FAILED, ADF),                                    // stepping on after FAILED
        ];
        for (from, to) in invalid {
            assert_eq!(
                on_write(from, to),
                StatusWrite::Invalid,
                "{from:#x} -> {to:#x}"
            );
        }
    }

    #[test]
    fn only_the_four_rows_step_and_only_the_last_activates_over_every_state_and_write() {
        // Exhaustive over the reachable states and every 8-bit write: nothing outside the
        // table moves the status forward, so nothing else can ever activate the device.
        let mut steps = Vec::new();
        for s in STATES {
            for w in 0..=u8::MAX {
                if let StatusWrite::Step { to, activate } = on_write(s, u32::from(w)) {
                    steps.push((s, to, activate));
                }
            }
        }
        assert_eq!(
            steps,
            vec![
                (0, A, false),
                (A, AD, false),
                (AD, ADF, false),
                (ADF, LIVE, true)
            ]
        );
    }

    #[test]
    fn features_are_writable_only_while_negotiating_and_queues_only_before_driver_ok() {
        let features: Vec<u32> = STATES
            .into_iter()
            .filter(|&s| features_writable(s))
            .collect();
        assert_eq!(features, vec![AD]);
        let queues: Vec<u32> = STATES.into_iter().filter(|&s| queues_writable(s)).collect();
        assert_eq!(queues, vec![ADF]);
        assert!(!features_writable(AD | DEVICE_NEEDS_RESET));
        assert!(!queues_writable(ADF | DEVICE_NEEDS_RESET));
    }
}
