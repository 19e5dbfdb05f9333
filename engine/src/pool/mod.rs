//! The warm pool: per declared shape (`--pool`), a few sandboxes created ahead of any request
//! and kept ready, so that a create asking for exactly that shape gets one at once.
//!
//! A pooled sandbox is a bare backend instance, never registered: no client can reach it, by
//! id or otherwise, until a create takes it, and a take pops it under the pool's lock, so it is
//! handed out once. Each holds a registry reservation (pools count toward the sandbox cap) and
//! has the id it will be handed out under (the id is its hostname and its runtime directory,
//! made at creation), random like any other and never used twice. One refill task per shape
//! creates one instance at a time, drops the ones that die while waiting, and backs off when
//! creating fails. See `docs/pool.md`.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub use crate::settings::pool_spec::{parse_file, PoolSpec, PoolSpecError, Shape, ShapeDefaults};
pub(crate) use crate::settings::pool_spec::{resolve_all, ShapeBounds};

use crate::backend::{Backend, BackendError, Backends, Instance, InstanceSpec};
use crate::metrics::Histogram;
use crate::sandbox::{new_id, Registry, Reservation, SandboxError};

/// Why a refill did not add an instance.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RefillError {
    /// The registry refused (at capacity, shutting down).
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The daemon does not offer the shape's backend.
    #[error("this daemon does not offer the {0} backend")]
    NoBackend(api_types::BackendKind),
    /// The backend failed to make it.
    #[error("creating ready sandbox {id}")]
    Failed {
        /// The id it would have had.
        id: String,
        /// What failed.
        #[source]
        source: BackendError,
    },
    /// The creation's task ended without an answer.
    #[error("the refill task failed: {0}")]
    Task(String),
}

/// The first pause after a failed refill; it doubles on each failure in a row.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest pause between refill attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A ready instance waiting in a pool.
pub(crate) struct Pooled {
    /// The id it is handed out under.
    pub id: String,
    /// The running instance, made with no env, no mounts and no egress.
    pub(crate) instance: Box<dyn Instance>,
    /// Its place under the sandbox cap; the sandbox made from it inherits it.
    pub(crate) reservation: Reservation,
}

impl std::fmt::Debug for Pooled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooled").field("id", &self.id).finish()
    }
}

impl Pooled {
    fn is_alive(&self) -> bool {
        self.instance.exited().borrow().is_none()
    }
}

/// What a take found.
#[derive(Debug)]
pub(crate) enum Take {
    /// A ready instance of the shape, now the caller's.
    Hit(Pooled),
    /// The shape is pooled, but none is ready.
    Empty,
    /// No pool has this shape.
    NoShape,
}

/// One shape's pool.
#[derive(Debug)]
struct ShapePool {
    shape: Shape,
    size: usize,
    ready: Mutex<VecDeque<Pooled>>,
    /// Wakes the refill task: an instance was taken, or shutdown began.
    wake: Notify,
}

impl ShapePool {
    fn ready(&self) -> std::sync::MutexGuard<'_, VecDeque<Pooled>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes out the instances that died while waiting.
    fn take_dead(&self) -> Vec<Pooled> {
        let mut ready = self.ready();
        let (alive, dead): (VecDeque<Pooled>, VecDeque<Pooled>) =
            ready.drain(..).partition(Pooled::is_alive);
        *ready = alive;
        dead.into()
    }
}

/// Every pool of the daemon (none unless `--pool` declared some), and its counters.
#[derive(Debug, Default)]
pub struct WarmPool {
    pools: Vec<ShapePool>,
    hits: AtomicU64,
    misses: AtomicU64,
    unpooled: AtomicU64,
    died: AtomicU64,
    refill: Histogram,
}

impl WarmPool {
    /// Empty pools for `shapes` and their sizes (resolved and checked by [`resolve_all`]);
    /// [`WarmPool::start`] fills them.
    pub(crate) fn new(shapes: Vec<(Shape, usize)>) -> Self {
        WarmPool {
            pools: shapes
                .into_iter()
                .map(|(shape, size)| ShapePool {
                    shape,
                    size,
                    ready: Mutex::new(VecDeque::with_capacity(size)),
                    wake: Notify::new(),
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Whether any pool is declared.
    pub(crate) fn is_configured(&self) -> bool {
        !self.pools.is_empty()
    }

    /// Takes a live ready instance of `shape`, oldest first. Dead ones are left for the refill
    /// task, which is woken by their death and replaces them.
    /// Counts a hit, a miss (the shape is pooled but none is ready) or an unpooled request.
    pub(crate) fn take(&self, shape: &Shape) -> Take {
        let Some(pool) = self.pools.iter().find(|p| p.shape == *shape) else {
            self.count_unpooled();
            return Take::NoShape;
        };
        let taken = {
            let mut ready = pool.ready();
            ready
                .iter()
                .position(Pooled::is_alive)
                .and_then(|i| ready.remove(i))
        };
        pool.wake.notify_one();
        match taken {
            Some(pooled) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Take::Hit(pooled)
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                Take::Empty
            }
        }
    }

    /// Counts a create that no pool could serve: its shape is not pooled, or it asks for what
    /// is set up at creation (network, caches, volumes, a disk). Counted only when pools are
    /// declared.
    pub(crate) fn count_unpooled(&self) {
        if self.is_configured() {
            self.unpooled.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Its Prometheus series (nothing when no pool is declared).
    pub fn render_metrics(&self, out: &mut String) {
        if !self.is_configured() {
            return;
        }
        let name = "crucible_pool_ready";
        let _ = writeln!(
            out,
            "# HELP {name} Ready sandboxes waiting in each warm pool.\n# TYPE {name} gauge"
        );
        for (shape, ready) in self.ready_counts() {
            let _ = writeln!(out, "{name}{{shape=\"{shape}\"}} {ready}");
        }
        let name = "crucible_pool_size";
        let _ = writeln!(
            out,
            "# HELP {name} Declared size of each warm pool.\n# TYPE {name} gauge"
        );
        for pool in &self.pools {
            let _ = writeln!(out, "{name}{{shape=\"{}\"}} {}", pool.shape, pool.size);
        }
        for (name, help, value) in [
            (
                "crucible_pool_hits_total",
                "Creates served from a warm pool.",
                &self.hits,
            ),
            (
                "crucible_pool_misses_total",
                "Creates of a pooled shape that found none ready (created cold).",
                &self.misses,
            ),
            (
                "crucible_pool_unpooled_total",
                "Creates no pool could serve: shape not pooled, or network, caches, volumes \
                 or a disk asked for.",
                &self.unpooled,
            ),
            (
                "crucible_pool_died_total",
                "Ready sandboxes that died while waiting in a pool (replaced).",
                &self.died,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        self.refill.render(
            out,
            "crucible_pool_refill_seconds",
            "Time to create one ready sandbox for a warm pool.",
        );
    }

    /// Each shape (as `image,memory=…,vcpus=…,backend=…`) and how many it keeps ready.
    pub fn sizes(&self) -> Vec<(String, usize)> {
        self.pools
            .iter()
            .map(|p| (p.shape.to_string(), p.size))
            .collect()
    }

    /// The ids of the instances waiting now, every pool's (for inspection by the daemon's
    /// embedder and its tests; never served over the API, where they would let a client guess
    /// the next sandbox's id).
    pub fn ready_ids(&self) -> Vec<String> {
        self.pools
            .iter()
            .flat_map(|p| p.ready().iter().map(|r| r.id.clone()).collect::<Vec<_>>())
            .collect()
    }

    /// Each shape (as `image,memory=…,vcpus=…,backend=…`) and how many are ready now.
    pub(crate) fn ready_counts(&self) -> Vec<(String, usize)> {
        self.pools
            .iter()
            .map(|p| (p.shape.to_string(), p.ready().len()))
            .collect()
    }

    /// Starts one refill task per pool on the current runtime, each creating on its shape's
    /// backend in `backends` and reserving under `max_sandboxes` in `registry`. A pool whose
    /// backend the daemon does not offer logs why and stays empty.
    pub(crate) fn start(
        self: &Arc<Self>,
        registry: &Arc<Registry>,
        backends: &Backends,
        max_sandboxes: usize,
    ) {
        for index in 0..self.pools.len() {
            let Some(pool) = self.pools.get(index) else {
                continue;
            };
            let Some(backend) = backends.get(pool.shape.backend) else {
                tracing::warn!(
                    "pool {}: {}",
                    pool.shape,
                    RefillError::NoBackend(pool.shape.backend)
                );
                continue;
            };
            let refiller = Refiller {
                pools: self.clone(),
                index,
                registry: registry.clone(),
                backend: backend.clone(),
                max_sandboxes,
            };
            tokio::spawn(refiller.run());
        }
    }

    /// Destroys every ready instance (daemon shutdown, after the registry stopped creating:
    /// nothing refills any more) and waits until they are gone.
    pub(crate) async fn drain(&self, registry: &Registry) {
        let mut all = Vec::new();
        for pool in &self.pools {
            all.extend(pool.ready().drain(..));
            pool.wake.notify_one();
        }
        let destructions = all.into_iter().map(|pooled| async move {
            let Pooled {
                instance,
                reservation,
                ..
            } = pooled;
            registry.destroy_instance(instance).await;
            drop(reservation);
        });
        futures_util::future::join_all(destructions).await;
    }
}

/// What one pool's refill task needs.
struct Refiller {
    pools: Arc<WarmPool>,
    index: usize,
    registry: Arc<Registry>,
    backend: Arc<dyn Backend>,
    max_sandboxes: usize,
}

impl Refiller {
    fn pool(&self) -> &ShapePool {
        // `start` made one refiller per existing index, and pools are never removed.
        &self.pools.pools[self.index]
    }

    /// Keeps the pool full: one creation at a time, a pause that doubles after each failure,
    /// the dead replaced. Ends when the daemon shuts down.
    async fn run(self) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            if self.registry.is_shutting_down() {
                return;
            }
            let pool = self.pool();
            for dead in pool.take_dead() {
                tracing::warn!(
                    "pool {}: ready sandbox {} died while waiting; replacing it",
                    pool.shape,
                    dead.id
                );
                self.pools.died.fetch_add(1, Ordering::Relaxed);
                self.registry.destroy_instance(dead.instance).await;
                drop(dead.reservation);
            }
            if pool.ready().len() < pool.size {
                match self.fill_one().await {
                    Ok(()) => backoff = FIRST_BACKOFF,
                    Err(RefillError::Sandbox(SandboxError::ShuttingDown)) => return,
                    Err(e) => {
                        if matches!(e, RefillError::Sandbox(SandboxError::AtCapacity(_))) {
                            // Clients hold every place; a deletion frees one.
                            tracing::debug!("pool {}: {e}; retrying in {backoff:?}", pool.shape);
                        } else {
                            tracing::warn!(
                                "pool {}: {}; retrying in {backoff:?}",
                                pool.shape,
                                report::chain(&e)
                            );
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
                continue;
            }
            let exits: Vec<_> = pool.ready().iter().map(|p| p.instance.exited()).collect();
            let deaths = async move {
                if exits.is_empty() {
                    return std::future::pending::<()>().await;
                }
                let waits = exits.into_iter().map(|mut exited| {
                    Box::pin(async move {
                        // A closed channel means the instance is gone too: look again.
                        let _ = exited.wait_for(Option::is_some).await;
                    })
                });
                futures_util::future::select_all(waits).await;
            };
            tokio::select! {
                () = pool.wake.notified() => {}
                () = deaths => {}
            }
        }
    }

    /// Creates one instance and adds it to the pool, as a tracked creation: shutdown waits
    /// for it, then finds it in the pool and destroys it.
    async fn fill_one(&self) -> Result<(), RefillError> {
        let pools = self.pools.clone();
        let index = self.index;
        let registry = self.registry.clone();
        let backend = self.backend.clone();
        let max_sandboxes = self.max_sandboxes;
        let creation = self.registry.spawn_creation(async move {
            let pool = &pools.pools[index];
            let reservation = registry.reserve(max_sandboxes)?;
            let id = new_id();
            let started = Instant::now();
            let spec = InstanceSpec {
                id: id.clone(),
                hostname: id.clone(),
                memory_mib: pool.shape.memory_mib,
                vcpus: pool.shape.vcpus,
                env: Default::default(),
                disk: None,
                mounts: Vec::new(),
                egress: None,
                root: None,
                containers: Vec::new(),
                container_disks: Vec::new(),
                shared: Vec::new(),
                container_slots: 0,
                network_namespace: None,
                sysctls: Vec::new(),
            };
            let instance = backend
                .create(spec)
                .await
                .map_err(|source| RefillError::Failed {
                    id: id.clone(),
                    source,
                })?;
            pools.refill.observe(started.elapsed());
            pool.ready().push_back(Pooled {
                id,
                instance,
                reservation,
            });
            Ok(())
        });
        creation
            .await
            .map_err(|e| RefillError::Task(e.to_string()))?
    }
}
