//! A Kubernetes pod run the way kubelet runs it: the calls kubelet makes, made over CRI to
//! containerd 1.6's CRI plugin with `crucible` as the runtime handler, which makes the pod one
//! sandbox of the daemon (its `pause` container's) and each of the pod's containers a
//! container in it. A job, a helper and a service share the pod's loopback and an `emptyDir`;
//! a container that fails is restarted as kubelet restarts it; when the pod is gone, nothing of
//! it is left.
//!
//! No kubelet runs here. The pod of three asks for the node's network (kubelet's `hostNetwork:
//! true`), which the CRI plugin accepts without a network plugin, and the sandbox has its own
//! loopback; the pod network test runs CNI's `bridge` plugin, and its pods join the network
//! namespaces it made. The `emptyDir` is a host directory laid out as kubelet lays one out
//! (`pods/UID/volumes/kubernetes.io~empty-dir/NAME`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use harness::leaks;
use harness::TestDaemon;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerFilter, ContainerMetadata, ContainerState, ContainerStatsRequest,
    ContainerStatusRequest, CreateContainerRequest, ExecSyncRequest, ImageSpec,
    LinuxContainerConfig, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, ListContainersRequest, Mount, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

mod support;

use support::*;

/// A CRI client on containerd's socket.
async fn cri(containerd: &Containerd) -> RuntimeServiceClient<Channel> {
    let socket = containerd.socket.clone();
    let channel = Endpoint::try_from("http://[::]:0")
        .expect("an endpoint")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .expect("connect to containerd's CRI");
    RuntimeServiceClient::new(channel)
}

/// The pod's configuration: the node's network, as `hostNetwork: true`.
fn pod_config(logs: &std::path::Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "ci-job".into(),
            uid: "c0ffee00-0000-4000-8000-000000000001".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "ci-job".into(),
        log_directory: logs.display().to_string(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    pid: NamespaceMode::Pod as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..NamespaceOption::default()
                }),
                ..LinuxSandboxSecurityContext::default()
            }),
            ..LinuxPodSandboxConfig::default()
        }),
        ..PodSandboxConfig::default()
    }
}

/// A container of the pod: busybox running `script`, the `emptyDir` at `/shared`.
fn container(name: &str, script: &str, empty_dir: &std::path::Path) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: IMAGE.into(),
            ..ImageSpec::default()
        }),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        mounts: vec![Mount {
            container_path: "/shared".into(),
            host_path: empty_dir.display().to_string(),
            ..Mount::default()
        }],
        log_path: format!("{name}.log"),
        ..ContainerConfig::default()
    }
}

/// A read-only bind of host directory `host` at `at`, as kubelet mounts a secret volume.
fn read_only_mount(host: &std::path::Path, at: &str) -> Mount {
    Mount {
        container_path: at.into(),
        host_path: host.display().to_string(),
        readonly: true,
        ..Mount::default()
    }
}

/// Writes secret `dir` as kubelet's atomic writer does: key `token` with `value` in a new
/// directory `generation`, then `..data` switched to it by a rename.
fn write_secret(dir: &std::path::Path, generation: &str, value: &str) {
    std::fs::create_dir_all(dir.join(generation)).expect("secret generation");
    // Two keys that only make sense together, as a certificate and its key.
    for key in ["token", "pair"] {
        std::fs::write(dir.join(generation).join(key), value).expect("secret key");
    }
    let next = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(generation, &next).expect("..data_tmp");
    std::fs::rename(&next, dir.join("..data")).expect("switch ..data");
    for key in ["token", "pair"] {
        let link = dir.join(key);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{key}"), &link).expect("key link");
        }
    }
}

/// A reader in the job that reads the secret over and over for `seconds`, and prints each
/// time a key is missing or unknown, or a generation holds keys of two rotations. (Two keys
/// read one after the other through their links may straddle a switch, with kubelet's own
/// volumes too: the generation `..data` names is what is read whole.)
fn mixed_reads_watch(seconds: u32) -> String {
    format!(
        "cd /var/run/secrets/x; end=$(($(date +%s) + {seconds})); n=0; \
         while [ $(date +%s) -lt $end ]; do \
           a=$(cat token 2>&1); case \"$a\" in s3cret|rotated) ;; *) echo \"BAD $a\";; esac; \
           g=$(readlink ..data) && x=$(cat \"$g/token\" 2>/dev/null) \
             && y=$(cat \"$g/pair\" 2>/dev/null) && [ \"$x\" != \"$y\" ] && echo \"MIXED $g\"; \
           n=$((n + 1)); \
         done; echo \"reads $n\""
    )
}

/// `CreateContainer` then `StartContainer`, as kubelet does; the container's id.
async fn create_and_start(
    cri: &mut RuntimeServiceClient<Channel>,
    containerd: &Containerd,
    request: CreateContainerRequest,
) -> String {
    let what = request
        .config
        .as_ref()
        .and_then(|c| c.metadata.as_ref())
        .map(|m| format!("{} (attempt {})", m.name, m.attempt))
        .unwrap_or_default();
    let id = cri
        .create_container(request)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "CreateContainer {what}: {e}; containerd's log:\n{}",
                containerd.log()
            )
        })
        .into_inner()
        .container_id;
    cri.start_container(StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("StartContainer {what}: {e}"));
    id
}

/// Polls a container's status (10 s at most) until it is in `state`.
async fn until_state(
    cri: &mut RuntimeServiceClient<Channel>,
    id: &str,
    state: ContainerState,
) -> k8s_cri::v1::ContainerStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = cri
            .container_status(ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .expect("ContainerStatus")
            .into_inner()
            .status
            .expect("a status");
        if status.state == state as i32 {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "container {id} never got to {state:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_of_three_containers_runs_as_one_sandbox_the_way_kubelet_drives_it() {
    // A CRI call that never answers fails the test instead of hanging it.
    tokio::time::timeout(Duration::from_secs(300), pod_of_three(TestDaemon::start()))
        .await
        .expect("the pod's life within 5 minutes");
}

/// The same pod on a daemon that makes microVMs (QEMU TCG): the pause container's sandbox is
/// a VM with empty disks for the containers kubelet adds one by one.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_of_three_containers_runs_as_one_qemu_tcg_microvm_the_way_kubelet_drives_it() {
    let daemon = TestDaemon::start_qemu_tcg(|_| {});
    tokio::time::timeout(Duration::from_secs(300), pod_of_three(daemon))
        .await
        .expect("the pod's life within 5 minutes");
}

/// The same pod in a microVM on `crucible-vmm` (the nested tier runs it).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(crucible_hardware_kvm),
    ignore = "needs hardware KVM (kvm_intel/kvm_amd) to boot the image; on other hosts `cargo xtask nested` runs it inside a nested-KVM L1"
)]
async fn a_pod_of_three_containers_runs_as_one_crucible_vmm_microvm_the_way_kubelet_drives_it() {
    let daemon = TestDaemon::start_microvm(api_types::Hypervisor::CrucibleVmm, |_| {});
    tokio::time::timeout(Duration::from_secs(600), pod_of_three(daemon))
        .await
        .expect("the pod's life within 10 minutes");
}

async fn pod_of_three(daemon: TestDaemon) {
    let c = daemon.client();
    let containerd = Containerd::start_cri(&daemon);
    let mut cri = cri(&containerd).await;
    let scratch = containerd.dir.path();
    let logs = scratch.join("pod-logs");
    let empty_dir = scratch.join(
        "kubelet/pods/c0ffee00-0000-4000-8000-000000000001/volumes/kubernetes.io~empty-dir/shared",
    );
    std::fs::create_dir_all(&logs).expect("log dir");
    std::fs::create_dir_all(&empty_dir).expect("emptyDir");
    let config = pod_config(&logs);

    let started = Instant::now();
    let pod = run_pod(&mut cri, &containerd, &config).await;
    let sandboxes = c.list().await.expect("list");
    assert_eq!(sandboxes.len(), 1, "the pod is one sandbox: {sandboxes:?}");
    let sandbox = sandboxes[0].id.clone();

    let scripts = [
        ("svc", "while true; do echo pong | nc -l -p 7000; done"),
        ("helper", "echo from-helper > /shared/note; exec sleep 3601"),
        ("job", "exec sleep 3600"),
    ];
    // A secret volume as kubelet lays one out: the files in a timestamped directory, `..data`
    // linking to it, each key linking through `..data`.
    let secret = scratch.join(
        "kubelet/pods/c0ffee00-0000-4000-8000-000000000001/volumes/kubernetes.io~secret/token",
    );
    write_secret(&secret, "..2026_12_05_first", "s3cret");
    let mut ids = HashMap::new();
    for (name, script) in scripts {
        let mut config_of = container(name, script, &empty_dir);
        if name == "job" {
            config_of
                .mounts
                .push(read_only_mount(&secret, "/var/run/secrets/x"));
        }
        if name == "helper" {
            // Kubelet's default: a PID namespace of its own. The others leave the mode unset,
            // which is `POD`: containerd joins them to the pause container's.
            config_of.linux = Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        pid: NamespaceMode::Container as i32,
                        ..NamespaceOption::default()
                    }),
                    ..LinuxContainerSecurityContext::default()
                }),
                ..LinuxContainerConfig::default()
            });
        }
        let request = CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(config_of),
            sandbox_config: Some(config.clone()),
        };
        ids.insert(name, create_and_start(&mut cri, &containerd, request).await);
    }
    eprintln!(
        "RunPodSandbox → 3 containers started: {:?}",
        started.elapsed()
    );
    // Still one sandbox, holding the pod's three containers.
    assert_eq!(c.list().await.expect("list").len(), 1);
    let mut names: Vec<String> = c
        .containers(&sandbox)
        .await
        .expect("containers")
        .into_iter()
        .map(|info| info.name)
        .collect();
    names.sort();
    // The job's secret volume has a writer container of its own (`files-…`), which keeps it.
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names[0].starts_with("files-"), "{names:?}");
    assert_eq!(names[1..], ["helper", "job", "svc"]);

    let sync = |cmd: &str| ExecSyncRequest {
        container_id: ids["job"].clone(),
        cmd: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
        timeout: 10,
    };
    // The job and svc share the pod's PID namespace, as containerd asked; helper keeps its own.
    let out = cri
        .exec_sync(sync(
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
        ))
        .await
        .expect("ExecSync")
        .into_inner();
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        seen.contains("nc -l -p 7000"),
        "job misses svc's process:\n{seen}"
    );
    // On every backend: a microVM's `main` has a PID namespace of its own too, which the
    // members sharing the pod's join (docs/security.md, "Pod members").
    let backend = c.get(&sandbox).await.expect("the sandbox").backend;
    assert!(
        !seen.contains("sleep 3601"),
        "job on the {backend} backend sees helper's process:\n{seen}"
    );

    // The pod's hostname, in every member (they share the sandbox's UTS namespace).
    let out = cri
        .exec_sync(sync("hostname; echo $HOSTNAME"))
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ci-job\nci-job\n");

    // The secret is there, read-only, and follows kubelet's rotation.
    let out = cri
        .exec_sync(sync(
            "cat /var/run/secrets/x/token; echo changed > /var/run/secrets/x/token",
        ))
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "s3cret");
    assert_ne!(out.exit_code, 0, "the secret volume was writable");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Read-only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Kubelet's own layout: each key a link through `..data`, which links to a generation.
    let out = cri
        .exec_sync(sync(
            "cd /var/run/secrets/x && readlink token && readlink pair \
             && readlink ..data | grep -c '^\\.\\.'",
        ))
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "..data/token\n..data/pair\n1\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A reader during the rotation never misses a key, and a generation is never a mix.
    let mut watcher = cri.clone();
    let watch = ExecSyncRequest {
        container_id: ids["job"].clone(),
        cmd: vec!["/bin/sh".into(), "-c".into(), mixed_reads_watch(6)],
        timeout: 30,
    };
    let watching = tokio::spawn(async move {
        watcher
            .exec_sync(watch)
            .await
            .expect("the reader")
            .into_inner()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    write_secret(&secret, "..2026_12_05_second", "rotated");
    let rotated = Instant::now();
    loop {
        let out = cri
            .exec_sync(sync("cat /var/run/secrets/x/token"))
            .await
            .expect("ExecSync")
            .into_inner();
        if out.stdout == b"rotated" {
            break;
        }
        assert!(
            rotated.elapsed() < Duration::from_secs(20),
            "the rotated secret never arrived: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("a rotated secret arrived in {:?}", rotated.elapsed());
    let watched = watching.await.expect("the reader's task");
    let report = String::from_utf8_lossy(&watched.stdout);
    assert!(
        !report.contains("MIXED") && !report.contains("BAD") && report.contains("reads "),
        "a reader saw the secret's keys missing or apart: {report}"
    );
    eprintln!("the reader during the rotation: {}", report.trim());

    // The job reaches the service on localhost and reads what the helper wrote to the
    // emptyDir (each tried until it is there: the containers start one after another).
    let reach = "for i in $(seq 200); do \
                 [ -s /shared/note ] && out=$(nc 127.0.0.1 7000 </dev/null) && [ -n \"$out\" ] \
                 && { cat /shared/note; echo \"$out\"; exit 0; }; sleep 0.05; done; exit 1";
    let exec = cri
        .exec_sync(ExecSyncRequest {
            container_id: ids["job"].clone(),
            cmd: vec!["/bin/sh".into(), "-c".into(), reach.into()],
            timeout: 30,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(
        (
            String::from_utf8_lossy(&exec.stdout).as_ref(),
            exec.exit_code
        ),
        ("from-helper\npong\n", 0),
        "stderr: {}",
        String::from_utf8_lossy(&exec.stderr)
    );
    // An exec's exit status is its own; the job has its own root (the helper's note is in the
    // shared directory only).
    let exec = cri
        .exec_sync(ExecSyncRequest {
            container_id: ids["job"].clone(),
            cmd: vec![
                "/bin/sh".into(),
                "-c".into(),
                "test -e /note || exit 3".into(),
            ],
            timeout: 10,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(exec.exit_code, 3);
    // The small files the CRI plugin mounts (/etc/hosts, /etc/resolv.conf) were copied in.
    let exec = cri
        .exec_sync(ExecSyncRequest {
            container_id: ids["job"].clone(),
            cmd: vec!["cat".into(), "/etc/hostname".into()],
            timeout: 10,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(
        (String::from_utf8_lossy(&exec.stdout).trim(), exec.exit_code),
        ("ci-job", 0)
    );

    let status = cri
        .container_status(ContainerStatusRequest {
            container_id: ids["job"].clone(),
            verbose: false,
        })
        .await
        .expect("ContainerStatus")
        .into_inner()
        .status
        .expect("a status");
    assert_eq!(status.state, ContainerState::ContainerRunning as i32);
    let listed = cri
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                pod_sandbox_id: pod.clone(),
                ..ContainerFilter::default()
            }),
        })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed
        .iter()
        .all(|c| c.state == ContainerState::ContainerRunning as i32));
    let stats = cri
        .container_stats(ContainerStatsRequest {
            container_id: ids["svc"].clone(),
        })
        .await
        .expect("ContainerStats")
        .into_inner()
        .stats
        .expect("stats");
    let memory = stats
        .memory
        .and_then(|m| m.working_set_bytes)
        .map(|v| v.value);
    assert!(memory.is_some_and(|bytes| bytes > 0), "{stats:?}");

    // A container that fails is restarted the way kubelet does it: a new container of the
    // same name, the next attempt, while the dead one is still listed. The second attempt
    // finds what the first left in the emptyDir and stays up.
    let flaky = "[ -e /shared/flaky-ran ] && exec sleep 3600; touch /shared/flaky-ran; exit 4";
    let mut attempts = Vec::new();
    for attempt in 0..2 {
        let mut flaky_config = container("flaky", flaky, &empty_dir);
        if let Some(metadata) = flaky_config.metadata.as_mut() {
            metadata.attempt = attempt;
        }
        flaky_config.log_path = format!("flaky_{attempt}.log");
        flaky_config
            .mounts
            .push(read_only_mount(&secret, "/etc/flaky"));
        let request = CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(flaky_config),
            sandbox_config: Some(config.clone()),
        };
        attempts.push(create_and_start(&mut cri, &containerd, request).await);
        if attempt == 0 {
            let status = until_state(&mut cri, &attempts[0], ContainerState::ContainerExited).await;
            assert_eq!(status.exit_code, 4, "{status:?}");
        }
    }
    until_state(&mut cri, &attempts[1], ContainerState::ContainerRunning).await;
    // The CRI plugin deleted the dead one's task when it exited, which removed it from the
    // sandbox: the new attempt takes its name.
    let flaky_in_sandbox: Vec<String> = c
        .containers(&sandbox)
        .await
        .expect("containers")
        .into_iter()
        .map(|info| info.name)
        .filter(|name| name.starts_with("flaky"))
        .collect();
    assert_eq!(flaky_in_sandbox, ["flaky"]);
    // The dead attempt's volume writer went with it: the job's and the new attempt's are left.
    let writers = c
        .containers(&sandbox)
        .await
        .expect("containers")
        .into_iter()
        .filter(|info| info.name.starts_with("files-"))
        .count();
    assert_eq!(writers, 2);
    let first = cri
        .container_status(ContainerStatusRequest {
            container_id: attempts[0].clone(),
            verbose: false,
        })
        .await
        .expect("the first attempt's status, kept for kubelet")
        .into_inner()
        .status
        .expect("a status");
    assert_eq!(
        (first.state, first.exit_code),
        (ContainerState::ContainerExited as i32, 4)
    );
    let exec = cri
        .exec_sync(ExecSyncRequest {
            container_id: attempts[1].clone(),
            cmd: vec!["cat".into(), "/shared/note".into()],
            timeout: 10,
        })
        .await
        .expect("ExecSync in the second attempt")
        .into_inner();
    assert_eq!(
        (
            String::from_utf8_lossy(&exec.stdout).as_ref(),
            exec.exit_code
        ),
        ("from-helper\n", 0)
    );

    cri.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .expect("StopPodSandbox");
    cri.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .expect("RemovePodSandbox");

    // Nothing of the pod is left: no sandbox, no shim, no mount, no cgroup.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = c.list().await.expect("list");
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "sandboxes left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    leaks::eventually("the pod's shim to exit", || containerd.shims().is_empty()).await;
    let mounts = leaks::mounts_under(containerd.dir.path());
    assert!(mounts.is_empty(), "mounts left: {mounts:?}");
    leaks::assert_nothing_held(&daemon.state.config.state_dir, daemon.cgroup_parent()).await;
}

/// A pod on the CNI network, its own PID and IPC namespaces, named `name`.
fn networked_pod(name: &str, uid: &str, logs: &std::path::Path) -> PodSandboxConfig {
    let mut config = pod_config(logs);
    config.hostname = name.into();
    if let Some(metadata) = config.metadata.as_mut() {
        metadata.name = name.into();
        metadata.uid = uid.into();
    }
    if let Some(options) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        options.network = NamespaceMode::Pod as i32;
    }
    config
}

/// Runs the pod `config` with the crucible handler; its id.
async fn run_pod(
    cri: &mut RuntimeServiceClient<Channel>,
    containerd: &Containerd,
    config: &PodSandboxConfig,
) -> String {
    cri.run_pod_sandbox(RunPodSandboxRequest {
        config: Some(config.clone()),
        runtime_handler: "crucible".into(),
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "RunPodSandbox: {e}; containerd's log:\n{}",
            containerd.log()
        )
    })
    .into_inner()
    .pod_sandbox_id
}

/// Runs `config` as a pod with one busybox container running `script`, with a memory limit
/// of `memory_bytes` if given; the pod's and the container's ids and the pod's IP.
async fn pod_running(
    cri: &mut RuntimeServiceClient<Channel>,
    containerd: &Containerd,
    config: PodSandboxConfig,
    script: &str,
    memory_bytes: Option<i64>,
) -> (String, String, String) {
    let pod = run_pod(cri, containerd, &config).await;
    let ip = cri
        .pod_sandbox_status(k8s_cri::v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner()
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .expect("the pod's network status");
    let mut container = container("main", script, &containerd.dir.path().join("unused"));
    container.mounts.clear();
    if let Some(bytes) = memory_bytes {
        container.linux = Some(LinuxContainerConfig {
            resources: Some(k8s_cri::v1::LinuxContainerResources {
                memory_limit_in_bytes: bytes,
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let id = create_and_start(
        cri,
        containerd,
        CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(container),
            sandbox_config: Some(config),
        },
    )
    .await;
    (pod, id, ip)
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_on_a_cni_network_reach_the_node_and_each_other() {
    tokio::time::timeout(Duration::from_secs(300), pods_on_a_cni_network())
        .await
        .expect("the pods finished within 5 minutes");
}

async fn pods_on_a_cni_network() {
    let daemon = TestDaemon::start();
    let (network, containerd, mut cri, logs) = on_a_cni_network(&daemon).await;

    let (web, _, web_ip) = pod_running(
        &mut cri,
        &containerd,
        networked_pod("web", "c0ffee00-0000-4000-8000-0000000000a1", &logs),
        "while true; do echo hello-from-web | nc -l -p 80; done",
        Some(1 << 30),
    )
    .await;
    // The pod's sandbox is sized by its member's limit, as kubelet sizes a pod's cgroup.
    let c = daemon.client();
    let sandboxes = c.list().await.expect("list");
    let pod_sandbox = sandboxes
        .iter()
        .find(|s| s.labels.get("containerd.id") == Some(&web))
        .expect("the web pod's sandbox");
    assert_eq!(
        pod_sandbox.memory_mib,
        1024,
        "{pod_sandbox:?}\n{}",
        containerd.log()
    );
    assert!(web_ip.starts_with("10.215."), "the pod's IP: {web_ip:?}");
    // The node, as the pods reach it: a server on the bridge's address (there once the
    // first pod is up).
    let node = std::net::TcpListener::bind((network.gateway, 0)).expect("bind on the bridge");
    let node_port = node.local_addr().expect("address").port();
    std::thread::spawn(move || {
        use std::io::Write;
        for mut stream in node.incoming().flatten() {
            let _ = stream.write_all(b"hello-from-the-node\n");
        }
    });
    let (client_pod, client, client_ip) = pod_running(
        &mut cri,
        &containerd,
        networked_pod("client", "c0ffee00-0000-4000-8000-0000000000a2", &logs),
        "sleep 3600",
        None,
    )
    .await;
    assert_ne!(client_ip, web_ip);
    let fetch = format!(
        "ip -4 -o addr show | grep -c 'inet {client_ip}/'; \
         for i in 1 2 3 4 5 6 7 8 9 10; do nc -w 2 {web_ip} 80 </dev/null && break; sleep 0.3; done; \
         nc -w 3 {} {node_port} </dev/null",
        network.gateway
    );
    let out = cri
        .exec_sync(ExecSyncRequest {
            container_id: client.clone(),
            cmd: vec!["/bin/sh".into(), "-c".into(), fetch],
            timeout: 30,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(
        text(&out.stdout),
        "1\nhello-from-web\nhello-from-the-node\n",
        "{}",
        text(&out.stderr)
    );
    // The pod's root cannot change the network CNI gave it.
    let out = cri
        .exec_sync(ExecSyncRequest {
            container_id: client,
            cmd: vec![
                "/bin/sh".into(),
                "-c".into(),
                "ip link set eth0 down 2>&1".into(),
            ],
            timeout: 10,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    assert!(
        text(&out.stdout).contains("Operation not permitted"),
        "{}",
        text(&out.stdout)
    );
    stop_and_remove(&mut cri, [web, client_pod]).await;
}

/// A microVM pod (QEMU TCG) on a CNI network: its container fetches a file from a server on
/// the node's side of the bridge through the agent's proxy, and the server sees the pod's IP,
/// since the daemon opens the connection in the pod's network namespace; and the node reaches
/// the container's server at the pod's IP (the daemon's redirect in that namespace, the
/// agent's `connect_tcp` in the VM).
#[tokio::test(flavor = "multi_thread")]
async fn a_microvm_pod_on_a_cni_network_fetches_from_the_node_as_its_pod_ip() {
    tokio::time::timeout(Duration::from_secs(300), microvm_pod_on_a_cni_network())
        .await
        .expect("the pod finished within 5 minutes");
}

async fn microvm_pod_on_a_cni_network() {
    let daemon = TestDaemon::start_qemu_tcg(|_| {});
    let (network, containerd, mut cri, logs) = on_a_cni_network(&daemon).await;
    let (pod, job, pod_ip) = pod_running(
        &mut cri,
        &containerd,
        networked_pod("vm-job", "c0ffee00-0000-4000-8000-0000000000b1", &logs),
        "while true; do echo hello-from-the-vm | nc -l -p 80; done",
        None,
    )
    .await;
    assert!(pod_ip.starts_with("10.215."), "the pod's IP: {pod_ip:?}");
    let node = std::net::TcpListener::bind((network.gateway, 0)).expect("bind on the bridge");
    let node_port = node.local_addr().expect("address").port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut stream in node.incoming().flatten() {
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head);
            let peer = stream
                .peer_addr()
                .map(|a| a.ip().to_string())
                .unwrap_or_default();
            let body = format!("hello {peer}\n");
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let out = cri
        .exec_sync(ExecSyncRequest {
            container_id: job,
            cmd: vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("wget -q -O - http://{}:{node_port}/file", network.gateway),
            ],
            timeout: 60,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(
        text(&out.stdout),
        format!("hello {pod_ip}\n"),
        "{}\n{}",
        text(&out.stderr),
        containerd.log()
    );
    let pod_addr: std::net::IpAddr = pod_ip.parse().expect("the pod's IP");
    let answered = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        // Until its `nc` listens (the container's command, started with the pod).
        let mut last = String::new();
        for _ in 0..60 {
            let got = std::net::TcpStream::connect_timeout(
                &(pod_addr, 80).into(),
                Duration::from_secs(10),
            )
            .and_then(|mut stream| {
                stream.set_read_timeout(Some(Duration::from_secs(30)))?;
                let mut text = String::new();
                stream.read_to_string(&mut text).map(|_| text)
            });
            match got {
                Ok(text) if text.contains("hello-from-the-vm") => return Ok(text),
                Ok(text) => last = format!("answered {text:?}"),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Err(last)
    })
    .await
    .expect("join");
    assert!(
        answered.is_ok(),
        "the node reaching {pod_ip}:80: {answered:?}\n{}",
        containerd.log()
    );
    stop_and_remove(&mut cri, [pod]).await;
}

/// A CNI `bridge` network of the test's own, a containerd using it with `daemon`, a CRI
/// client, and the pods' log directory.
async fn on_a_cni_network(
    daemon: &TestDaemon,
) -> (
    CniBridge,
    Containerd,
    RuntimeServiceClient<Channel>,
    std::path::PathBuf,
) {
    let network = CniBridge::new();
    let containerd = Containerd::start_cri_on(daemon, &network);
    let cri = cri(&containerd).await;
    let logs = containerd.dir.path().join("pod-logs");
    std::fs::create_dir_all(&logs).expect("mkdir logs");
    (network, containerd, cri, logs)
}

/// Stops and removes each of `pods`, as kubelet does when they are deleted.
async fn stop_and_remove(
    cri: &mut RuntimeServiceClient<Channel>,
    pods: impl IntoIterator<Item = String>,
) {
    for pod in pods {
        cri.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .expect("StopPodSandbox");
        cri.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod,
        })
        .await
        .expect("RemovePodSandbox");
    }
}
