//! The proxy's cache of resolved names, shared by every sandbox of the daemon: a package
//! manager opens a new connection per download (npm opened 138 tunnels for one install), and
//! a lookup per connection costs what the host's resolver costs each time, including the
//! 5 s retry of a dropped query. One name is looked up once at a time (concurrent requests
//! wait for that lookup), an answer is kept for [`ANSWER_TTL`] and a failure for
//! [`FAILURE_TTL`], for at most [`MAX_NAMES`] names.
//!
//! What is cached is only the resolver's answer: the proxy checks every address of it
//! against the asking sandbox's policy on every connection, as it did without the cache, so
//! a cached name never lets through an address a policy refuses (no DNS rebinding), and a
//! sandbox only ever asks for names its own rules allow. The host's `getaddrinfo` gives no
//! record TTLs, so every answer is kept for the same short time, below the TTL of the CDNs
//! package registries sit behind (60–300 s) and long enough for one install's burst.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::proxy::Resolve;

/// How long a name's addresses are kept.
pub(crate) const ANSWER_TTL: Duration = Duration::from_secs(30);
/// How long a failed lookup is remembered (a name that does not exist, a resolver that
/// failed): short, so a fixed resolver is used again soon.
pub(crate) const FAILURE_TTL: Duration = Duration::from_secs(2);
/// Most names kept at once; past it, expired ones are dropped, then the oldest.
pub(crate) const MAX_NAMES: usize = 4096;

/// One name's cached lookup.
#[derive(Debug, Clone)]
enum Answer {
    Addresses(Vec<IpAddr>),
    /// The lookup's error, as the resolver worded it.
    Failed(io::ErrorKind, String),
}

#[derive(Debug)]
struct Entry {
    answer: Answer,
    expires: Instant,
}

/// A name's slot: its last answer, behind a lock that the one lookup in flight holds.
type Slot = Arc<tokio::sync::Mutex<Option<Entry>>>;

/// A [`Resolve`] that keeps answers of `inner` (see the module's documentation).
pub(crate) struct CachingResolver {
    inner: Arc<dyn Resolve>,
    names: Mutex<HashMap<String, (Slot, Instant)>>,
}

impl std::fmt::Debug for CachingResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = self.names.lock().map_or(0, |names| names.len());
        f.debug_struct("CachingResolver")
            .field("names", &names)
            .finish_non_exhaustive()
    }
}

impl CachingResolver {
    pub(crate) fn new(inner: Arc<dyn Resolve>) -> Self {
        CachingResolver {
            inner,
            names: Mutex::new(HashMap::new()),
        }
    }

    /// The slot of `name`, made if new (making room first when the table is full).
    fn slot(&self, name: &str) -> Slot {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((slot, _)) = names.get(name) {
            return slot.clone();
        }
        if names.len() >= MAX_NAMES {
            let now = Instant::now();
            // An entry whose lock is held has a lookup in flight: kept.
            names.retain(|_, (slot, _)| match slot.try_lock() {
                Ok(entry) => entry.as_ref().is_some_and(|e| e.expires > now),
                Err(_) => true,
            });
            if names.len() >= MAX_NAMES {
                if let Some(oldest) = names
                    .iter()
                    .min_by_key(|(_, (_, made))| *made)
                    .map(|(name, _)| name.clone())
                {
                    names.remove(&oldest);
                }
            }
        }
        let slot = Slot::default();
        names.insert(name.to_string(), (slot.clone(), Instant::now()));
        slot
    }

    /// How many names are kept (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Resolve for CachingResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>> {
        Box::pin(async move {
            let name = host.to_ascii_lowercase();
            let slot = self.slot(&name);
            // Held across the lookup: requests for the same name wait for its answer.
            let mut entry = slot.lock().await;
            let now = Instant::now();
            let answer = match entry.as_ref().filter(|e| e.expires > now) {
                Some(fresh) => fresh.answer.clone(),
                None => {
                    let (answer, ttl) = match self.inner.resolve(&name, port).await {
                        Ok(addrs) => (
                            Answer::Addresses(addrs.iter().map(SocketAddr::ip).collect()),
                            ANSWER_TTL,
                        ),
                        Err(e) => (Answer::Failed(e.kind(), e.to_string()), FAILURE_TTL),
                    };
                    *entry = Some(Entry {
                        answer: answer.clone(),
                        expires: Instant::now() + ttl,
                    });
                    answer
                }
            };
            match answer {
                Answer::Addresses(ips) => Ok(ips
                    .into_iter()
                    .map(|ip| SocketAddr::new(ip, port))
                    .collect()),
                Answer::Failed(kind, message) => Err(io::Error::new(kind, message)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A resolver that answers after `delay`, counting lookups; names starting with `bad`
    /// fail.
    #[derive(Debug)]
    struct Slow {
        delay: Duration,
        lookups: AtomicUsize,
    }

    impl Resolve for Slow {
        fn resolve<'a>(
            &'a self,
            host: &'a str,
            port: u16,
        ) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>> {
            Box::pin(async move {
                self.lookups.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(self.delay).await;
                if host.starts_with("bad") {
                    return Err(io::Error::new(io::ErrorKind::NotFound, "no such name"));
                }
                Ok(vec![SocketAddr::from(([192, 0, 2, 7], port))])
            })
        }
    }

    fn cache(delay: Duration) -> (Arc<Slow>, CachingResolver) {
        let slow = Arc::new(Slow {
            delay,
            lookups: AtomicUsize::new(0),
        });
        (slow.clone(), CachingResolver::new(slow))
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_lookups_of_one_name_are_one_and_its_answer_is_kept_for_its_ttl() {
        let (slow, cache) = cache(Duration::from_millis(500));
        let cache = Arc::new(cache);
        let asks: Vec<_> = (0..50)
            .map(|i| {
                let cache = cache.clone();
                tokio::spawn(async move {
                    let name = if i % 2 == 0 {
                        "Registry.test"
                    } else {
                        "registry.test"
                    };
                    cache.resolve(name, 443 + i % 2).await
                })
            })
            .collect();
        for (i, ask) in asks.into_iter().enumerate() {
            let addrs = ask.await.expect("task").expect("resolved");
            assert_eq!(
                addrs,
                [SocketAddr::from(([192, 0, 2, 7], 443 + i as u16 % 2))]
            );
        }
        assert_eq!(
            slow.lookups.load(Ordering::SeqCst),
            1,
            "one lookup for 50 asks"
        );

        tokio::time::advance(ANSWER_TTL - Duration::from_secs(1)).await;
        cache.resolve("registry.test", 80).await.expect("cached");
        assert_eq!(slow.lookups.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        cache
            .resolve("registry.test", 80)
            .await
            .expect("looked up again");
        assert_eq!(
            slow.lookups.load(Ordering::SeqCst),
            2,
            "expired: asked again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_lookup_is_remembered_briefly_with_its_error() {
        let (slow, cache) = cache(Duration::from_millis(10));
        for _ in 0..3 {
            let e = cache.resolve("bad.test", 80).await.expect_err("fails");
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
            assert_eq!(e.to_string(), "no such name");
        }
        assert_eq!(slow.lookups.load(Ordering::SeqCst), 1);
        tokio::time::advance(FAILURE_TTL + Duration::from_millis(1)).await;
        cache.resolve("bad.test", 80).await.expect_err("fails");
        assert_eq!(slow.lookups.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_is_bounded_and_a_full_one_drops_expired_names_first() {
        let (slow, cache) = cache(Duration::ZERO);
        for i in 0..MAX_NAMES + 10 {
            cache
                .resolve(&format!("n{i}.test"), 80)
                .await
                .expect("resolved");
        }
        assert_eq!(cache.len(), MAX_NAMES, "never more than the bound");
        tokio::time::advance(ANSWER_TTL + Duration::from_secs(1)).await;
        cache.resolve("fresh.test", 80).await.expect("resolved");
        assert_eq!(cache.len(), 1, "the expired names made room");
        assert_eq!(slow.lookups.load(Ordering::SeqCst), MAX_NAMES + 11);
    }
}
