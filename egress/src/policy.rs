//! A sandbox's egress policy: the rules it asked for, each within the operator's, and the two
//! checks every proxied connection passes — the target against the sandbox's rules before
//! anything is resolved, then every resolved address against the address policy.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::address::{special_use, SpecialUse};
use crate::rules::{Allowlist, Host, Rule, RuleError, RuleHost};

/// Why a sandbox's requested rules are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PolicyError {
    #[error("invalid egress rule")]
    Rule(#[from] RuleError),
    #[error("egress rule {rule:?} is for the operator only (networks and `*`); name the hosts or addresses this sandbox needs")]
    OperatorOnly { rule: String },
    #[error("egress rule {rule:?} is not within what the operator allows ({operator}){hint}")]
    NotCovered {
        rule: String,
        operator: String,
        /// What to ask for instead, when the rule lacks only a port the operator names.
        hint: String,
    },
}

/// The rules one sandbox may use: `sandbox` (what it asked for) and `operator` (the daemon's
/// bounds, which also decide which special-use addresses are reachable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EgressPolicy {
    pub(crate) sandbox: Allowlist,
    pub(crate) operator: Allowlist,
}

/// Why one proxied connection is refused by the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denial {
    /// No sandbox rule names the target.
    NotAllowed { host: Host, port: u16 },
    /// The target is, or resolved to, a special-use address no operator rule allows.
    Address {
        host: Host,
        addr: SocketAddr,
        kind: SpecialUse,
    },
}

impl EgressPolicy {
    /// The policy for a sandbox that asked for `requested`: each must parse, use no
    /// operator-only syntax, and be covered by `operator`. No rules: no network.
    pub(crate) fn new(
        requested: &[String],
        operator: &Allowlist,
    ) -> Result<EgressPolicy, PolicyError> {
        let sandbox = Allowlist::parse(requested)?;
        for rule in sandbox.rules() {
            check_requested(rule, operator)?;
        }
        Ok(EgressPolicy {
            sandbox,
            operator: operator.clone(),
        })
    }

    /// Whether the sandbox has any egress at all.
    pub(crate) fn has_network(&self) -> bool {
        !self.sandbox.is_empty()
    }

    /// The first check, before resolving: does a sandbox rule name `host:port`? (Requested
    /// rules are within the operator's, so this is the operator's check too.)
    pub(crate) fn check_target(&self, host: &Host, port: u16) -> Result<(), Denial> {
        if self.sandbox.permits(host, port) {
            Ok(())
        } else {
            Err(Denial::NotAllowed {
                host: host.clone(),
                port,
            })
        }
    }

    /// The second check, for each address `host` resolved to (or its literal address): a
    /// public address is fine; a special-use one only if an operator rule exempts it, port
    /// included (see [`exempts`]).
    pub(crate) fn check_address(&self, host: &Host, addr: SocketAddr) -> Result<(), Denial> {
        let ip: IpAddr = addr.ip().to_canonical();
        let Some(kind) = special_use(ip) else {
            return Ok(());
        };
        if self
            .operator
            .rules()
            .iter()
            .any(|rule| exempts(rule, ip, addr.port()))
        {
            return Ok(());
        }
        Err(Denial::Address {
            host: host.clone(),
            addr,
            kind,
        })
    }
}

/// Whether operator `rule` opens the special-use address `ip` (canonical) on `port`: an
/// address rule naming it, or a network rule holding it that lies wholly inside special-use
/// space of one kind (`10.0.0.0/8`, `fd00::/8`, `127.0.0.1/32`). A network that also holds
/// public addresses (`0.0.0.0/0`, written to mean "any public address") opens none of the
/// special ones, so loopback and cloud metadata never come with it by accident.
fn exempts(rule: &Rule, ip: IpAddr, port: u16) -> bool {
    if !rule.contains_address(ip, port) {
        return false;
    }
    match &rule.host {
        RuleHost::Network(network) => {
            let kind = special_use(network.first());
            kind.is_some() && kind == special_use(network.last())
        }
        _ => true,
    }
}

fn check_requested(rule: &Rule, operator: &Allowlist) -> Result<(), PolicyError> {
    if rule.is_operator_only() {
        return Err(PolicyError::OperatorOnly {
            rule: rule.to_string(),
        });
    }
    if !operator.covers(rule) {
        return Err(PolicyError::NotCovered {
            rule: rule.to_string(),
            operator: if operator.is_empty() {
                "nothing: egress is off on this daemon".to_string()
            } else {
                operator.to_string()
            },
            hint: port_hint(rule, operator),
        });
    }
    Ok(())
}

/// For a rule without a port (any port) that the operator allows only on some ports: the
/// rules with those ports, which would be allowed (`crates.io` under `*:443,*:80`: ask for
/// `crates.io:443` or `crates.io:80`). Empty otherwise.
fn port_hint(rule: &Rule, operator: &Allowlist) -> String {
    if rule.port.is_some() {
        return String::new();
    }
    let mut ports: Vec<u16> = operator.rules().iter().filter_map(|r| r.port).collect();
    ports.sort_unstable();
    ports.dedup();
    let allowed: Vec<String> = ports
        .into_iter()
        .map(|port| Rule {
            host: rule.host.clone(),
            port: Some(port),
        })
        .filter(|with_port| operator.covers(with_port))
        .map(|with_port| format!("`{with_port}`"))
        .collect();
    match allowed.as_slice() {
        [] => String::new(),
        [one] => format!("; a rule without a port means any port: ask for {one}"),
        many => format!(
            "; a rule without a port means any port: ask for {}",
            many.join(" or ")
        ),
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::NotAllowed { host, port } => write!(f, "{host}:{port} is not allowed"),
            Denial::Address { host, addr, kind } => {
                let ip = addr.ip();
                if matches!(host, Host::Ip(h) if *h == ip.to_canonical()) {
                    write!(f, "{addr} is {kind}")?;
                } else {
                    write!(f, "{host}:{} resolves to {ip}, {kind}", addr.port())?;
                }
                write!(f, ", which the operator has not allowed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator(rules: &str) -> Allowlist {
        rules.parse().expect("operator rules")
    }

    fn requested(rules: &[&str]) -> Vec<String> {
        rules.iter().map(|r| r.to_string()).collect()
    }

    fn host(s: &str) -> Host {
        Host::parse(s).expect("host")
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    #[test]
    fn requested_rules_must_be_covered_by_the_operator() {
        let op = operator("*.pypi.org, crates.io:443, 127.0.0.1:8080");
        let policy = EgressPolicy::new(
            &requested(&["files.pypi.org", "crates.io:443", "127.0.0.1:8080"]),
            &op,
        )
        .expect("covered");
        assert_eq!(
            policy.sandbox.to_string(),
            "files.pypi.org, crates.io:443, 127.0.0.1:8080"
        );
        assert_eq!(
            EgressPolicy::new(&requested(&["crates.io:443", "crates.io"]), &op),
            Err(PolicyError::NotCovered {
                rule: "crates.io".into(),
                operator: op.to_string(),
                hint: "; a rule without a port means any port: ask for `crates.io:443`".into(),
            })
        );
        let web = operator("*:443, *:80");
        let err = EgressPolicy::new(&requested(&["index.crates.io"]), &web)
            .expect_err("any port")
            .to_string();
        assert!(
            err.ends_with("ask for `index.crates.io:80` or `index.crates.io:443`"),
            "{err}"
        );
        assert!(EgressPolicy::new(&requested(&["index.crates.io:443"]), &web).is_ok());
        let err = EgressPolicy::new(&requested(&["example.com:22"]), &web)
            .expect_err("another port")
            .to_string();
        assert!(!err.contains("ask for"), "{err}");
        let err = EgressPolicy::new(&requested(&["example.com"]), &Allowlist::default())
            .expect_err("egress off");
        assert!(err.to_string().contains("egress is off"), "{err}");
        assert!(EgressPolicy::new(&[], &Allowlist::default()).is_ok());
    }

    #[test]
    fn networks_and_star_are_for_the_operator_only() {
        let op = operator("*, 0.0.0.0/0");
        for rule in ["*", "*:443", "10.0.0.0/8"] {
            assert_eq!(
                EgressPolicy::new(&requested(&[rule]), &op),
                Err(PolicyError::OperatorOnly {
                    rule: rule.parse::<Rule>().expect("rule").to_string()
                })
            );
        }
        assert!(EgressPolicy::new(&requested(&["*.example.org", "10.1.2.3"]), &op).is_ok());
        assert!(matches!(
            EgressPolicy::new(&requested(&["http://x.org"]), &op),
            Err(PolicyError::Rule(RuleError::Url { .. }))
        ));
    }

    #[test]
    fn targets_are_checked_against_the_sandbox_rules() {
        let policy =
            EgressPolicy::new(&requested(&["crates.io:443"]), &operator("*")).expect("policy");
        assert!(policy.check_target(&host("crates.io"), 443).is_ok());
        // The operator allows any name, but the sandbox asked for one.
        assert_eq!(
            policy.check_target(&host("example.com"), 443),
            Err(Denial::NotAllowed {
                host: host("example.com"),
                port: 443
            })
        );
        assert!(!EgressPolicy::default().has_network());
    }

    #[test]
    fn special_addresses_need_an_operator_address_rule_with_the_port() {
        let policy = EgressPolicy::new(
            &requested(&["mirror.internal"]),
            &operator("mirror.internal, 127.0.0.1:8080, 10.0.0.0/8:443"),
        )
        .expect("policy");
        let mirror = host("mirror.internal");
        assert!(policy.check_address(&mirror, addr("1.1.1.1:80")).is_ok());
        assert!(policy
            .check_address(&mirror, addr("127.0.0.1:8080"))
            .is_ok());
        assert!(policy
            .check_address(&mirror, addr("[::ffff:127.0.0.1]:8080"))
            .is_ok());
        assert!(policy.check_address(&mirror, addr("10.9.8.7:443")).is_ok());
        let refused = policy
            .check_address(&mirror, addr("127.0.0.1:22"))
            .expect_err("another port");
        assert_eq!(
            refused.to_string(),
            "mirror.internal:22 resolves to 127.0.0.1, a loopback address, which the \
             operator has not allowed"
        );
        for other in [
            "127.0.0.2:8080",
            "10.9.8.7:80",
            "[::1]:8080",
            "[64:ff9b::7f00:1]:8080",
            "169.254.169.254:80",
        ] {
            assert!(
                policy.check_address(&mirror, addr(other)).is_err(),
                "{other}"
            );
        }
        let wide = EgressPolicy::new(
            &requested(&["10.1.2.3:22", "8.8.8.8:53", "[fd00::1]:22"]),
            &operator("0.0.0.0/0, ::/0, 10.0.0.0/16:22, fd00::/8, 126.0.0.0/7"),
        )
        .expect("policy");
        assert!(wide
            .check_address(&host("8.8.8.8"), addr("8.8.8.8:53"))
            .is_ok());
        assert!(wide
            .check_address(&host("10.0.9.9"), addr("10.0.9.9:22"))
            .is_ok());
        assert!(wide
            .check_address(&host("fd00::1"), addr("[fd00::1]:22"))
            .is_ok());
        // Networks holding public addresses too open no special-use address.
        for special in [
            "127.0.0.1:22",
            "169.254.169.254:80",
            "10.1.2.3:22",
            "0.0.0.0:22",
            "[::1]:22",
            "[fe80::1]:22",
        ] {
            let a = addr(special);
            assert!(
                wide.check_address(&host("x.test"), a).is_err(),
                "{special} opened by a wide network"
            );
        }
        let literal = policy
            .check_address(&host("10.0.0.1"), addr("10.0.0.1:22"))
            .expect_err("literal private address");
        assert_eq!(
            literal.to_string(),
            "10.0.0.1:22 is a private address, which the operator has not allowed"
        );
    }
}
