//! The shim binary's three lives: `start` (spawn the server, print its address), serving the
//! task API, and `delete` (clean up after a shim that is gone).

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::util::write_str_to_file;
use containerd_shim::{spawn, Config, DeleteResponse, Error, ExitSignal, Flags, Shim, StartOpts};

use crate::bundle_state::{self, BundleState};
use crate::events::Events;
use crate::service::{Service, LABEL_BUNDLE};

/// What containerd reports for a task whose shim is gone (as Go's `manager.Stop`): 128 + KILL.
const DEAD_SHIM_EXIT: u32 = 137;

/// The shim.
pub struct CrucibleShim {
    exit: Arc<ExitSignal>,
    namespace: String,
    bundle: String,
    client: Result<client::Client, String>,
}

impl std::fmt::Debug for CrucibleShim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrucibleShim")
            .field("namespace", &self.namespace)
            .field("bundle", &self.bundle)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Shim for CrucibleShim {
    type T = Service;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        CrucibleShim {
            exit: Arc::new(ExitSignal::default()),
            namespace: args.namespace.clone(),
            bundle: args.bundle.clone(),
            client: crate::daemon::client_from_env(),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> Result<String, Error> {
        // A configuration error shows in `ctr run`'s message, not in a shim log.
        if let Err(e) = &self.client {
            return Err(Error::InvalidArgument(e.clone()));
        }
        crate::daemon::image_idle_from_env().map_err(Error::InvalidArgument)?;
        // One shim per pod (the pause container's id groups its containers), else one per
        // container. containerd starts the shim in the task's bundle.
        let grouping = match containerd_shim::util::read_spec(".").await {
            Ok(spec) => crate::pod::grouping(spec.annotations().as_ref(), &opts.id),
            Err(_) => opts.id.clone(),
        };
        let address = spawn(opts, &grouping, Vec::new()).await?;
        // The serving shim removes the socket named here when it exits.
        write_str_to_file("address", &address).await?;
        Ok(address)
    }

    async fn delete_shim(&mut self) -> Result<DeleteResponse, Error> {
        let bundle = if self.bundle.is_empty() {
            std::env::current_dir().map_err(|e| Error::IoError {
                context: "finding the bundle".into(),
                err: e,
            })?
        } else {
            PathBuf::from(&self.bundle)
        };
        match &self.client {
            Ok(client) => clean_up(client, &bundle).await,
            Err(e) => log::warn!("cannot clean up {}: {e}", bundle.display()),
        }
        Ok(DeleteResponse {
            pid: 0,
            exit_status: DEAD_SHIM_EXIT,
            exited_at: MessageField::some(containerd_shim::util::timestamp()?),
            ..DeleteResponse::default()
        })
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> Service {
        Service::new(
            self.client.clone(),
            Events::new(publisher, self.namespace.clone()),
            self.namespace.clone(),
            self.exit.clone(),
        )
    }
}

/// Releases what the bundle says is held, and any sandbox labelled with this bundle (one made
/// by a shim that died before it could write its id down). Best effort: failures are logged,
/// and containerd runs this again only if it runs the shim again.
async fn clean_up(client: &client::Client, bundle: &std::path::Path) {
    let mut held = BundleState::read(bundle).unwrap_or_else(|e| {
        log::warn!("{}", report::chain(&e));
        BundleState::default()
    });
    if let Err(e) = bundle_state::release(client, bundle, &mut held).await {
        log::warn!("cleaning up {}: {}", bundle.display(), report::chain(&e));
    }
    let bundle_label = bundle.display().to_string();
    match client.list().await {
        Ok(sandboxes) => {
            for sandbox in sandboxes
                .iter()
                .filter(|s| s.labels.get(LABEL_BUNDLE) == Some(&bundle_label))
            {
                match client.delete(&sandbox.id).await {
                    Ok(()) | Err(client::ClientError::Api { status: 404, .. }) => {}
                    Err(e) => log::warn!("deleting sandbox {}: {}", sandbox.id, report::chain(&e)),
                }
            }
        }
        Err(e) => log::warn!("listing sandboxes: {}", report::chain(&e)),
    }
}
