//! Connects a virtio device to the VMM's event loop (rust-vmm `event-manager`): its queue
//! eventfds and its backend fd become events of one subscriber. The backend fd is watched only
//! while the device wants it ([`VirtioDevice::backend_wants_events`]), checked after each event.

use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

use super::mmio::lock;
use super::VirtioDevice;

/// The `data` of the backend fd's event (queue events carry their queue index).
const BACKEND: u32 = u32::MAX;

/// An event-manager subscriber for one virtio device.
pub struct DeviceSubscriber {
    device: Arc<Mutex<dyn VirtioDevice>>,
    backend_watched: bool,
}

impl std::fmt::Debug for DeviceSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSubscriber").finish_non_exhaustive()
    }
}

impl DeviceSubscriber {
    /// A subscriber for `device`.
    pub fn new(device: Arc<Mutex<dyn VirtioDevice>>) -> Self {
        DeviceSubscriber {
            device,
            backend_watched: false,
        }
    }

    /// Starts or stops watching the device's backend fd to match what it wants now.
    fn sync_backend(&mut self, ops: &mut EventOps) {
        let (fd, wanted) = {
            let dev = lock(&self.device);
            (dev.backend_fd(), dev.backend_wants_events())
        };
        let Some(fd) = fd else {
            return;
        };
        if wanted == self.backend_watched {
            return;
        }
        let ev = Events::with_data_raw(fd, BACKEND, EventSet::IN);
        let changed = if wanted { ops.add(ev) } else { ops.remove(ev) };
        match changed {
            Ok(()) => self.backend_watched = wanted,
            Err(e) => {
                eprintln!("crucible-vmm: cannot change the polling of a device backend: {e:?}")
            }
        }
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
        drop(dev);
        self.sync_backend(ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        self.process_event(events);
        self.sync_backend(ops);
    }
}

impl DeviceSubscriber {
    fn process_event(&mut self, events: Events) {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::fs::File;
    use std::io::Write;

    use event_manager::{EventManager, SubscriberOps};

    use super::*;
    use crate::virtio::console::{Console, ConsoleInput};
    use crate::virtio::test_utils::{default_mem, interrupt, Buf, Sink, TestQueue};

    #[test]
    fn the_loop_watches_console_input_only_while_a_receive_buffer_waits() {
        let mem = default_mem();
        let (reader, mut writer) = std::io::pipe().unwrap();
        let input =
            ConsoleInput::from_file(File::from(std::os::fd::OwnedFd::from(reader))).unwrap();
        let mut rxq = TestQueue::new(&mem, 0, 16);
        let txq = TestQueue::new(&mem, 1, 16);
        let mut console = Console::with_input(Box::new(Sink::default()), Some(input)).unwrap();
        console
            .activate(mem.clone(), interrupt(), vec![rxq.queue(), txq.queue()])
            .unwrap();
        let device = Arc::new(Mutex::new(console));
        let mut em = EventManager::<Box<dyn MutEventSubscriber + Send>>::new().unwrap();
        em.add_subscriber(Box::new(DeviceSubscriber::new(device.clone())));

        writer.write_all(b"early").unwrap();
        assert_eq!(
            em.run_with_timeout(0).unwrap(),
            0,
            "readable input but no buffer: not watched, so no event (and no spinning)"
        );

        let buf = rxq.add(&[Buf::W(64)]);
        rxq.add(&[Buf::W(64)]);
        lock(&device).queue_events()[0].write(1).unwrap();
        assert_eq!(
            em.run_with_timeout(0).unwrap(),
            1,
            "the guest's notification"
        );
        assert_eq!(rxq.used(), Some((0, 5)));
        assert_eq!(rxq.read(buf[0], 5), b"early");

        writer.write_all(b"next").unwrap();
        assert_eq!(
            em.run_with_timeout(0).unwrap(),
            1,
            "watched: a buffer waits"
        );
        assert_eq!(rxq.used(), Some((1, 4)));

        writer.write_all(b"no room").unwrap();
        assert_eq!(
            em.run_with_timeout(0).unwrap(),
            0,
            "buffers used up: not watched"
        );
        assert_eq!(rxq.used(), None);
    }
}
