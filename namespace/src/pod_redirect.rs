//! A microVM pod's inbound TCP: the VM has no network device in the pod's network namespace,
//! so every TCP connection that arrives there — at the pod's IP (from the node, other pods,
//! CNI's port mappings) or at its `127.0.0.1` (containerd's `crictl port-forward` dials
//! `localhost:PORT` inside the namespace) — is redirected (`nat` `REDIRECT`) to one port where
//! the daemon listens, in that namespace; the daemon reads the port asked for
//! (`SO_ORIGINAL_DST`) and has the VM's agent connect to it. Two rules, put first in their
//! chains and taken out when the sandbox ends:
//!
//! - `PREROUTING -p tcp -j REDIRECT --to-ports PORT`: what arrives from outside (a pod's
//!   namespace forwards nothing: every packet that arrives is for the pod);
//! - `OUTPUT -p tcp -o lo -j REDIRECT --to-ports PORT`: what the namespace itself sends to its
//!   own addresses (port-forward, and the pod's own egress to its IP or loopback).
//!
//! UDP and IPv6 are not carried.

use std::process::Command;

use crate::netns::PodSockets;

/// Why the redirect could not be put in place or taken out.
#[derive(Debug, thiserror::Error)]
pub enum PodRedirectError {
    /// `iptables` is not installed.
    #[error(
        "pod network {path}: iptables is not on PATH or in /usr/sbin, /sbin (install iptables)"
    )]
    NoIptables {
        /// The pod's namespace.
        path: String,
    },
    /// A rule could not be changed.
    #[error("pod network {path}: iptables {args}: {why}")]
    Rule {
        /// The pod's namespace.
        path: String,
        /// The arguments.
        args: String,
        /// Why (the tool's own message, or the system's).
        why: String,
    },
}

/// The two rules' matches, each with its chain.
fn rules(port: u16) -> [Vec<String>; 2] {
    let port = port.to_string();
    let rule = |matches: &[&str]| -> Vec<String> {
        matches
            .iter()
            .chain(&["-j", "REDIRECT", "--to-ports", port.as_str()])
            .map(|s| s.to_string())
            .collect()
    };
    [
        rule(&["PREROUTING", "-p", "tcp"]),
        rule(&["OUTPUT", "-p", "tcp", "-o", "lo"]),
    ]
}

/// Redirects the pod's inbound TCP to `port` (where the caller listens, in the pod's
/// namespace), ahead of whatever rules the namespace has. On failure nothing is left.
pub fn install(pod: &PodSockets, port: u16) -> Result<(), PodRedirectError> {
    let [prerouting, output] = rules(port);
    iptables(pod, "-I", &prerouting)?;
    if let Err(e) = iptables(pod, "-I", &output) {
        let _ = iptables(pod, "-D", &prerouting);
        return Err(e);
    }
    Ok(())
}

/// Takes out what [`install`] put in for `port`; both rules are tried.
pub fn remove(pod: &PodSockets, port: u16) -> Result<(), PodRedirectError> {
    let [prerouting, output] = rules(port);
    let first = iptables(pod, "-D", &prerouting);
    let second = iptables(pod, "-D", &output);
    first.and(second)
}

fn iptables(pod: &PodSockets, verb: &str, rule: &[String]) -> Result<(), PodRedirectError> {
    let path = pod.path().display().to_string();
    let program = crate::pod_link::find_tool("iptables")
        .ok_or_else(|| PodRedirectError::NoIptables { path: path.clone() })?;
    // A bounded wait for the xtables lock: never a daemon task hung on another holder.
    let mut args = vec!["-w", "5", "-t", "nat", verb];
    args.extend(rule.iter().map(String::as_str));
    let fail = |why: String| PodRedirectError::Rule {
        path: path.clone(),
        args: args.join(" "),
        why,
    };
    let out = pod
        .run(Command::new(&program).args(&args))
        .map_err(|e| fail(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(fail(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_rules_send_every_tcp_arrival_to_the_port() {
        let [prerouting, output] = rules(40123);
        assert_eq!(
            prerouting.join(" "),
            "PREROUTING -p tcp -j REDIRECT --to-ports 40123"
        );
        assert_eq!(
            output.join(" "),
            "OUTPUT -p tcp -o lo -j REDIRECT --to-ports 40123"
        );
    }
}
