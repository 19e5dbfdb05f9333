//! Task events for containerd, in the order they happen.

use std::time::Duration;

use containerd_shim::event::Event;
use containerd_shim::protos::ttrpc::context;
use containerd_shim::publisher::RemotePublisher;

/// Publishes to containerd's event service in one namespace. The publisher queues in call
/// order, so events leave in the order they were published.
pub struct Events {
    publisher: RemotePublisher,
    namespace: String,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Events {
    /// Events of `namespace` through `publisher`.
    pub fn new(publisher: RemotePublisher, namespace: String) -> Self {
        Events {
            publisher,
            namespace,
        }
    }

    /// Queues `event`. A full queue (containerd unreachable for long) loses the event and logs
    /// it: a task call never fails because its event could not be sent.
    pub async fn publish(&self, event: impl Event + 'static) {
        let topic = event.topic();
        let ctx = context::with_duration(Duration::from_secs(5));
        if let Err(e) = self
            .publisher
            .publish(ctx, &topic, &self.namespace, Box::new(event))
            .await
        {
            log::warn!("publishing {topic}: {e}");
        }
    }
}
