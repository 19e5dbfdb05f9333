//! The egress proxy next to a direct host connection: download throughput over plain HTTP and
//! through a `CONNECT` tunnel, and the time per small request, each taken by the same client
//! binary (the image's static busybox `wget` and `nc`) run by the same shell script twice: on
//! the host straight to the target, and inside a namespace sandbox with network allowed,
//! through `HTTP_PROXY` (the daemon accepts each connection on the proxy's listening socket,
//! which the agent handed it, then connects out and relays). The target is a [`BlobServer`] on the host's 127.0.0.1, named by the operator's
//! rules. Not gated: see [`rows`].

use std::fmt::Display;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use api_types::{BackendKind, CreateSandbox, NetworkInfo, NetworkRequest};
use wire::ExecRequest;

use super::blob_server::{BlobServer, Served};
use super::daemon::InProcess;
use super::host_shell::HostShell;
use super::metrics::{size, Plan};
use super::minimal_proxy::MinimalProxy;
use super::model::{Measurement, Row, Unit};
use super::peers::gib_per_s;

/// The report's section.
const SECTION: &str = "Egress proxy";
/// How long the server may take to count a response its client has already read.
const COUNT_TIMEOUT: Duration = Duration::from_secs(5);
/// The busybox applets the scripts run, linked on the host so its shell finds the image's.
const APPLETS: [&str; 5] = ["sh", "wget", "nc", "seq", "printf"];

/// The report's rows: each figure beside the same client on the host, its ratio taken against
/// it. Not gated: the proxied path is the client, the daemon's relay and the server sharing
/// the machine's cores, so on a 2-core runner its ratio moves with scheduling as much as with
/// our code, and the agent times a command in whole milliseconds; `bench-baseline.json` has no
/// key for them (the gate only checks the keys it has).
pub(crate) fn rows() -> Vec<Row> {
    [
        ("egress_http", Some("floor_direct_http")),
        ("egress_connect", Some("floor_direct_tcp")),
        ("egress_request", Some("floor_direct_request")),
        ("peer_minimal_proxy_request", Some("floor_direct_request")),
        ("egress_added_latency", None),
        ("egress_named_request", Some("floor_direct_named_request")),
    ]
    .into_iter()
    .map(|(metric, direct)| Row {
        section: SECTION.into(),
        metric: metric.into(),
        peers: direct
            .iter()
            .map(|d| d.to_string())
            .chain((metric == "egress_request").then(|| MINIMAL.to_string()))
            .collect(),
        floor: direct.map(String::from),
        gated: false,
    })
    .collect()
}

/// One timed command: the script for each side and what the server must have answered for it.
struct Workload {
    direct: String,
    proxied: String,
    expect: Served,
}

impl Workload {
    /// `downloads` of the blob with `wget` (the proxy's plain-HTTP path).
    fn http(port: impl Display, downloads: usize, blob: u64) -> Self {
        let script = format!(
            "set -e; for i in $(seq {downloads}); do \
             wget -q -O /dev/null http://127.0.0.1:{port}/blob; done"
        );
        Workload {
            direct: script.clone(),
            proxied: script,
            expect: Served {
                responses: downloads as u64,
                body_bytes: downloads as u64 * blob,
            },
        }
    }

    /// `downloads` of the blob as raw bytes with `nc`: straight to the server, or through a
    /// `CONNECT` tunnel opened by hand (as a TLS client opens one); the hello after the head is
    /// what the server answers.
    fn tcp(port: impl Display, downloads: usize, blob: u64) -> Self {
        let proxy = contract::egress::PROXY_PORT;
        let each = |send: &str, to: &dyn Display| {
            format!(
                "set -e; for i in $(seq {downloads}); do \
                 printf '{send}hello\\r\\n\\r\\n' | nc 127.0.0.1 {to} > /dev/null; done"
            )
        };
        Workload {
            direct: each("", &port),
            proxied: each(
                &format!(
                    "CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n"
                ),
                &proxy,
            ),
            expect: Served {
                responses: downloads as u64,
                body_bytes: downloads as u64 * blob,
            },
        }
    }

    /// `requests` sequential requests for one byte by one `wget`, a connection each (busybox
    /// `wget` fetches its URLs one after the other and never keeps a connection alive), so
    /// that no process start-up sits in the loop: per request, it is connect, request, answer
    /// and close.
    fn requests(port: impl Display, requests: usize) -> Self {
        let script = format!(
            "set -e; wget -q -O /dev/null $(for i in $(seq {requests}); do \
             printf 'http://127.0.0.1:{port}/one '; done)"
        );
        Workload {
            direct: script.clone(),
            proxied: script,
            expect: Served {
                responses: requests as u64,
                body_bytes: requests as u64,
            },
        }
    }

    /// The same requests, the proxied ones for a name the daemon's resolver answers slowly
    /// (a package registry's): each is a new connection through the proxy, which looks the
    /// name up once and keeps its answer. The host side connects to the address, as a client
    /// that resolved once (npm's own lookup cache) does.
    fn named_requests(port: impl Display, requests: usize) -> Self {
        let each = |host: &str| {
            format!(
                "set -e; wget -q -O /dev/null $(for i in $(seq {requests}); do \
                 printf 'http://{host}:{port}/one '; done)"
            )
        };
        Workload {
            direct: each("127.0.0.1"),
            proxied: each(REGISTRY_NAME),
            expect: Served {
                responses: requests as u64,
                body_bytes: requests as u64,
            },
        }
    }
}

/// The key of the requests through [`MinimalProxy`].
const MINIMAL: &str = "peer_minimal_proxy_request";

/// The name the named-request workload asks for, which only [`SlowResolver`] knows.
const REGISTRY_NAME: &str = "registry.bench";
/// How long [`SlowResolver`] takes to answer: a resolver a few hops away, or one that is
/// busy (the host's took 5 s for a third of npm's parallel lookups when this was measured).
const SLOW_LOOKUP: Duration = Duration::from_millis(20);

/// The daemon's resolver in this benchmark: [`REGISTRY_NAME`] is the host's 127.0.0.1, after
/// [`SLOW_LOOKUP`]; every other name does not exist.
#[derive(Debug)]
struct SlowResolver;

impl ::egress::Resolve for SlowResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = std::io::Result<Vec<SocketAddr>>> + Send + 'a>,
    > {
        Box::pin(async move {
            tokio::time::sleep(SLOW_LOOKUP).await;
            if host == REGISTRY_NAME {
                Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))])
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{host}: no such name"),
                ))
            }
        })
    }
}

/// The sandbox's egress counters.
async fn network(client: &client::Client, id: &str) -> Result<NetworkInfo> {
    client
        .get(id)
        .await
        .context("GET the egress sandbox")?
        .network
        .context("the egress sandbox reports no network")
}

/// Requires the server to have answered exactly what `expect` says since `before`.
fn check_served(server: &BlobServer, before: Served, expect: Served, side: &str) -> Result<()> {
    let got = server
        .wait_for(before.responses + expect.responses, COUNT_TIMEOUT)?
        .since(before);
    ensure!(
        got == expect,
        "{side}: the host server answered {got:?} in full, expected {expect:?}"
    );
    Ok(())
}

/// Runs one workload on the host, then through the proxy; (direct ms, proxied ms).
async fn run_pair(
    client: &client::Client,
    id: &str,
    host: &HostShell,
    server: &BlobServer,
    w: &Workload,
) -> Result<(f64, f64)> {
    let before = server.served()?;
    let direct = {
        let (host, script) = (host.clone(), w.direct.clone());
        tokio::task::spawn_blocking(move || host.run_whole_ms(&script))
            .await
            .context("the host command's thread")??
    };
    check_served(server, before, w.expect, "direct")?;

    let before = server.served()?;
    let counters = network(client, id).await?;
    let out = client
        .exec_collect(id, &ExecRequest::new(["sh", "-c", &w.proxied]))
        .await
        .with_context(|| format!("exec sh -c {:?}", w.proxied))?;
    ensure!(
        out.result.exit_code == 0,
        "`sh -c {:?}` in the sandbox exited {} ({}): {}",
        w.proxied,
        out.result.exit_code,
        out.result.error,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    check_served(server, before, w.expect, "through the proxy")?;
    let relayed = network(client, id)
        .await?
        .connections
        .saturating_sub(counters.connections);
    ensure!(
        relayed == w.expect.responses,
        "the proxy relayed {relayed} connections for {} requests",
        w.expect.responses
    );
    Ok((direct, out.result.duration_ms as f64))
}

/// Downloads and requests, direct and proxied, interleaved run by run so both sides see the
/// same machine; the first run warms up.
pub(crate) async fn measure(plan: &Plan, image: &Path) -> Result<Vec<Measurement>> {
    let server = BlobServer::start(plan.egress_blob_bytes)?;
    let target = format!("127.0.0.1:{}", server.port());
    let named = format!("{REGISTRY_NAME}:{}", server.port());
    let d = InProcess::start_with(image, |c| {
        // The address rule lets the name's answer (a loopback address) through.
        c.egress_allow = vec![target.clone(), named.clone()];
        c.egress_resolver = Some(std::sync::Arc::new(SlowResolver));
    })?;
    let client = d.client();
    let info = client
        .create(&CreateSandbox {
            backend: Some(BackendKind::Namespace),
            network: Some(NetworkRequest {
                allow: vec![target.clone(), named.clone()],
            }),
            ..Default::default()
        })
        .await
        .context("create a sandbox allowed to reach the host server")?;
    let id = info.id.clone();
    let proxy = network(&client, &id).await?.proxy;
    ensure!(
        proxy == contract::egress::proxy_url(),
        "the sandbox's proxy is {proxy}"
    );
    let host = HostShell::new(&image.join("rootfs/bin/busybox"), &APPLETS)?;

    let (port, n, blob, k) = (
        server.port(),
        plan.egress_downloads,
        plan.egress_blob_bytes,
        plan.egress_requests,
    );
    let workloads = [
        Workload::http(port, n, blob),
        Workload::tcp(port, n, blob),
        Workload::requests(port, k),
        Workload::named_requests(port, k),
    ];
    let minimal = MinimalProxy::start(SocketAddr::from(([127, 0, 0, 1], port)))?;
    let through_minimal = format!(
        "export http_proxy={}; {}",
        minimal.url(),
        workloads[2].direct
    );
    let mut times: [(Vec<f64>, Vec<f64>); 4] = Default::default();
    let mut minimal_times = Vec::new();
    for run in 0..=plan.runs {
        for (w, (direct, proxied)) in workloads.iter().zip(times.iter_mut()) {
            let (a, b) = run_pair(&client, &id, &host, &server, w).await?;
            ensure!(
                a > 0.0 && b > 0.0,
                "a timed command took under 1 ms (direct {a} ms, proxied {b} ms): too short \
                 to time in whole milliseconds"
            );
            if run > 0 {
                direct.push(a);
                proxied.push(b);
            }
        }
        let before = server.served()?;
        let ms = {
            let (host, script) = (host.clone(), through_minimal.clone());
            tokio::task::spawn_blocking(move || host.run_whole_ms(&script))
                .await
                .context("the host command's thread")??
        };
        check_served(
            &server,
            before,
            workloads[2].expect,
            "through the minimal proxy",
        )?;
        if run > 0 {
            minimal_times.push(ms);
        }
    }
    drop(minimal);
    client.delete(&id).await.context("delete")?;
    d.stop();

    let [(http_direct, http_proxied), (tcp_direct, tcp_proxied), (req_direct, req_proxied), (named_direct, named_proxied)] =
        times;
    let bytes = n as u64 * blob;
    let rates = |ms: &[f64]| -> Vec<f64> { ms.iter().map(|t| gib_per_s(bytes, t / 1e3)).collect() };
    let per_request = |ms: &[f64]| -> Vec<f64> { ms.iter().map(|t| t / k as f64).collect() };
    // Each run's proxied − direct, per request.
    let added: Vec<f64> = (0..req_proxied.len())
        .map(|i| (req_proxied[i] - req_direct[i]) / k as f64)
        .collect();
    let downloads = format!("{n} × {}", size(blob));
    // The scripts as the report shows them: the server's port changes from run to run.
    let shown = [
        Workload::http("PORT", n, blob),
        Workload::tcp("PORT", n, blob),
        Workload::requests("PORT", k),
        Workload::named_requests("PORT", k),
    ];
    let timing = "timed from spawn to exit in whole milliseconds: on the host by this process, \
                  in the sandbox by the agent (`duration_ms` of the exit frame), so neither \
                  side counts the API's exec round trip";
    let in_sandbox = format!(
        "in a namespace sandbox created with `network.allow: [\"127.0.0.1:PORT\"]` (and the \
         operator's rule naming it), the server on the host's 127.0.0.1:PORT; {timing}"
    );
    let relayed = "the daemon accepts each connection on the proxy's listening socket (the agent \
                   handed it over once), checks, connects and relays";
    let on_host = format!(
        "run by the image's busybox `sh` on the host with only its applet links on `PATH` and \
         no proxy settings; {timing}"
    );
    Ok(vec![
        Measurement::scalar(
            "egress_http",
            &format!("HTTP download through the egress proxy ({downloads}, busybox `wget`)"),
            "ours",
            Unit::GibPerS,
            &rates(&http_proxied),
            &format!(
                "`{}` through `http_proxy` (absolute-URI HTTP): {relayed}; {in_sandbox}",
                shown[0].proxied
            ),
        ),
        Measurement::scalar(
            "floor_direct_http",
            &format!("the same `wget` on the host, direct ({downloads})"),
            "floor",
            Unit::GibPerS,
            &rates(&http_direct),
            &format!("the same script straight to the server, {on_host}"),
        ),
        Measurement::scalar(
            "egress_connect",
            &format!("raw TCP download through a CONNECT tunnel ({downloads}, busybox `nc`)"),
            "ours",
            Unit::GibPerS,
            &rates(&tcp_proxied),
            &format!(
                "`{}`: a tunnel opened by hand on the proxy's port, the server's bytes (after \
                 the proxy's answer) to /dev/null: {relayed}; {in_sandbox}",
                shown[1].proxied
            ),
        ),
        Measurement::scalar(
            "floor_direct_tcp",
            &format!("the same `nc` on the host, direct ({downloads})"),
            "floor",
            Unit::GibPerS,
            &rates(&tcp_direct),
            &format!("`{}`, straight to the server, {on_host}", shown[1].direct),
        ),
        Measurement::scalar(
            "egress_request",
            "HTTP request for 1 byte through the egress proxy, per request",
            "ours",
            Unit::Ms,
            &per_request(&req_proxied),
            &format!(
                "`{}` through `http_proxy`: one `wget` process, a new connection per request, \
                 the total over {k}: {relayed}; {in_sandbox}",
                shown[2].proxied
            ),
        ),
        Measurement::scalar(
            "floor_direct_request",
            "the same request on the host, direct, per request",
            "floor",
            Unit::Ms,
            &per_request(&req_direct),
            &format!("the same script straight to the server, the total over {k}, {on_host}"),
        ),
        Measurement::scalar(
            MINIMAL,
            "the same requests on the host through a minimal proxy, per request",
            "minimal proxy",
            Unit::Ms,
            &per_request(&minimal_times),
            &format!(
                "`export http_proxy=http://127.0.0.1:MINPORT; {}`: the least a proxy that ends \
                 the client's TCP connection costs, a thread of this process that accepts, \
                 reads the head, connects and copies the answer back, one connection after the \
                 other, with no checks, lookups, runtime or hand-off; so the direct floor's \
                 ratio to it is what the second TCP connection per request alone costs. The \
                 total over {k}, {on_host}",
                shown[2].direct
            ),
        ),
        Measurement::scalar(
            "egress_added_latency",
            "what the proxy adds to a request (proxied − direct)",
            "ours",
            Unit::Ms,
            &added,
            "the two rows above paired run by run: (proxied − direct) / the requests. The \
             daemon's accept, parse, policy check and connect, and the relay's extra hop, \
             plus whatever the sandbox adds to a connection's syscalls (seccomp)",
        ),
        Measurement::scalar(
            "egress_named_request",
            &format!(
                "HTTP request for 1 byte through the egress proxy by a name its resolver \
                 answers in {} ms, per request",
                SLOW_LOOKUP.as_millis()
            ),
            "ours",
            Unit::Ms,
            &per_request(&named_proxied),
            &format!(
                "`{}` through `http_proxy`: a new connection per request, each for the name \
                 `{REGISTRY_NAME}`, which the daemon's resolver answers with 127.0.0.1 after \
                 {} ms (a package registry behind a slow resolver); the proxy looks it up once \
                 and keeps the answer for 30 s, checking it against the sandbox's rules on each \
                 connection; {in_sandbox} and its name",
                shown[3].proxied,
                SLOW_LOOKUP.as_millis()
            ),
        ),
        Measurement::scalar(
            "floor_direct_named_request",
            "the same requests on the host, to the address (resolved once), per request",
            "floor",
            Unit::Ms,
            &per_request(&named_direct),
            &format!(
                "`{}`: a client that resolved the name once and connects to its address, as \
                 npm's own lookup cache does; the total over {k}, {on_host}",
                shown[3].direct
            ),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_direct_scripts_fetch_exactly_what_they_expect_from_the_host_server() -> Result<()> {
        let blob = 2 << 20;
        let server = BlobServer::start(blob)?;
        let host = HostShell::new(crate::host_shell::busybox(), &APPLETS)?;
        for w in [
            Workload::http(server.port(), 3, blob),
            Workload::tcp(server.port(), 2, blob),
            Workload::requests(server.port(), 5),
        ] {
            let before = server.served()?;
            host.run(&w.direct)?;
            check_served(&server, before, w.expect, "direct")?;
        }
        Ok(())
    }

    #[test]
    fn a_script_that_fails_on_the_host_is_an_error_naming_it() -> Result<()> {
        let server = BlobServer::start(1)?;
        let host = HostShell::new(crate::host_shell::busybox(), &APPLETS)?;
        let err = host
            .run(&format!(
                "wget -q -O /dev/null http://127.0.0.1:{}/missing",
                server.port()
            ))
            .expect_err("a 404 fails wget");
        assert!(err.to_string().contains("/missing"), "{err:#}");
        Ok(())
    }

    #[test]
    fn the_proxied_scripts_go_to_the_proxy_port_and_tunnel_to_the_server() {
        let w = Workload::tcp(4321, 2, 10);
        let proxy = contract::egress::PROXY_PORT;
        assert!(w.proxied.contains(&format!(
            "printf 'CONNECT 127.0.0.1:4321 HTTP/1.1\\r\\nHost: 127.0.0.1:4321\\r\\n\\r\\nhello\\r\\n\\r\\n' | nc 127.0.0.1 {proxy} "
        )), "{}", w.proxied);
        assert!(
            w.direct
                .contains("printf 'hello\\r\\n\\r\\n' | nc 127.0.0.1 4321 "),
            "{}",
            w.direct
        );
        assert_eq!(
            w.expect,
            Served {
                responses: 2,
                body_bytes: 20
            }
        );
        // HTTP goes through `http_proxy` in the sandbox: the very same script.
        let w = Workload::requests(4321, 7);
        assert_eq!(w.direct, w.proxied);
        assert_eq!(
            w.expect,
            Served {
                responses: 7,
                body_bytes: 7
            }
        );
    }
}
