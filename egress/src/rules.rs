//! Allowlist rules: what a sandbox may reach (`crates.io`, `*.pypi.org:443`, `10.1.2.3:8080`)
//! and the operator's bounds on that (which may also use CIDR networks and `*`).
//!
//! Host names are compared lowercased without a trailing dot. `*.pypi.org` matches every name
//! below `pypi.org` at any depth (`files.pypi.org`, `a.b.pypi.org`) but **not** `pypi.org`
//! itself: list both when both are wanted. Name rules never match IP literals, and address
//! rules never match names; what a name resolves to is checked separately (see
//! [`super::address`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The longest host name DNS can carry, without its trailing dot.
const MAX_NAME_LEN: usize = 253;
/// The longest label of a host name.
const MAX_LABEL_LEN: usize = 63;

/// Why a rule or a request target does not parse; each names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("an egress rule is empty")]
    Empty,
    #[error("egress rule {rule:?} is a URL; write only the host (and an optional :port), e.g. \"crates.io:443\"")]
    Url { rule: String },
    #[error(
        "egress rule {rule:?} has an invalid port {port:?}: a port is a number from 1 to 65535"
    )]
    BadPort { rule: String, port: String },
    #[error("egress rule {rule:?} has the character {found:?}, which no host name may contain")]
    BadChar { rule: String, found: char },
    #[error("egress rule {rule:?} has a `*` that is not the whole first label: write `*.example.org` or `*`")]
    MisplacedWildcard { rule: String },
    #[error("egress rule {rule:?} is a wildcard without a domain: write `*.example.org`")]
    WildcardWithoutDomain { rule: String },
    #[error("egress rule {rule:?} has an empty label (two dots in a row, or a leading dot)")]
    EmptyLabel { rule: String },
    #[error(
        "egress rule {rule:?} has the label {label:?} of {len} characters; at most 63 are allowed"
    )]
    LabelTooLong {
        rule: String,
        label: String,
        len: usize,
    },
    #[error("egress rule {rule:?} has the label {label:?}, which starts or ends with a hyphen")]
    HyphenAtLabelEdge { rule: String, label: String },
    #[error("egress rule {rule:?} is a name of {len} characters; at most 253 are allowed")]
    NameTooLong { rule: String, len: usize },
    #[error("egress rule {rule:?} ends in a number but is not an IP address (write the address in full, e.g. 127.0.0.1)")]
    NumericName { rule: String },
    #[error("egress rule {rule:?} is not a valid network: {reason}")]
    BadNetwork { rule: String, reason: String },
    #[error("egress rule {rule:?} has an unclosed or misplaced `[`/`]` around an IPv6 address")]
    BadBrackets { rule: String },
}

/// A parsed request target host: a host name (lowercase, no trailing dot) or an IP address.
/// IPv4-mapped IPv6 addresses are held as the IPv4 address they carry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Host {
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// Parses a bare host: a name, an IPv4 address, or an IPv6 address with or without
    /// brackets. No port.
    pub(crate) fn parse(host: &str) -> Result<Host, RuleError> {
        if let Some(inner) = host.strip_prefix('[') {
            // Brackets hold only IPv6 addresses.
            return inner
                .strip_suffix(']')
                .and_then(|inner| inner.parse::<Ipv6Addr>().ok())
                .map(|ip| Host::Ip(IpAddr::V6(ip).to_canonical()))
                .ok_or_else(|| RuleError::BadBrackets {
                    rule: host.to_string(),
                });
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Host::Ip(ip.to_canonical()));
        }
        parse_name(host, host).map(Host::Name)
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
        }
    }
}

impl FromStr for Host {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Host, RuleError> {
        Host::parse(s)
    }
}

/// An IP network (`10.0.0.0/8`, `fc00::/7`): its address has no bits set past the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct IpNetwork {
    addr: IpAddr,
    prefix: u8,
}

impl IpNetwork {
    /// The network `addr/prefix`; `None` if the prefix is too long for the family or `addr`
    /// has host bits set.
    pub(crate) fn new(addr: IpAddr, prefix: u8) -> Option<IpNetwork> {
        let network = IpNetwork { addr, prefix };
        (prefix <= network.max_prefix() && network.contains(addr) && network.first() == addr)
            .then_some(network)
    }

    #[cfg(test)]
    pub(crate) fn addr(&self) -> IpAddr {
        self.addr
    }

    #[cfg(test)]
    pub(crate) fn prefix(&self) -> u8 {
        self.prefix
    }

    fn max_prefix(&self) -> u8 {
        match self.addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        }
    }

    /// The lowest address of the network (`addr` with the host bits cleared).
    pub(crate) fn first(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask32(self.prefix))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask128(self.prefix))),
        }
    }

    /// Whether `ip` is inside the network (families never mix: an IPv4-mapped IPv6 address
    /// is expected in its canonical IPv4 form).
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = mask32(self.prefix);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask128(self.prefix);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }

    /// The highest address of the network.
    pub(crate) fn last(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) | !mask32(self.prefix))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) | !mask128(self.prefix))),
        }
    }

    /// Whether every address of `other` is inside this network.
    pub(crate) fn contains_network(&self, other: &IpNetwork) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }
}

impl fmt::Display for IpNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(prefix.min(128)))
        .unwrap_or(0)
}

/// What hosts a rule names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum RuleHost {
    /// Exactly this name.
    Name(String),
    /// Every name below this domain, at any depth, not the domain itself (`*.pypi.org`).
    Subdomains(String),
    /// Any host name, no IP literal (`*`). Operator rules only.
    AnyName,
    /// Exactly this address (canonical: an IPv4-mapped IPv6 address is held as IPv4).
    Address(IpAddr),
    /// Every address in this network. Operator rules only.
    Network(IpNetwork),
}

/// One allowlist entry: hosts, and one port or any port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Rule {
    pub(crate) host: RuleHost,
    /// `None`: any port.
    pub(crate) port: Option<u16>,
}

impl Rule {
    /// Whether this rule uses syntax only the operator may use (a network or `*`).
    pub(crate) fn is_operator_only(&self) -> bool {
        matches!(self.host, RuleHost::AnyName | RuleHost::Network(_))
    }

    /// Whether `host:port` is one of the targets this rule names.
    pub(crate) fn matches(&self, host: &Host, port: u16) -> bool {
        self.port.is_none_or(|p| p == port) && self.matches_host(host)
    }

    fn matches_host(&self, host: &Host) -> bool {
        match (&self.host, host) {
            (RuleHost::Name(rule), Host::Name(name)) => rule == name,
            (RuleHost::Subdomains(domain), Host::Name(name)) => is_below(name, domain),
            (RuleHost::AnyName, Host::Name(_)) => true,
            (RuleHost::Address(rule), Host::Ip(ip)) => rule == &ip.to_canonical(),
            (RuleHost::Network(net), Host::Ip(ip)) => net.contains(ip.to_canonical()),
            _ => false,
        }
    }

    /// Whether every `host:port` that `requested` matches, this rule matches too.
    pub(crate) fn covers(&self, requested: &Rule) -> bool {
        let ports = match (self.port, requested.port) {
            (None, _) => true,
            (Some(mine), Some(theirs)) => mine == theirs,
            (Some(_), None) => false,
        };
        ports
            && match (&self.host, &requested.host) {
                (RuleHost::AnyName, RuleHost::Name(_) | RuleHost::Subdomains(_))
                | (RuleHost::AnyName, RuleHost::AnyName) => true,
                (RuleHost::Name(mine), RuleHost::Name(theirs)) => mine == theirs,
                (RuleHost::Subdomains(mine), RuleHost::Name(theirs)) => is_below(theirs, mine),
                (RuleHost::Subdomains(mine), RuleHost::Subdomains(theirs)) => {
                    mine == theirs || is_below(theirs, mine)
                }
                (RuleHost::Address(mine), RuleHost::Address(theirs)) => mine == theirs,
                (RuleHost::Network(mine), RuleHost::Address(theirs)) => mine.contains(*theirs),
                (RuleHost::Network(mine), RuleHost::Network(theirs)) => {
                    mine.contains_network(theirs)
                }
                (RuleHost::Address(mine), RuleHost::Network(theirs)) => {
                    theirs.prefix == theirs.max_prefix() && theirs.addr == *mine
                }
                _ => false,
            }
    }

    /// Whether this is an address or network rule holding `ip` (canonical form) and `port`.
    pub(crate) fn contains_address(&self, ip: IpAddr, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
            && match &self.host {
                RuleHost::Address(rule) => *rule == ip.to_canonical(),
                RuleHost::Network(net) => net.contains(ip.to_canonical()),
                _ => false,
            }
    }
}

/// Whether `name` is strictly below `domain` (`a.b.x` below `x`; `x` is not below `x`).
fn is_below(name: &str, domain: &str) -> bool {
    name.strip_suffix(domain)
        .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(input: &str) -> Result<Rule, RuleError> {
        let rule = input.trim();
        if rule.is_empty() {
            return Err(RuleError::Empty);
        }
        if rule.contains("://") {
            return Err(RuleError::Url {
                rule: rule.to_string(),
            });
        }
        let split = split_host_port(rule)?;
        if split.port.is_some_and(|port| port.contains('/')) {
            return Err(RuleError::Url {
                rule: rule.to_string(),
            });
        }
        let port = split.port.map(|p| parse_port(rule, p)).transpose()?;
        if split.bracketed && !split.host.contains(':') {
            // Brackets hold only IPv6 addresses and networks.
            return Err(RuleError::BadBrackets {
                rule: rule.to_string(),
            });
        }
        let host = parse_rule_host(rule, split.host)?;
        Ok(Rule { host, port })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v6 = matches!(
            self.host,
            RuleHost::Address(IpAddr::V6(_))
                | RuleHost::Network(IpNetwork {
                    addr: IpAddr::V6(_),
                    ..
                })
        );
        let bracket = v6 && self.port.is_some();
        if bracket {
            f.write_str("[")?;
        }
        match &self.host {
            RuleHost::Name(name) => f.write_str(name)?,
            RuleHost::Subdomains(domain) => write!(f, "*.{domain}")?,
            RuleHost::AnyName => f.write_str("*")?,
            RuleHost::Address(ip) => write!(f, "{ip}")?,
            RuleHost::Network(net) => write!(f, "{net}")?,
        }
        if bracket {
            f.write_str("]")?;
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// A `host[:port]` split: the host without brackets, whether it had them, and the port text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostPort<'a> {
    pub(crate) host: &'a str,
    pub(crate) bracketed: bool,
    pub(crate) port: Option<&'a str>,
}

/// Splits `host[:port]`, where an IPv6 host is bracketed when a port follows (`[::1]:443`) and
/// may be bare without one (`::1`, `fc00::/7`).
pub(crate) fn split_host_port(input: &str) -> Result<HostPort<'_>, RuleError> {
    let bad_brackets = || RuleError::BadBrackets {
        rule: input.to_string(),
    };
    if let Some(rest) = input.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad_brackets)?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(bad_brackets)?),
        };
        return Ok(HostPort {
            host,
            bracketed: true,
            port,
        });
    }
    if input.contains(['[', ']']) {
        return Err(bad_brackets());
    }
    let (host, port) = match input.split_once(':') {
        // Several colons: a bare IPv6 address or network, which cannot carry a port.
        Some((host, port)) if !port.contains(':') => (host, Some(port)),
        _ => (input, None),
    };
    Ok(HostPort {
        host,
        bracketed: false,
        port,
    })
}

pub(crate) fn parse_port(input: &str, port: &str) -> Result<u16, RuleError> {
    let bad = || RuleError::BadPort {
        rule: input.to_string(),
        port: port.to_string(),
    };
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad()),
        Ok(p) => Ok(p),
    }
}

fn parse_rule_host(rule: &str, host: &str) -> Result<RuleHost, RuleError> {
    if host == "*" {
        return Ok(RuleHost::AnyName);
    }
    if let Some(domain) = host.strip_prefix("*.") {
        if domain.is_empty() {
            return Err(RuleError::WildcardWithoutDomain {
                rule: rule.to_string(),
            });
        }
        if domain.contains('*') {
            return Err(RuleError::MisplacedWildcard {
                rule: rule.to_string(),
            });
        }
        return parse_name(rule, domain).map(RuleHost::Subdomains);
    }
    if host.contains('*') {
        return Err(RuleError::MisplacedWildcard {
            rule: rule.to_string(),
        });
    }
    if let Some((addr, prefix)) = host.split_once('/') {
        let Ok(addr) = addr.parse::<IpAddr>() else {
            // `example.org/path`: somebody pasted a URL without its scheme.
            return Err(RuleError::Url {
                rule: rule.to_string(),
            });
        };
        return parse_network(rule, addr, prefix).map(RuleHost::Network);
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(RuleHost::Address(ip.to_canonical()));
    }
    parse_name(rule, host).map(RuleHost::Name)
}

fn parse_network(rule: &str, addr: IpAddr, prefix: &str) -> Result<IpNetwork, RuleError> {
    let bad = |reason: String| RuleError::BadNetwork {
        rule: rule.to_string(),
        reason,
    };
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(format!("the prefix length {prefix:?} is not a number")));
    }
    let prefix: u8 = prefix
        .parse()
        .map_err(|_| bad(format!("the prefix length {prefix} is too long")))?;
    let network = IpNetwork::new(addr, prefix).ok_or_else(|| {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            bad(format!("the prefix length {prefix} is longer than {max}"))
        } else {
            let first = IpNetwork { addr, prefix }.first();
            bad(format!(
                "{addr} has bits set past the /{prefix} prefix; the network is {first}/{prefix}"
            ))
        }
    })?;
    Ok(canonical_network(network))
}

/// An IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) as the IPv4 network it maps.
fn canonical_network(network: IpNetwork) -> IpNetwork {
    match network.addr {
        IpAddr::V6(v6) if network.prefix >= 96 => match v6.to_ipv4_mapped() {
            Some(v4) => IpNetwork {
                addr: IpAddr::V4(v4),
                prefix: network.prefix - 96,
            },
            None => network,
        },
        _ => network,
    }
}

/// Validates a host name (`input` is the whole rule, for errors) and returns it lowercased
/// without a trailing dot.
fn parse_name(input: &str, name: &str) -> Result<String, RuleError> {
    let err_rule = || input.to_string();
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err(RuleError::EmptyLabel { rule: err_rule() });
    }
    if let Some(found) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        if matches!(found, '/' | '?' | '#' | '@') {
            return Err(RuleError::Url { rule: err_rule() });
        }
        return Err(RuleError::BadChar {
            rule: err_rule(),
            found,
        });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(RuleError::NameTooLong {
            rule: err_rule(),
            len: name.len(),
        });
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(RuleError::EmptyLabel { rule: err_rule() });
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(RuleError::LabelTooLong {
                rule: err_rule(),
                label: label.to_string(),
                len: label.len(),
            });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(RuleError::HyphenAtLabelEdge {
                rule: err_rule(),
                label: label.to_string(),
            });
        }
    }
    // A name ending in a number is read as an IPv4 address by resolvers (`127.1`, `0x7f.1`):
    // refuse it rather than let it mean an address the rule does not show.
    let last = name.rsplit('.').next().unwrap_or(name);
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || (last.len() > 2
            && last[..2].eq_ignore_ascii_case("0x")
            && last[2..].bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        return Err(RuleError::NumericName { rule: err_rule() });
    }
    Ok(name.to_ascii_lowercase())
}

/// An ordered list of rules; empty means nothing is allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Allowlist {
    rules: Vec<Rule>,
}

impl Allowlist {
    pub(crate) fn new(rules: Vec<Rule>) -> Allowlist {
        Allowlist { rules }
    }

    /// Parses one rule per string.
    pub(crate) fn parse(rules: &[String]) -> Result<Allowlist, RuleError> {
        rules
            .iter()
            .map(|rule| rule.parse())
            .collect::<Result<_, _>>()
            .map(Allowlist::new)
    }

    pub(crate) fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether some rule names `host:port`.
    pub(crate) fn permits(&self, host: &Host, port: u16) -> bool {
        self.rules.iter().any(|rule| rule.matches(host, port))
    }

    /// Whether every `host:port` that `requested` matches is matched by one of these rules.
    /// Coverage is decided rule by rule: a requested port-less rule is not covered by
    /// operator rules that list ports one by one.
    pub(crate) fn covers(&self, requested: &Rule) -> bool {
        self.rules.iter().any(|rule| rule.covers(requested))
    }
}

impl FromStr for Allowlist {
    type Err = RuleError;

    /// Comma-separated rules (`crates.io, *.pypi.org:443`); an empty or blank string is the
    /// empty list.
    fn from_str(s: &str) -> Result<Allowlist, RuleError> {
        if s.trim().is_empty() {
            return Ok(Allowlist::default());
        }
        s.split(',')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map(Allowlist::new)
    }
}

impl fmt::Display for Allowlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rule) in self.rules.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{rule}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        s.parse()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn name(s: &str) -> Host {
        Host::Name(s.to_string())
    }

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().expect("test address"))
    }

    #[test]
    fn rules_display_in_canonical_form_and_round_trip() {
        for (input, shown) in [
            ("crates.io", "crates.io"),
            ("Crates.IO.", "crates.io"),
            ("  static.example.org:443 ", "static.example.org:443"),
            ("*.pypi.org", "*.pypi.org"),
            ("*.PyPI.org.:443", "*.pypi.org:443"),
            ("*", "*"),
            ("*:443", "*:443"),
            ("10.1.2.3:8080", "10.1.2.3:8080"),
            ("10.1.2.3", "10.1.2.3"),
            ("[::1]:443", "[::1]:443"),
            ("::1", "::1"),
            ("[::1]", "::1"),
            ("::ffff:127.0.0.1", "127.0.0.1"),
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.0.0.0/8:443", "10.0.0.0/8:443"),
            ("fc00::/7", "fc00::/7"),
            ("[fc00::/7]:443", "[fc00::/7]:443"),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("_acme.example.org", "_acme.example.org"),
            ("localhost:65535", "localhost:65535"),
        ] {
            let parsed = rule(input);
            assert_eq!(parsed.to_string(), shown, "display of {input:?}");
            assert_eq!(rule(shown), parsed, "round trip of {input:?}");
        }
    }

    #[test]
    fn rules_parse_into_the_right_shapes() {
        assert_eq!(
            rule("crates.io"),
            Rule {
                host: RuleHost::Name("crates.io".into()),
                port: None
            }
        );
        assert_eq!(
            rule("*.pypi.org:443"),
            Rule {
                host: RuleHost::Subdomains("pypi.org".into()),
                port: Some(443)
            }
        );
        assert_eq!(rule("*:443").host, RuleHost::AnyName);
        assert_eq!(
            rule("[::1]:443").host,
            RuleHost::Address("::1".parse().expect("address"))
        );
        let RuleHost::Network(net) = rule("10.0.0.0/8:443").host else {
            panic!("a network rule");
        };
        assert_eq!(
            (net.addr(), net.prefix()),
            ("10.0.0.0".parse().expect("a"), 8)
        );
        assert!(rule("*").is_operator_only() && rule("10.0.0.0/8").is_operator_only());
        assert!(!rule("*.x.org").is_operator_only() && !rule("10.0.0.1").is_operator_only());
    }

    #[test]
    fn bad_rules_are_refused_with_an_error_naming_them() {
        let long_label = format!("{}.org", "a".repeat(64));
        let long_name = format!("{}.org", vec!["a".repeat(60); 5].join("."));
        for (input, expected) in [
            ("", RuleError::Empty),
            ("   ", RuleError::Empty),
            (
                "crates.io:0",
                RuleError::BadPort {
                    rule: "crates.io:0".into(),
                    port: "0".into(),
                },
            ),
            (
                "crates.io:65536",
                RuleError::BadPort {
                    rule: "crates.io:65536".into(),
                    port: "65536".into(),
                },
            ),
            (
                "crates.io:",
                RuleError::BadPort {
                    rule: "crates.io:".into(),
                    port: "".into(),
                },
            ),
            (
                "crates.io:+443",
                RuleError::BadPort {
                    rule: "crates.io:+443".into(),
                    port: "+443".into(),
                },
            ),
            (
                "https://crates.io",
                RuleError::Url {
                    rule: "https://crates.io".into(),
                },
            ),
            (
                "crates.io/api/v1",
                RuleError::Url {
                    rule: "crates.io/api/v1".into(),
                },
            ),
            (
                "cra tes.io",
                RuleError::BadChar {
                    rule: "cra tes.io".into(),
                    found: ' ',
                },
            ),
            (
                "crätes.io",
                RuleError::BadChar {
                    rule: "crätes.io".into(),
                    found: 'ä',
                },
            ),
            (
                "a.*.org",
                RuleError::MisplacedWildcard {
                    rule: "a.*.org".into(),
                },
            ),
            (
                "*pypi.org",
                RuleError::MisplacedWildcard {
                    rule: "*pypi.org".into(),
                },
            ),
            (
                "*.*.org",
                RuleError::MisplacedWildcard {
                    rule: "*.*.org".into(),
                },
            ),
            ("*.", RuleError::WildcardWithoutDomain { rule: "*.".into() }),
            (
                "a..org",
                RuleError::EmptyLabel {
                    rule: "a..org".into(),
                },
            ),
            (
                ".org",
                RuleError::EmptyLabel {
                    rule: ".org".into(),
                },
            ),
            (
                "-a.org",
                RuleError::HyphenAtLabelEdge {
                    rule: "-a.org".into(),
                    label: "-a".into(),
                },
            ),
            (
                "127.1",
                RuleError::NumericName {
                    rule: "127.1".into(),
                },
            ),
            (
                "0x7f.1",
                RuleError::NumericName {
                    rule: "0x7f.1".into(),
                },
            ),
            (
                "10.0.0.1/8",
                RuleError::BadNetwork {
                    rule: "10.0.0.1/8".into(),
                    reason: "10.0.0.1 has bits set past the /8 prefix; the network is 10.0.0.0/8"
                        .into(),
                },
            ),
            (
                "10.0.0.0/33",
                RuleError::BadNetwork {
                    rule: "10.0.0.0/33".into(),
                    reason: "the prefix length 33 is longer than 32".into(),
                },
            ),
            (
                "[::1:443",
                RuleError::BadBrackets {
                    rule: "[::1:443".into(),
                },
            ),
            (
                "[crates.io]:443",
                RuleError::BadBrackets {
                    rule: "[crates.io]:443".into(),
                },
            ),
            (
                "[10.0.0.1]:443",
                RuleError::BadBrackets {
                    rule: "[10.0.0.1]:443".into(),
                },
            ),
            (
                "crates.io:443/index",
                RuleError::Url {
                    rule: "crates.io:443/index".into(),
                },
            ),
        ] {
            assert_eq!(input.parse::<Rule>(), Err(expected), "for {input:?}");
        }
        let err = long_label.parse::<Rule>().expect_err("label too long");
        assert!(
            matches!(err, RuleError::LabelTooLong { len: 64, .. }),
            "{err}"
        );
        assert!(err.to_string().contains(&long_label), "{err}");
        let err = long_name.parse::<Rule>().expect_err("name too long");
        assert!(matches!(err, RuleError::NameTooLong { .. }), "{err}");
        // Every message names what was refused.
        let err = "crates.io:99999".parse::<Rule>().expect_err("bad port");
        assert!(err.to_string().contains("\"crates.io:99999\""), "{err}");
    }

    #[test]
    fn names_match_exactly_and_case_insensitively() {
        let r = rule("Crates.io");
        assert!(r.matches(&Host::parse("crates.io").expect("host"), 443));
        assert!(r.matches(&Host::parse("CRATES.IO.").expect("host"), 80));
        assert!(!r.matches(&name("static.crates.io"), 443));
        assert!(!r.matches(&name("crates.io.evil.org"), 443));
        assert!(!r.matches(&name("evilcrates.io"), 443));
        let with_port = rule("crates.io:443");
        assert!(with_port.matches(&name("crates.io"), 443));
        assert!(!with_port.matches(&name("crates.io"), 80));
    }

    #[test]
    fn a_wildcard_matches_subdomains_at_any_depth_but_not_the_domain_itself() {
        let r = rule("*.pypi.org");
        assert!(r.matches(&name("files.pypi.org"), 443));
        assert!(r.matches(&name("a.b.c.pypi.org"), 443));
        assert!(!r.matches(&name("pypi.org"), 443));
        assert!(!r.matches(&name("evilpypi.org"), 443));
        assert!(!r.matches(&name("pypi.org.evil.net"), 443));
        assert!(!r.matches(&ip("151.101.0.223"), 443));
        let any = rule("*:443");
        assert!(any.matches(&name("anything.example"), 443));
        assert!(!any.matches(&name("anything.example"), 80));
        // `*` is any name, never an address.
        assert!(!any.matches(&ip("1.1.1.1"), 443));
    }

    #[test]
    fn address_rules_match_addresses_in_canonical_form() {
        assert!(rule("127.0.0.1:8080").matches(&ip("127.0.0.1"), 8080));
        assert!(rule("127.0.0.1:8080").matches(&ip("::ffff:127.0.0.1"), 8080));
        assert!(!rule("127.0.0.1:8080").matches(&ip("127.0.0.2"), 8080));
        assert!(!rule("127.0.0.1:8080").matches(&name("localhost"), 8080));
        assert!(rule("10.0.0.0/8").matches(&ip("10.200.3.4"), 22));
        assert!(!rule("10.0.0.0/8").matches(&ip("11.0.0.0"), 22));
        assert!(rule("fc00::/7").matches(&ip("fd12::1"), 22));
        assert!(!rule("fc00::/7").matches(&ip("fe80::1"), 22));
        assert!(rule("0.0.0.0/0").matches(&ip("8.8.8.8"), 53));
        assert!(!rule("0.0.0.0/0").matches(&ip("::1"), 53));
    }

    #[test]
    fn covers_follows_what_each_rule_matches() {
        let operator: Allowlist = "crates.io, *.pypi.org, *:443, static.example.org:80, \
                                   10.0.0.0/8, 127.0.0.1:8080, [fd00::/8]:443"
            .parse()
            .expect("operator rules");
        for covered in [
            "crates.io",
            "crates.io:22",
            "files.pypi.org",
            "a.b.pypi.org:8443",
            "*.pypi.org",
            "*.cdn.pypi.org:443",
            "anything.example:443",
            "*.example.net:443",
            "static.example.org:80",
            "10.1.2.3",
            "10.1.2.3:5432",
            "10.128.0.0/9",
            "127.0.0.1:8080",
            "[fd00::1]:443",
            "*:443",
        ] {
            assert!(
                operator.covers(&rule(covered)),
                "{covered} should be covered"
            );
        }
        for uncovered in [
            "pypi.org",
            "static.example.org",
            "static.example.org:81",
            "anything.example",
            "*.example.net",
            "*",
            "127.0.0.1",
            "127.0.0.1:8081",
            "11.0.0.1",
            "0.0.0.0/0",
            "fd00::1",
            "[fd00::1]:80",
            "*.crates.io",
        ] {
            assert!(
                !operator.covers(&rule(uncovered)),
                "{uncovered} should not be covered"
            );
        }
        assert!(rule("10.0.0.1").covers(&rule("10.0.0.1/32")));
        assert!(!rule("10.0.0.1").covers(&rule("10.0.0.0/31")));
        assert!(!Allowlist::default().covers(&rule("crates.io")));
    }

    #[test]
    fn allowlists_parse_and_display_comma_separated() {
        let list =
            Allowlist::parse(&["crates.io".into(), "*.pypi.org:443".into()]).expect("allowlist");
        assert_eq!(list.to_string(), "crates.io, *.pypi.org:443");
        assert_eq!(list.to_string().parse::<Allowlist>(), Ok(list.clone()));
        assert!(list.permits(&name("crates.io"), 443));
        assert!(list.permits(&name("files.pypi.org"), 443));
        assert!(!list.permits(&name("files.pypi.org"), 80));
        assert_eq!("".parse::<Allowlist>(), Ok(Allowlist::default()));
        assert_eq!(
            "crates.io,,x.org".parse::<Allowlist>(),
            Err(RuleError::Empty)
        );
        assert!(Allowlist::parse(&["crates.io".into(), "bad rule".into()]).is_err());
    }

    #[test]
    fn hosts_parse_names_and_addresses() {
        assert_eq!(Host::parse("Example.ORG."), Ok(name("example.org")));
        assert_eq!(Host::parse("[::1]"), Ok(ip("::1")));
        assert_eq!(Host::parse("::ffff:10.0.0.1"), Ok(ip("10.0.0.1")));
        assert_eq!(Host::parse("10.0.0.1"), Ok(ip("10.0.0.1")));
        assert_eq!(ip("::1").to_string(), "[::1]");
        for bad in [
            "",
            "127.1",
            "a b",
            "[example.org]",
            "[10.0.0.1]",
            "[::1",
            "a/b",
            "*.x.org",
            "%2e",
        ] {
            assert!(Host::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn networks_refuse_host_bits_and_long_prefixes() {
        let v4 = |s: &str| s.parse::<IpAddr>().expect("address");
        assert!(IpNetwork::new(v4("10.0.0.0"), 8).is_some());
        assert!(IpNetwork::new(v4("10.0.0.1"), 8).is_none());
        assert!(IpNetwork::new(v4("10.0.0.1"), 33).is_none());
        assert!(IpNetwork::new(v4("0.0.0.0"), 0).is_some());
        assert!(IpNetwork::new(v4("::"), 0).is_some());
        assert!(IpNetwork::new(v4("::1"), 128).is_some());
        assert!(IpNetwork::new(v4("::1"), 129).is_none());
    }
}
