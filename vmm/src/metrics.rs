//! The VM's device metrics, read when it ends: each virtio transport's count of guest driver
//! protocol violations and failed activations (`devices::virtio::transport_metrics`). One line
//! on stderr, and the JSON document `--metrics FILE` writes.

use std::sync::Arc;

use devices::virtio::transport_metrics::TransportMetrics;
use serde_json::{json, Map, Value};

/// One attached virtio device's counters.
#[derive(Debug, Clone)]
pub struct DeviceMetrics {
    /// What the VMM attached (`console`, `block /path/disk.img`, `vsock`).
    pub attached_as: String,
    /// Its IRQ.
    pub irq: u32,
    /// The transport's counters (live: read them when the VM has ended).
    pub counters: Arc<TransportMetrics>,
}

/// The counters of every attached virtio device, in attach order.
#[derive(Debug, Clone, Default)]
pub struct VmMetrics {
    /// One entry per virtio device.
    pub devices: Vec<DeviceMetrics>,
}

impl VmMetrics {
    /// Driver protocol violations on all devices.
    pub fn violations(&self) -> u64 {
        self.devices.iter().map(|d| d.counters.violations()).sum()
    }

    /// Failed activations on all devices.
    pub fn activation_failures(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| d.counters.activation_failures())
            .sum()
    }

    /// The document `--metrics FILE` holds.
    pub fn to_json(&self) -> Value {
        let devices: Vec<Value> = self
            .devices
            .iter()
            .map(|d| {
                let mut m = Map::new();
                m.insert("device".into(), d.counters.label().into());
                m.insert("attached_as".into(), d.attached_as.clone().into());
                m.insert("irq".into(), d.irq.into());
                m.insert("violations".into(), d.counters.violations().into());
                for (name, value) in d.counters.snapshot() {
                    m.insert(name.into(), value.into());
                }
                Value::Object(m)
            })
            .collect();
        json!({
            "violations": self.violations(),
            "activation_failures": self.activation_failures(),
            "devices": devices,
        })
    }

    /// One line for stderr: the totals, then each device's non-zero counters.
    pub fn summary_line(&self) -> String {
        let mut line = format!(
            "metrics: {} driver protocol violations, {} failed activations",
            self.violations(),
            self.activation_failures()
        );
        for d in &self.devices {
            let nonzero: Vec<String> = d
                .counters
                .snapshot()
                .into_iter()
                .filter(|&(_, v)| v > 0)
                .map(|(name, v)| format!("{name}={v}"))
                .collect();
            if !nonzero.is_empty() {
                line.push_str(&format!("; {}: {}", d.counters.label(), nonzero.join(" ")));
            }
        }
        line
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use devices::virtio::transport_metrics::Violation;

    use super::*;

    fn two_devices() -> VmMetrics {
        let console = Arc::new(TransportMetrics::new("virtio-console@0xd0000000"));
        let vsock = Arc::new(TransportMetrics::new("virtio-vsock@0xd0001000"));
        vsock.record(Violation::InvalidStatusTransition, format_args!("test"));
        vsock.record(Violation::InvalidStatusTransition, format_args!("test"));
        vsock.record(Violation::BadNotify, format_args!("test"));
        vsock.record_activation_failure(&std::io::Error::other("test"));
        VmMetrics {
            devices: vec![
                DeviceMetrics {
                    attached_as: "console".into(),
                    irq: 5,
                    counters: console,
                },
                DeviceMetrics {
                    attached_as: "vsock".into(),
                    irq: 6,
                    counters: vsock,
                },
            ],
        }
    }

    #[test]
    fn metrics_json_has_totals_and_every_counter_of_every_device() {
        let j = two_devices().to_json();
        assert_eq!(j["violations"], 3);
        assert_eq!(j["activation_failures"], 1);
        let devices = j["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0]["device"], "virtio-console@0xd0000000");
        assert_eq!(devices[0]["violations"], 0);
        // Zero counters are present too: a reader needs no default for a missing key.
        for v in Violation::ALL {
            assert_eq!(devices[0][v.name()], 0, "{}", v.name());
        }
        assert_eq!(devices[1]["attached_as"], "vsock");
        assert_eq!(devices[1]["irq"], 6);
        assert_eq!(devices[1]["invalid_status_transitions"], 2);
        assert_eq!(devices[1]["bad_notifies"], 1);
        assert_eq!(devices[1]["activation_failures"], 1);
    }

    #[test]
    fn metrics_line_names_only_the_devices_and_counters_that_moved() {
        let line = two_devices().summary_line();
        assert_eq!(
            line,
            "metrics: 3 driver protocol violations, 1 failed activations; \
             virtio-vsock@0xd0001000: invalid_status_transitions=2 bad_notifies=1 \
             activation_failures=1"
        );
        assert_eq!(
            VmMetrics::default().summary_line(),
            "metrics: 0 driver protocol violations, 0 failed activations"
        );
    }
}
