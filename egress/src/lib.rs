//! Sandbox egress, the daemon's half: a sandbox has no network; its agent serves an HTTP proxy
//! on the sandbox's loopback and hands each accepted connection, as a raw byte stream, to
//! `proxy::serve`, which checks the request against the sandbox's allowlist (bounded by the
//! operator's), resolves the target once, checks every address, connects and relays.
//! The engine reaches it only through [`engine::egress::EgressProxy`], which [`Proxy`]
//! implements. See `docs/egress.md`.

#![forbid(unsafe_code)]

mod address;
mod dns_cache;
mod policy;
mod proxy;
mod request;
mod rules;
mod sink;

pub use proxy::{Resolve, SystemResolver};
pub use rules::RuleError;
pub use sink::MAX_CONNECTIONS_PER_SANDBOX;

use std::sync::Arc;

use engine::egress::{EgressPlan, EgressRefused, PodSockets};

use dns_cache::CachingResolver;
use policy::{EgressPolicy, PolicyError};
use proxy::EgressContext;
use rules::Allowlist;
use sink::sink;

/// The egress proxy of one daemon: the operator's allowlist, which every sandbox's own rules
/// must stay within.
#[derive(Debug, Clone)]
pub struct Proxy {
    operator: Allowlist,
    /// The host's resolver behind the daemon's cache of answers, shared by every sandbox.
    resolver: Arc<CachingResolver>,
}

impl Proxy {
    /// The proxy for the operator's rules (`--egress-allow`); an empty list allows nothing.
    /// Names are resolved by the host's `getaddrinfo`, behind the daemon's cache.
    pub fn new(operator_rules: &[String]) -> Result<Self, RuleError> {
        Self::with_resolver(operator_rules, Arc::new(SystemResolver))
    }

    /// The same with names resolved by `resolver` (behind the same cache).
    pub fn with_resolver(
        operator_rules: &[String],
        resolver: Arc<dyn Resolve>,
    ) -> Result<Self, RuleError> {
        Ok(Proxy {
            operator: Allowlist::parse(operator_rules)?,
            resolver: Arc::new(CachingResolver::new(resolver)),
        })
    }
}

impl engine::egress::EgressProxy for Proxy {
    fn plan(&self, allow: &[String]) -> Result<EgressPlan, EgressRefused> {
        let policy = EgressPolicy::new(allow, &self.operator).map_err(|e| match e {
            PolicyError::Rule(_) => {
                EgressRefused::Invalid(format!("network.allow: {}", report::chain(&e)))
            }
            e => EgressRefused::Forbidden(e.to_string()),
        })?;
        Ok(self.plan_with(Arc::new(policy), None))
    }

    fn plan_in_pod(&self, pod: Arc<PodSockets>) -> Result<EgressPlan, EgressRefused> {
        // Never consulted (the pod's network decides); kept for the context's shape.
        let policy = Arc::new(
            EgressPolicy::new(&[], &self.operator)
                .map_err(|e| EgressRefused::Invalid(report::chain(&e)))?,
        );
        Ok(self.plan_with(policy, Some(pod)))
    }
}

impl Proxy {
    /// The plan making a sandbox's sink: its connections under `policy`, or from `pod`.
    fn plan_with(&self, policy: Arc<EgressPolicy>, pod: Option<Arc<PodSockets>>) -> EgressPlan {
        let resolver = self.resolver.clone();
        Box::new(move |sandbox_id, counters| {
            let context = Arc::new(EgressContext {
                sandbox_id: sandbox_id.to_string(),
                policy,
                counters,
                resolver,
                pod,
            });
            sink(context, MAX_CONNECTIONS_PER_SANDBOX)
        })
    }
}
