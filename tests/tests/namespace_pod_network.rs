//! A namespace sandbox linked to a network namespace made on the host (`network_namespace`), as
//! the Kubernetes shim runs a pod in the one CNI made: a veth pair between the host and a named
//! namespace (`ip netns add`); the sandbox has the namespace's address, reaches a server on the
//! host's side of it, serves a port below 1024 the host reaches (and the namespace's loopback,
//! as port-forward does), configures its own namespace with NET_ADMIN and never the host's.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use api_types::CreateSandbox;
use client::{ClientError, Endpoint};
use harness::host_net::HostLinkedNamespace;
use harness::{sh, TestDaemon};

/// What a server at `address` sends, once something listens there (within 5 s).
async fn read_once_listening(address: std::net::SocketAddr) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match TcpStream::connect_timeout(&address, Duration::from_secs(1)) {
            Ok(mut stream) => {
                let mut answer = String::new();
                stream
                    .set_read_timeout(Some(Duration::from_secs(3)))
                    .expect("timeout");
                let _ = stream.read_to_string(&mut answer);
                return answer;
            }
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{address}: {e}"),
        }
    }
}

fn joining(path: String) -> CreateSandbox {
    CreateSandbox {
        network_namespace: Some(path),
        ..CreateSandbox::default()
    }
}

/// Runs `script` with `sh` inside the named network namespace, as the host; its stdout.
fn in_namespace(name: &str, script: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", name, "sh", "-c", script])
        .output()
        .expect("run ip netns exec");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn sh_in(c: &client::Client, id: &str, container: &str, script: &str) -> (String, i32) {
    let out = c
        .exec_in(id, container, &wire::ExecRequest::new(["sh", "-c", script]))
        .await
        .expect("exec in a container")
        .collect()
        .await
        .expect("its output");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (text, out.result.exit_code)
}

#[tokio::test]
async fn a_sandbox_linked_to_a_host_made_network_namespace_has_its_address_and_not_its_config() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let netns = HostLinkedNamespace::new();
    let server = TcpListener::bind((netns.host_ip, 0)).expect("bind on the host's side");
    let port = server.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for mut stream in server.incoming().flatten() {
            let peer = stream
                .peer_addr()
                .map(|a| a.ip().to_string())
                .unwrap_or_default();
            let _ = stream.write_all(format!("hello {peer}\n").as_bytes());
        }
    });
    let config = "ip -o addr show; ip route show table all; iptables-save | grep -v '^#'";
    let pod_config = in_namespace(&netns.name, config);

    let id = c.create(&joining(netns.path())).await.expect("create").id;
    let pod_config_linked = in_namespace(&netns.name, config);
    // Its address is the namespace's; the node answers it there.
    let (out, err, code) = sh(
        &c,
        &id,
        &format!(
            "ip -4 -o addr show dev eth0 | grep -c ' {}/32 '; nc -w 3 {} {port} </dev/null",
            netns.inside_ip, netns.host_ip
        ),
    )
    .await;
    assert_eq!(
        (out.as_str(), code),
        (format!("1\nhello {}\n", netns.inside_ip).as_str(), 0),
        "{err}"
    );

    // A port below 1024, served from inside, reached from the node at the pod's address and
    // from inside the pod's namespace on its loopback (as containerd's port-forward does).
    for from_the_namespace in [false, true] {
        let served = sh(
            &c,
            &id,
            "(echo hello-from-the-pod | nc -l -p 80 &) ; sleep 0.3; echo listening",
        )
        .await;
        assert_eq!(served.0, "listening\n", "{}", served.1);
        let answer = if from_the_namespace {
            in_namespace(&netns.name, "busybox nc -w 3 127.0.0.1 80 </dev/null")
        } else {
            read_once_listening((netns.inside_ip, 80).into()).await
        };
        assert_eq!(
            answer, "hello-from-the-pod\n",
            "port-forward: {from_the_namespace}"
        );
    }

    // A container granted NET_ADMIN configures the sandbox's own namespace (a bridge, as
    // critest's `brctl addbr`); one without it cannot.
    c.add_container(
        &id,
        &serde_json::from_value(serde_json::json!({
            "name": "admin", "command": ["sleep", "3600"],
            "security": {"capabilities": ["NET_ADMIN"]}
        }))
        .expect("a container request"),
    )
    .await
    .expect("add a container granted NET_ADMIN");
    c.add_container(
        &id,
        &serde_json::from_value(serde_json::json!({"name": "plain", "command": ["sleep", "3600"]}))
            .expect("a container request"),
    )
    .await
    .expect("add a container");
    let (out, code) = sh_in(&c, &id, "plain", "brctl addbr nope 2>&1").await;
    assert_ne!(code, 0, "brctl without NET_ADMIN: {out}");
    let (out, code) = sh_in(
        &c,
        &id,
        "admin",
        &format!(
            "brctl addbr foobar && ip link set lo down && ip link set lo up && \
             ip addr add 10.213.{}.77/32 dev eth0 && echo changed",
            netns.inside_ip.octets()[2]
        ),
    )
    .await;
    assert_eq!((out.as_str(), code), ("changed\n", 0), "NET_ADMIN: {out}");

    // ...and nothing of the pod's namespace: what the host linked stays as it was, and a
    // packet the sandbox sends as another address of the node's network goes nowhere.
    assert_eq!(in_namespace(&netns.name, config), pod_config_linked);
    assert!(!pod_config_linked.contains("foobar"), "{pod_config_linked}");
    let spoofed = sh_in(
        &c,
        &id,
        "admin",
        &format!(
            "ip route replace default via 169.254.77.1 dev eth0 src 10.213.{}.77 && \
             nc -w 2 {} {port} </dev/null 2>&1; echo \"rc=$?\"",
            netns.inside_ip.octets()[2],
            netns.host_ip
        ),
    )
    .await;
    assert!(
        !spoofed.0.contains("hello") && spoofed.0.contains("rc=1"),
        "a spoofed source got through: {spoofed:?}"
    );
    c.delete(&id).await.expect("delete");

    // Once the sandbox is gone, so is its link (the kernel removes a namespace's interfaces a
    // moment after its last process ends).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let after = in_namespace(&netns.name, "ip -o link show");
        if !after.contains("crucible0") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the link outlived the sandbox: {after}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        pod_config.contains(&netns.inside_ip.to_string()),
        "{pod_config}"
    );
}

#[tokio::test]
async fn only_another_network_namespace_is_joined_and_only_by_the_admin() {
    const KEY: &str = "tenant-key-48c1e2a9f0";
    let daemon = TestDaemon::start_with(|c| {
        c.tcp = Some("127.0.0.1:0".parse().expect("addr"));
        c.api_keys = api::ApiKeys::parse(&format!("tenant:{KEY}")).expect("valid keys");
    });
    let netns = HostLinkedNamespace::new();
    let tenant = client::Client::new(Endpoint::Tcp(daemon.tcp.expect("tcp address").to_string()))
        .with_api_key(KEY);
    match tenant.create(&joining(netns.path())).await {
        Err(ClientError::Api {
            status: 403,
            message,
            ..
        }) => {
            assert!(message.contains("network_namespace"), "{message}")
        }
        other => panic!("a tenant joining a host network namespace: {other:?}"),
    }
    let c = daemon.client();
    for (path, says) in [
        // The daemon runs in this process, on the host's network.
        (format!("/proc/{}/ns/net", std::process::id()), "host's own"),
        ("/proc/self/ns/mnt".to_string(), "not a network namespace"),
        ("/etc/hostname".to_string(), "not a namespace file"),
        ("/run/netns/crucible-no-such-namespace".to_string(), "open"),
    ] {
        match c.create(&joining(path.clone())).await {
            Err(ClientError::Api {
                status: 400,
                message,
                ..
            }) => {
                assert!(message.contains(says), "{path}: {message}")
            }
            other => panic!("{path}: {other:?}"),
        }
    }
    let with_egress = CreateSandbox {
        network: Some(api_types::NetworkRequest {
            allow: vec!["example.com:443".into()],
        }),
        ..joining(netns.path())
    };
    match c.create(&with_egress).await {
        Err(ClientError::Api {
            status: 400,
            message,
            ..
        }) => {
            assert!(message.contains("leave out `network`"), "{message}")
        }
        other => panic!("a joined namespace with egress: {other:?}"),
    }
}

#[tokio::test]
async fn namespaced_sysctls_are_set_in_the_sandbox_alone_and_the_hosts_are_refused() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let host = |path: &str| std::fs::read_to_string(path).expect("the host's value");
    let (shm_before, mqueue_before) = (
        host("/proc/sys/kernel/shm_rmid_forced"),
        host("/proc/sys/fs/mqueue/msg_max"),
    );
    let netns = HostLinkedNamespace::new();
    let sysctls = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let settings = [
        ("kernel.shm_rmid_forced", "1"),
        ("fs.mqueue.msg_max", "100"),
        ("net.ipv4.ip_local_port_range", "40000 41000"),
    ];
    // In a network namespace of its own, and in one the host made (set by the supervisor).
    for network_namespace in [None, Some(netns.path())] {
        let id = c
            .create(&CreateSandbox {
                sysctls: sysctls(&settings),
                network_namespace: network_namespace.clone(),
                ..CreateSandbox::default()
            })
            .await
            .expect("create")
            .id;
        let (out, err, code) = sh(
            &c,
            &id,
            "cat /proc/sys/kernel/shm_rmid_forced /proc/sys/fs/mqueue/msg_max \
             /proc/sys/net/ipv4/ip_local_port_range",
        )
        .await;
        assert_eq!(
            (out.as_str(), code),
            ("1\n100\n40000\t41000\n", 0),
            "{network_namespace:?}: {err}"
        );
        c.delete(&id).await.expect("delete");
    }
    assert_eq!(host("/proc/sys/kernel/shm_rmid_forced"), shm_before);
    assert_eq!(host("/proc/sys/fs/mqueue/msg_max"), mqueue_before);
    for (name, value) in [
        ("vm.swappiness", "10"),
        ("kernel.panic", "1"),
        ("net.x", "1\n"),
    ] {
        let request = CreateSandbox {
            sysctls: sysctls(&[(name, value)]),
            ..CreateSandbox::default()
        };
        match c.create(&request).await {
            Err(ClientError::Api {
                status: 400,
                message,
                ..
            }) => {
                assert!(
                    message.starts_with("sysctls: ") && message.contains(name),
                    "{message}"
                )
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_sandbox_on_the_hosts_network_is_a_host_process_to_it_and_changes_nothing() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let unprivileged_ports = || {
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
            .expect("the host's ip_unprivileged_port_start")
    };
    let ports_before = unprivileged_ports();
    let server = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind on the host");
    let port = server.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for mut stream in server.incoming().flatten() {
            let _ = stream.write_all(b"hello-from-the-node\n");
        }
    });
    let free_port = {
        let probe = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port");
        probe.local_addr().expect("address").port()
    };

    let id = c
        .create(&joining(api_types::HOST_NETWORK_NAMESPACE.to_string()))
        .await
        .expect("create on the host's network")
        .id;
    // The node's loopback services answer it, and it serves on the node's loopback.
    let (out, err, code) = sh(
        &c,
        &id,
        &format!(
            "nc -w 3 127.0.0.1 {port} </dev/null; \
             (echo hello-from-the-pod | nc -l -p {free_port} &); sleep 0.3"
        ),
    )
    .await;
    assert_eq!((out.as_str(), code), ("hello-from-the-node\n", 0), "{err}");
    let answer = read_once_listening((Ipv4Addr::LOCALHOST, free_port).into()).await;
    assert_eq!(answer, "hello-from-the-pod\n");

    // Root in it changes nothing of the host's network and binds no port below 1024.
    let (out, _, _) = sh(
        &c,
        &id,
        "ip link set lo down 2>&1; ip addr add 10.9.9.9/32 dev lo 2>&1; nc -l -p 81 2>&1; \
         echo 1 > /proc/sys/net/ipv4/ip_forward 2>&1 || echo sysctl-refused",
    )
    .await;
    assert_eq!(
        out.matches("Operation not permitted").count(),
        2,
        "a change went through:\n{out}"
    );
    assert!(
        out.contains("Permission denied"),
        "port 81 was bound:\n{out}"
    );
    assert!(out.contains("sysctl-refused"), "{out}");
    assert_eq!(
        unprivileged_ports(),
        ports_before,
        "the host's setting changed"
    );
    c.delete(&id).await.expect("delete");

    // A net.* sysctl would be the host's: refused before anything is made.
    let with_sysctl = CreateSandbox {
        sysctls: [("net.ipv4.ip_forward".to_string(), "1".to_string())].into(),
        ..joining(api_types::HOST_NETWORK_NAMESPACE.to_string())
    };
    match c.create(&with_sysctl).await {
        Err(ClientError::Api {
            status: 400,
            message,
            ..
        }) => assert!(message.contains("host's own network settings"), "{message}"),
        other => panic!("a net.* sysctl on the host's network: {other:?}"),
    }
}
