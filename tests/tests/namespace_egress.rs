//! Egress through the daemon, end to end: the sandbox's agent serves the proxy address on the
//! sandbox's own loopback and hands every connection to the daemon, which enforces the
//! sandbox's allowlist within the operator's. The targets are servers this test starts on the
//! host's 127.0.0.1 (allowed by operator rules naming them), never any other address.

use std::sync::Arc;

use api_types::{CreateSandbox, NetworkRequest};
use harness::host_net::{http_response, random_bytes, HostServer};
use harness::{sh, TestDaemon};
use sha2::{Digest, Sha256};

fn hex_sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn a_sandbox_without_network_reaches_nothing() {
    let server = HostServer::responding(|_| http_response(b"should never be seen"));
    let daemon = TestDaemon::start_with(|config| {
        config.egress_allow = vec![format!("127.0.0.1:{}", server.port)];
    });
    let c = daemon.client();
    let id = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let info = c.get(&id).await.expect("get");
    assert!(info.network.is_none(), "{info:?}");
    // `timeout 2 wget`, not `wget -T 2`: the image's busybox (Debian's busybox-static) is built
    // without FEATURE_WGET_TIMEOUT, yet still parses -T as a number and stores it through a
    // NULL pointer, so `wget -T` dies of SIGSEGV before it opens a socket, on the host too.
    let script = format!(
        "env | grep -i _proxy; echo env=$?; \
         timeout 2 wget -q -O- http://127.0.0.1:{port}/ 2>&1; echo direct=$?; \
         timeout 2 wget -q -O- -Y on http://127.0.0.1:{port}/ 2>&1; echo proxied=$?; \
         echo x | nc -w 2 127.0.0.1 3128 2>&1; echo proxy_port=$?; \
         cat /proc/net/dev | tail -n +3 | cut -d: -f1",
        port = server.port
    );
    let (out, err, code) = sh(&c, &id, &script).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("env=1"), "no proxy settings: {out}");
    // Each wget must have tried and been refused (exit 1), not failed some other way: a wget
    // that dies before connecting would pass a bare "not 0" and prove nothing about the network.
    let said = |line: &str| out.lines().any(|l| l == line);
    assert!(said("direct=1") && said("proxied=1"), "{out}");
    assert_eq!(
        out.matches("wget: can't connect to remote host (127.0.0.1): Connection refused")
            .count(),
        2,
        "both wgets reached only the sandbox's own loopback: {out}"
    );
    assert!(
        !out.contains("proxy_port=0"),
        "nothing listens on the proxy port: {out}"
    );
    assert!(!out.contains("should never be seen"), "{out}");
    assert_eq!(
        out.lines().last().map(str::trim),
        Some("lo"),
        "the only interface is the sandbox's own loopback: {out}"
    );
    assert_eq!(server.connections(), 0);
}

#[tokio::test]
async fn an_allowed_host_port_is_fetched_over_http_and_connect_byte_for_byte_and_others_get_403() {
    let data = Arc::new(random_bytes(3 * 1024 * 1024 + 17));
    let served = data.clone();
    let http = HostServer::responding(move |head| {
        // The proxy sends origin-form requests, one per connection.
        if head.starts_with("GET /blob HTTP/1.1\r\n") && head.contains("\r\nConnection: close") {
            http_response(&served)
        } else {
            format!("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n{head}").into_bytes()
        }
    });
    let tunnelled = data.clone();
    // A CONNECT target: sends the blob as soon as the client says hello.
    let tunnel = HostServer::responding(move |_| tunnelled.to_vec());
    let never = HostServer::responding(|_| b"unreachable".to_vec());
    let operator = vec![
        format!("127.0.0.1:{}", http.port),
        format!("127.0.0.1:{}", tunnel.port),
        "localhost".to_string(),
        "*.example.org".to_string(),
    ];
    let daemon = TestDaemon::start_with(|config| config.egress_allow = operator);
    let c = daemon.client();

    // A rule outside the operator's is refused at creation.
    let refused = c
        .create(&CreateSandbox {
            network: Some(NetworkRequest {
                allow: vec!["crates.io".into()],
            }),
            ..CreateSandbox::default()
        })
        .await
        .expect_err("not within the operator's rules");
    assert!(refused.to_string().contains("403"), "{refused}");

    let allow = vec![
        format!("127.0.0.1:{}", http.port),
        format!("127.0.0.1:{}", tunnel.port),
        "localhost".into(),
        "static.example.org:443".into(),
    ];
    let id = c
        .create(&CreateSandbox {
            network: Some(NetworkRequest {
                allow: allow.clone(),
            }),
            ..CreateSandbox::default()
        })
        .await
        .expect("create")
        .id;

    // Plain HTTP through HTTP_PROXY, byte for byte.
    let script = format!(
        "set -e; echo $HTTP_PROXY $https_proxy $NO_PROXY; \
         wget -q -O /tmp/http.bin http://127.0.0.1:{}/blob; sha256sum /tmp/http.bin",
        http.port
    );
    let (out, err, code) = sh(&c, &id, &script).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("http://127.0.0.1:3128 http://127.0.0.1:3128 localhost,127.0.0.1\n"),
        "{out}"
    );
    assert!(out.contains(&hex_sha256(&data)), "{out}");

    // CONNECT, as a TLS client would open its tunnel, byte for byte after the proxy's answer.
    let script = format!(
        "printf 'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\nhello\\r\\n\\r\\n' \
         | nc 127.0.0.1 3128 > /tmp/tunnel.out; head -c 39 /tmp/tunnel.out; echo; \
         tail -c +40 /tmp/tunnel.out | sha256sum",
        port = tunnel.port
    );
    let (out, err, code) = sh(&c, &id, &script).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("HTTP/1.1 200 Connection established\r\n\r\n"),
        "{out:?}"
    );
    assert!(out.contains(&hex_sha256(&data)), "{out}");

    // A name not in the rules: 403 naming the rule set, nothing resolved or connected.
    let (out, _, _) = sh(
        &c,
        &id,
        "wget -S -O- http://denied.example.com/ 2>&1; echo exit=$?",
    )
    .await;
    // The reason is in the status line, which is what wget -S, curl -v, pip and apt show.
    assert!(
        out.contains("403 Forbidden: crucible egress: denied.example.com:80 is not allowed"),
        "{out}"
    );
    assert!(!out.contains("exit=0"), "{out}");
    let (body, _, _) = sh(
        &c,
        &id,
        "printf 'GET http://denied.example.com/ HTTP/1.1\\r\\nHost: denied.example.com\\r\\n\\r\\n' \
         | nc 127.0.0.1 3128",
    )
    .await;
    assert!(body.starts_with("HTTP/1.1 403"), "{body}");
    assert!(
        body.contains("denied.example.com") && body.contains("static.example.org:443"),
        "the answer names the target and the rule set: {body}"
    );

    // An allowed name that resolves to a loopback port no operator rule names: refused.
    let (out, _, _) = sh(
        &c,
        &id,
        &format!(
            "wget -S -O- http://localhost:{}/ 2>&1; echo exit=$?",
            never.port
        ),
    )
    .await;
    assert!(out.contains("403") && !out.contains("exit=0"), "{out}");
    assert_eq!(never.connections(), 0);
    assert!(!out.contains("unreachable"), "{out}");

    // Counted per sandbox, in the API and in /metrics.
    let network = c.get(&id).await.expect("get").network.expect("network");
    assert_eq!(network.allow, allow);
    assert_eq!(network.proxy, "http://127.0.0.1:3128");
    assert_eq!(network.connections, 2, "{network:?}");
    assert!(network.denied >= 3, "{network:?}");
    // Each refused destination once, with how often and why, as the sandbox was told.
    let refused = |destination: &str| {
        network
            .refused
            .iter()
            .find(|r| r.destination == destination)
            .unwrap_or_else(|| panic!("{destination} not in {:?}", network.refused))
    };
    let denied = refused("denied.example.com:80");
    assert_eq!(denied.count, 2, "{denied:?}");
    assert!(
        denied
            .reason
            .starts_with("crucible egress: denied.example.com:80 is not allowed"),
        "{denied:?}"
    );
    let loopback = refused(&format!("localhost:{}", never.port));
    assert!(loopback.reason.contains("loopback"), "{loopback:?}");
    assert_eq!(network.refused.len(), 2, "{:?}", network.refused);
    assert!(network.bytes_in >= 2 * data.len() as u64, "{network:?}");
    assert!(network.bytes_out > 0, "{network:?}");
    let metrics = c.metrics().await.expect("metrics");
    assert!(
        metrics.contains(&format!(
            "crucible_sandbox_egress_connections_total{{sandbox=\"{id}\"}} 2"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("\ncrucible_egress_connections_total 2\n"),
        "{metrics}"
    );
    assert_eq!(http.connections(), 1);
    assert_eq!(tunnel.connections(), 1);
}

#[tokio::test]
async fn a_hostile_sandbox_cannot_take_the_uplink_or_exhaust_the_daemon() {
    let server = HostServer::responding(|_| http_response(b"ok"));
    let rule = format!("127.0.0.1:{}", server.port);
    let daemon = TestDaemon::start_with(|config| config.egress_allow = vec![rule.clone()]);
    let c = daemon.client();
    let id = c
        .create(&CreateSandbox {
            network: Some(NetworkRequest {
                allow: vec![rule.clone()],
            }),
            ..CreateSandbox::default()
        })
        .await
        .expect("create")
        .id;
    // The uplink is a descriptor of PID 1's: commands neither inherit it nor can reach it.
    let (out, err, code) = sh(
        &c,
        &id,
        "ls /proc/self/fd | tr '\\n' ' '; echo; cat /proc/1/fd/5 2>&1 | head -n1; \
         readlink /proc/1/fd/5; echo readlink=$?; grep -c egress /proc/1/net/unix",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0].trim(), "0 1 2 3", "{out}{err}");
    assert!(lines[1].contains("Permission denied"), "{out}{err}");
    assert_eq!(lines[2].trim(), "readlink=1", "{out}{err}");
    assert_eq!(
        lines[3].trim(),
        "0",
        "no socket path names the uplink: {out}{err}"
    );
    assert_eq!(code, 1, "grep found nothing: {out}{err}");

    // More connections than a sandbox may hold: the excess are answered 429, the daemon
    // stays up, and once they are gone the sandbox is served again.
    let script = format!(
        "for i in $(seq {n}); do sleep 4 | nc 127.0.0.1 3128 > /tmp/c$i 2>&1 & done; \
         sleep 2; grep -l '^HTTP/1.1 429' /tmp/c* | wc -l; wait; \
         wget -q -O- http://127.0.0.1:{port}/",
        n = egress::MAX_CONNECTIONS_PER_SANDBOX + 20,
        port = server.port
    );
    let (out, err, code) = sh(&c, &id, &script).await;
    assert_eq!(code, 0, "{out}{err}");
    let refused: usize = out
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .parse()
        .expect("a count");
    assert_eq!(refused, 20, "{out}");
    assert!(out.trim_end().ends_with("ok"), "{out}");
    assert!(c.health().await.is_ok());
}
