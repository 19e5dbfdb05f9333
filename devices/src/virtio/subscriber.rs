//! Connects a virtio device to the VMM's event loop (rust-vmm `event-manager`): its queue
//! eventfds and its backend fd become events of one subscriber.

use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

use super::mmio::lock;
use super::VirtioDevice;

/// The `data` of the backend fd's event (queue events carry their queue index).
const BACKEND: u32 = u32::MAX;

/// An event-manager subscriber for one virtio device.
pub struct DeviceSubscriber {
    device: Arc<Mutex<dyn VirtioDevice>>,
}

impl std::fmt::Debug for DeviceSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSubscriber").finish_non_exhaustive()
    }
}

impl DeviceSubscriber {
    /// A subscriber for `device`.
    pub fn new(device: Arc<Mutex<dyn VirtioDevice>>) -> Self {
        DeviceSubscriber { device }
    }
}

impl MutEventSubscriber for DeviceSubscriber {
    fn init(&mut self, ops: &mut EventOps) {
        let dev = lock(&self.device);
        for (i, evt) in dev.queue_events().iter().enumerate() {
            if let Err(e) = ops.add(Events::with_data(evt, i as u32, EventSet::IN)) {
                eprintln!("crucible-vmm: cannot poll a queue eventfd: {e:?}");
            }
        }
        if let Some(fd) = dev.backend_fd() {
            let ev = Events::with_data_raw(fd, BACKEND, EventSet::IN);
            if let Err(e) = ops.add(ev) {
                eprintln!("crucible-vmm: cannot poll a device backend: {e:?}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let mut dev = lock(&self.device);
        match events.data() {
            BACKEND => dev.process_backend(),
            i => {
                let i = i as usize;
                if let Some(evt) = dev.queue_events().get(i) {
                    // Drain the counter; a failed read only means nothing was pending.
                    let _ = evt.read();
                }
                if dev.is_activated() {
                    dev.process_queue(i);
                }
            }
        }
    }
}
