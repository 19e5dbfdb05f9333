//! What of an OCI runtime spec a crucible sandbox takes: the process to run (args, env, cwd,
//! user and its additional groups, rlimits), the memory and CPU limits, a pod member's security
//! settings (read-only root, `noNewPrivileges`, capabilities within the sandbox's). Everything
//! else (namespaces, mounts) is the sandbox's own and documented in `docs/kubernetes.md`.

use std::collections::BTreeMap;

use oci_spec::runtime::{Process, Spec};
use wire::ExecRequest;

use crate::error::ShimError;

const MIB: u64 = 1024 * 1024;
/// The daemon's bounds for `memory_mib` (`POST /sandboxes`).
const MEMORY_MIB: (u64, u64) = (16, 16384);
/// The daemon's bounds for `vcpus`.
const VCPUS: (u32, u32) = (1, 16);

/// `memory_mib` for a cgroup memory limit in bytes: rounded up to whole MiB and clamped to what
/// the daemon accepts. No limit (absent, 0 or negative, as `-1` means unlimited) leaves the
/// daemon's default.
pub(crate) fn memory_mib(limit_bytes: Option<i64>) -> Option<u64> {
    let limit = u64::try_from(limit_bytes?).ok().filter(|&l| l > 0)?;
    Some(limit.div_ceil(MIB).clamp(MEMORY_MIB.0, MEMORY_MIB.1))
}

/// `vcpus` for a CFS quota and period: whole CPUs, rounded up (`--cpus 0.5` → 1). No quota (or
/// `-1`, unlimited) leaves the daemon's default.
pub(crate) fn vcpus(quota: Option<i64>, period: Option<u64>) -> Option<u32> {
    let quota = u64::try_from(quota?).ok().filter(|&q| q > 0)?;
    let period = period.filter(|&p| p > 0).unwrap_or(100_000);
    let cpus = u32::try_from(quota.div_ceil(period)).unwrap_or(u32::MAX);
    Some(cpus.clamp(VCPUS.0, VCPUS.1))
}

/// `(memory_mib, vcpus)` within what the daemon accepts (a pod's sum may be more).
pub(crate) fn clamped(limits: (Option<u64>, Option<u32>)) -> (Option<u64>, Option<u32>) {
    (
        limits.0.map(|m| m.clamp(MEMORY_MIB.0, MEMORY_MIB.1)),
        limits.1.map(|c| c.clamp(VCPUS.0, VCPUS.1)),
    )
}

/// The limits of a container's spec, as `(memory_mib, vcpus)`.
pub(crate) fn limits(spec: &Spec) -> (Option<u64>, Option<u32>) {
    let resources = spec.linux().as_ref().and_then(|l| l.resources().as_ref());
    let memory = resources
        .and_then(|r| r.memory().as_ref())
        .and_then(|m| m.limit());
    let cpu = resources.and_then(|r| r.cpu().as_ref());
    (
        memory_mib(memory),
        vcpus(cpu.and_then(|c| c.quota()), cpu.and_then(|c| c.period())),
    )
}

/// The sandbox's `user` for the spec's process user: `uid:gid`, or `None` for root (the
/// default). Supplementary groups (`additionalGids`) are not carried: the daemon's `user`
/// takes a user and a group.
pub(crate) fn user(spec: &Spec) -> Option<String> {
    let user = spec.process().as_ref()?.user();
    (user.uid() != 0 || user.gid() != 0).then(|| format!("{}:{}", user.uid(), user.gid()))
}

/// Refuses a pod sandbox's spec that asks for the node's PID or IPC namespace (Kubernetes'
/// `hostPID`, `hostIPC`: containerd then leaves that namespace out of the pause container's
/// spec). A crucible sandbox always has its own: running the pod without them would give it
/// something else than it asked for, without a word.
pub(crate) fn refuse_host_namespaces(spec: &Spec) -> Result<(), ShimError> {
    use oci_spec::runtime::LinuxNamespaceType;
    let Some(namespaces) = spec.linux().as_ref().and_then(|l| l.namespaces().as_ref()) else {
        return Ok(());
    };
    let has = |kind: LinuxNamespaceType| namespaces.iter().any(|n| n.typ() == kind);
    let asked: Vec<&str> = [
        (LinuxNamespaceType::Pid, "hostPID"),
        (LinuxNamespaceType::Ipc, "hostIPC"),
    ]
    .into_iter()
    .filter(|(kind, _)| !has(*kind))
    .map(|(_, field)| field)
    .collect();
    if asked.is_empty() {
        return Ok(());
    }
    Err(ShimError::Invalid(format!(
        "{}: a crucible sandbox never shares the node's PID or IPC namespace (run this pod \
         with another runtime class)",
        asked.join(", ")
    )))
}

/// The network a pod's sandbox joins, from the pause container's spec: the path of the
/// `network` namespace CNI made; the node's own (`"host"`) for a `hostNetwork` pod, whose
/// spec has no `network` namespace at all (containerd leaves it out); `None` for a namespace
/// without a path (the runtime makes it: the sandbox gets one of its own).
pub(crate) fn pod_network_namespace(spec: &Spec) -> Option<String> {
    use oci_spec::runtime::LinuxNamespaceType;
    let namespaces = spec.linux().as_ref()?.namespaces().as_ref()?;
    match namespaces
        .iter()
        .find(|n| n.typ() == LinuxNamespaceType::Network)
    {
        None => Some(api_types::HOST_NETWORK_NAMESPACE.to_string()),
        Some(network) => network
            .path()
            .as_ref()
            .map(|path| path.display().to_string()),
    }
}

/// Whether a pod member's spec joins another process's PID namespace (a `pid` namespace with a
/// path: containerd's `NamespaceMode` `POD`, kubelet's `shareProcessNamespace: true`, or
/// `TARGET`) rather than getting its own (`CONTAINER`, no path): it then joins its pod's
/// sandbox's root's, where the pause process runs.
pub(crate) fn joins_pod_pid_namespace(spec: &Spec) -> bool {
    use oci_spec::runtime::LinuxNamespaceType;
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|namespaces| {
            namespaces
                .iter()
                .any(|n| n.typ() == LinuxNamespaceType::Pid && n.path().is_some())
        })
}

/// A pod member's security settings as the sandbox applies them: a read-only root
/// (`readOnlyRootFilesystem`), `noNewPrivileges` (`allowPrivilegeEscalation: false`) and the
/// capability bounding set. A set within containerd's default (Docker's) is sent as the
/// sandbox takes it: its whole set when none of the sandbox's is missing (the three it does
/// not grant by default, `NET_RAW`, `MKNOD`, `AUDIT_WRITE`, left out, as documented), else
/// the sandbox's it keeps (`drop`). A set beyond it (`add: [NET_ADMIN]`, `privileged`) is
/// sent as asked, every name of it: the sandbox grants each within its own user namespace.
pub(crate) fn security(spec: &Spec) -> Result<api_types::ContainerSecurity, ShimError> {
    use contract::container_security::{
        capability_name, ALL_CAPABILITIES, DEFAULT_NOT_GRANTED, SANDBOX_CAPABILITIES,
    };
    let process = spec.process().as_ref();
    let mut security = api_types::ContainerSecurity {
        read_only_root: spec
            .root()
            .as_ref()
            .and_then(|r| r.readonly())
            .unwrap_or(false),
        no_new_privileges: process.and_then(|p| p.no_new_privileges()).unwrap_or(false),
        capabilities: None,
        masked_paths: linux_paths(spec, |l| l.masked_paths().as_ref()),
        read_only_paths: linux_paths(spec, |l| l.readonly_paths().as_ref()),
        writable_files: Vec::new(),
        seccomp: seccomp(spec)?,
    };
    let Some(capabilities) = process.and_then(|p| p.capabilities().as_ref()) else {
        return Ok(security);
    };
    // Go's encoder leaves an empty set out (`omitempty`): containerd's `drop: [ALL]` has no
    // `bounding` at all, which is none, not the default.
    let asked: std::collections::BTreeSet<String> = capabilities
        .bounding()
        .iter()
        .flatten()
        .map(|c| capability_name(&c.to_string()))
        .collect();
    if let Some(unknown) = asked
        .iter()
        .find(|name| !ALL_CAPABILITIES.iter().any(|(known, _)| known == name))
    {
        return Err(ShimError::Invalid(format!(
            "securityContext.capabilities: {unknown} is not a Linux capability"
        )));
    }
    let in_docker_default = |name: &String| {
        DEFAULT_NOT_GRANTED.contains(&name.as_str())
            || SANDBOX_CAPABILITIES.iter().any(|(kept, _)| kept == name)
    };
    if !asked.iter().all(in_docker_default) {
        security.capabilities = Some(asked.into_iter().collect());
        return Ok(security);
    }
    let granted: Vec<String> = SANDBOX_CAPABILITIES
        .iter()
        .map(|(name, _)| name.to_string())
        .filter(|name| asked.contains(name))
        .collect();
    if granted.len() < SANDBOX_CAPABILITIES.len() {
        security.capabilities = Some(granted);
    }
    Ok(security)
}

/// The spec's seccomp profile (`linux.seccomp`: what containerd writes for a `Localhost` or
/// `RuntimeDefault` profile; nothing for `Unconfined` or a privileged container) as the
/// daemon takes it, to stack on the sandbox's own filter. A notifying profile (a
/// `listenerPath`) or one with filter flags is refused, naming the field: crucible runs no
/// listener and installs its filters without flags.
fn seccomp(spec: &Spec) -> Result<Option<api_types::SeccompProfile>, ShimError> {
    let Some(profile) = spec.linux().as_ref().and_then(|l| l.seccomp().as_ref()) else {
        return Ok(None);
    };
    if let Some(path) = profile.listener_path() {
        return Err(ShimError::Invalid(format!(
            "linux.seccomp.listenerPath {}: crucible runs no seccomp listener",
            path.display()
        )));
    }
    if let Some(flags) = profile.flags().as_ref().filter(|f| !f.is_empty()) {
        return Err(ShimError::Invalid(format!(
            "linux.seccomp.flags {flags:?}: crucible installs a profile without flags"
        )));
    }
    // The OCI names (`SCMP_ACT_ERRNO`, `SCMP_CMP_EQ`) as serde writes them.
    let name = |value: serde_json::Result<serde_json::Value>| -> String {
        value
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let syscalls = profile
        .syscalls()
        .iter()
        .flatten()
        .map(|rule| api_types::SeccompRule {
            names: rule.names().clone(),
            action: name(serde_json::to_value(rule.action())),
            errno_ret: rule.errno_ret(),
            args: rule
                .args()
                .iter()
                .flatten()
                .map(|arg| api_types::SeccompArg {
                    // Past 255 is past 5 too: the daemon names it.
                    index: u8::try_from(arg.index()).unwrap_or(u8::MAX),
                    value: arg.value(),
                    value_two: arg.value_two().unwrap_or(0),
                    op: name(serde_json::to_value(arg.op())),
                })
                .collect(),
        })
        .collect();
    Ok(Some(api_types::SeccompProfile {
        default_action: name(serde_json::to_value(profile.default_action())),
        default_errno_ret: profile.default_errno_ret(),
        syscalls,
    }))
}

/// One of the spec's lists of paths (`linux.maskedPaths`, `linux.readonlyPaths`).
fn linux_paths(
    spec: &Spec,
    list: impl FnOnce(&oci_spec::runtime::Linux) -> Option<&Vec<String>>,
) -> Vec<String> {
    spec.linux()
        .as_ref()
        .and_then(list)
        .cloned()
        .unwrap_or_default()
}

/// `security` as a microVM sandbox takes it: its containers' `/proc` and `/sys` are the
/// guest kernel's, not the node's, so the masked and read-only paths there (containerd's
/// defaults for every container: `/proc/kcore`, `/sys/firmware`, `/proc/sys`, …), which keep
/// a container from the node kernel's, have nothing of the node's to keep it from and are
/// left out. Any other path, or any other setting, the daemon refuses, naming it.
pub(crate) fn for_microvm(
    mut security: api_types::ContainerSecurity,
) -> api_types::ContainerSecurity {
    let of_the_kernel = |path: &String| {
        ["/proc", "/sys"]
            .iter()
            .any(|top| path == top || path.starts_with(&format!("{top}/")))
    };
    security.masked_paths.retain(|path| !of_the_kernel(path));
    security.read_only_paths.retain(|path| !of_the_kernel(path));
    security
}

/// `KEY=value` entries as a map; an entry without `=` or with an empty key is left out (it
/// cannot be set with `execve`'s environment either). A later duplicate wins, as with `env`.
pub(crate) fn env_map(entries: &[String]) -> BTreeMap<String, String> {
    entries
        .iter()
        .filter_map(|entry| entry.split_once('='))
        .filter(|(key, _)| !key.is_empty())
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

/// The daemon's `exec_id` for a container's process: `init` for the container's own, `x.` and
/// containerd's exec id for the others (so the two never collide).
pub(crate) fn daemon_exec_id(exec_id: &str) -> String {
    if exec_id.is_empty() {
        "init".to_string()
    } else {
        format!("x.{exec_id}")
    }
}

/// The exec request that runs an OCI process in the sandbox as containerd's `exec_id` (empty
/// for the container's own process). `terminal: true` runs it on a pseudo-terminal of the
/// sandbox's, sized as its `consoleSize` says (resized by `ResizePty`).
pub(crate) fn exec_request(process: &Process, exec_id: &str) -> Result<ExecRequest, ShimError> {
    let tty = process.terminal() == Some(true);
    let args = process.args().clone().unwrap_or_default();
    if args.is_empty() {
        return Err(ShimError::Invalid(
            "the process has no args: nothing to run".into(),
        ));
    }
    let cwd = process
        .cwd()
        .to_str()
        .ok_or_else(|| ShimError::Invalid(format!("process cwd {:?} is not UTF-8", process.cwd())))?
        .to_string();
    let user = process.user();
    let request = ExecRequest {
        // The session outlives its connection: a daemon restarted under live restore is taken
        // up again (process::relay), and containerd sees the task run on.
        on_disconnect: Some(wire::OnDisconnect::Keep),
        cmd: args,
        env: env_map(process.env().as_deref().unwrap_or_default()),
        cwd,
        timeout_s: 0,
        // Always explicit: an exec's spec names its own user, which may differ from the
        // container's.
        user: format!("{}:{}", user.uid(), user.gid()),
        group_add: user
            .additional_gids()
            .iter()
            .flatten()
            .map(u32::to_string)
            .collect(),
        rlimits: process
            .rlimits()
            .iter()
            .flatten()
            .map(|limit| wire::Rlimit {
                kind: limit.typ().to_string(),
                soft: limit.soft(),
                hard: limit.hard(),
            })
            .collect(),
        exec_id: daemon_exec_id(exec_id),
        tty,
        tty_size: process
            .console_size()
            .filter(|_| tty)
            .map(|size| wire::TerminalSize {
                rows: u16::try_from(size.height()).unwrap_or(u16::MAX),
                cols: u16::try_from(size.width()).unwrap_or(u16::MAX),
            }),
    };
    request
        .validate()
        .map_err(|e| ShimError::Invalid(format!("the process: {e}")))?;
    Ok(request)
}

/// The process of an exec request's spec (`ExecProcessRequest.spec`: JSON, as containerd
/// registers `specs.Process`).
pub(crate) fn exec_process(json: &[u8]) -> Result<Process, ShimError> {
    serde_json::from_slice(json)
        .map_err(|e| ShimError::Invalid(format!("the exec spec is not an OCI process: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_namespaces(kinds: &[oci_spec::runtime::LinuxNamespaceType]) -> Spec {
        let namespaces: Vec<_> = kinds
            .iter()
            .map(|&kind| {
                oci_spec::runtime::LinuxNamespaceBuilder::default()
                    .typ(kind)
                    .build()
                    .expect("a namespace")
            })
            .collect();
        let linux = oci_spec::runtime::LinuxBuilder::default()
            .namespaces(namespaces)
            .build()
            .expect("linux");
        let mut spec = Spec::default();
        spec.set_linux(Some(linux));
        spec
    }

    /// A spec whose process has `bounding` (as containerd writes it) and the other settings.
    fn with_security(bounding: &[&str], read_only: bool, no_new_privileges: bool) -> Spec {
        let caps: Vec<String> = bounding.iter().map(|c| format!("CAP_{c}")).collect();
        serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs", "readonly": read_only},
            "process": {
                "cwd": "/", "args": ["sh"], "user": {"uid": 0, "gid": 0},
                "noNewPrivileges": no_new_privileges,
                "capabilities": {"bounding": caps, "effective": caps, "permitted": caps}
            }
        }))
        .expect("a spec")
    }

    /// containerd's default capabilities (Docker's).
    const CONTAINERD_DEFAULT: &[&str] = &[
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
    ];

    #[test]
    fn a_pods_security_context_reaches_the_sandbox() {
        let plain = security(&with_security(CONTAINERD_DEFAULT, false, false)).expect("plain");
        assert!(plain.is_default(), "{plain:?}");
        let strict = security(&with_security(&[], true, true)).expect("restricted");
        // As containerd writes `drop: [ALL]`: the empty set left out.
        let omitted: Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"cwd": "/", "args": ["sh"], "user": {"uid": 0, "gid": 0},
                        "capabilities": {}}
        }))
        .expect("a spec");
        assert_eq!(
            security(&omitted).expect("no capabilities").capabilities,
            Some(Vec::new())
        );
        assert_eq!(
            strict,
            api_types::ContainerSecurity {
                read_only_root: true,
                no_new_privileges: true,
                capabilities: Some(Vec::new()),
                ..api_types::ContainerSecurity::default()
            }
        );
        let some = security(&with_security(&["CHOWN", "NET_RAW"], false, false)).expect("drop");
        assert_eq!(some.capabilities, Some(vec!["CAP_CHOWN".to_string()]));
        let mut more = CONTAINERD_DEFAULT.to_vec();
        more.push("NET_ADMIN");
        let added = security(&with_security(&more, false, false)).expect("NET_ADMIN");
        let mut every: Vec<String> = more.iter().map(|c| format!("CAP_{c}")).collect();
        every.sort();
        // Beyond Docker's default: every name as asked, the three a sandbox leaves out of
        // its default included.
        assert_eq!(added.capabilities, Some(every));
    }

    #[test]
    fn a_seccomp_profile_reaches_the_daemon_as_oci_names_it() {
        let with = |seccomp: serde_json::Value| -> Spec {
            serde_json::from_value(serde_json::json!({
                "ociVersion": "1.0.2",
                "process": {"cwd": "/", "args": ["sh"], "user": {"uid": 0, "gid": 0}},
                "linux": {"seccomp": seccomp}
            }))
            .expect("a spec")
        };
        // critest's profile that denies chmod, with an argument rule added.
        let spec = with(serde_json::json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [
                {"names": ["chmod", "fchmodat"], "action": "SCMP_ACT_ERRNO"},
                {"names": ["personality"], "action": "SCMP_ACT_ERRNO", "errnoRet": 22,
                 "args": [{"index": 0, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]}
            ]
        }));
        let profile = security(&spec)
            .expect("a profile")
            .seccomp
            .expect("seccomp");
        assert_eq!(
            serde_json::to_value(&profile).expect("json"),
            serde_json::json!({
                "default_action": "SCMP_ACT_ALLOW",
                "syscalls": [
                    {"names": ["chmod", "fchmodat"], "action": "SCMP_ACT_ERRNO"},
                    {"names": ["personality"], "action": "SCMP_ACT_ERRNO", "errno_ret": 22,
                     "args": [{"index": 0, "value": 8, "value_two": 0, "op": "SCMP_CMP_EQ"}]}
                ]
            })
        );
        let notifying = with(serde_json::json!({
            "defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/seccomp.sock"
        }));
        let err = security(&notifying).expect_err("a listener");
        assert!(
            err.to_string().contains("linux.seccomp.listenerPath"),
            "{err}"
        );
    }

    #[test]
    fn masked_and_read_only_paths_reach_the_sandbox_and_a_microvm_keeps_its_kernels() {
        let spec: Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"cwd": "/", "args": ["sh"], "user": {"uid": 0, "gid": 0}},
            "linux": {
                "maskedPaths": ["/proc/kcore", "/sys/firmware", "/bin/ls"],
                "readonlyPaths": ["/proc/sys", "/tmp"]
            }
        }))
        .expect("a spec");
        let asked = security(&spec).expect("paths");
        assert_eq!(
            asked.masked_paths,
            ["/proc/kcore", "/sys/firmware", "/bin/ls"]
        );
        assert_eq!(asked.read_only_paths, ["/proc/sys", "/tmp"]);
        let microvm = for_microvm(asked);
        assert_eq!(microvm.masked_paths, ["/bin/ls"]);
        assert_eq!(microvm.read_only_paths, ["/tmp"]);
        let procfs_like = for_microvm(api_types::ContainerSecurity {
            masked_paths: vec!["/processes".into(), "/sys".into()],
            ..api_types::ContainerSecurity::default()
        });
        assert_eq!(procfs_like.masked_paths, ["/processes"]);
    }

    #[test]
    fn a_pods_network_is_cnis_namespace_the_nodes_or_its_own() {
        use oci_spec::runtime::LinuxNamespaceType::{Ipc, Mount, Network, Pid, Uts};
        assert_eq!(
            pod_network_namespace(&with_namespaces(&[Pid, Ipc, Uts, Mount, Network])),
            None,
            "a network namespace without a path: one of its own"
        );
        assert_eq!(
            pod_network_namespace(&with_namespaces(&[Pid, Ipc, Uts, Mount])).as_deref(),
            Some("host"),
            "hostNetwork: containerd leaves the network namespace out"
        );
        let mut cni = with_namespaces(&[Pid, Network]);
        if let Some(linux) = cni.linux_mut() {
            let namespaces = linux.namespaces().clone().map(|mut namespaces| {
                namespaces[1].set_path(Some("/var/run/netns/cni-1".into()));
                namespaces
            });
            linux.set_namespaces(namespaces);
        }
        assert_eq!(
            pod_network_namespace(&cni).as_deref(),
            Some("/var/run/netns/cni-1")
        );
    }

    #[test]
    fn a_pod_asking_for_the_nodes_pid_or_ipc_namespace_is_refused_naming_the_field() {
        use oci_spec::runtime::LinuxNamespaceType::{Ipc, Mount, Network, Pid, Uts};
        refuse_host_namespaces(&with_namespaces(&[Pid, Ipc, Uts, Mount, Network]))
            .expect("a pod with its own namespaces");
        refuse_host_namespaces(&with_namespaces(&[Pid, Ipc, Uts, Mount]))
            .expect("hostNetwork is not refused here");
        let text = |kinds: &[oci_spec::runtime::LinuxNamespaceType]| {
            refuse_host_namespaces(&with_namespaces(kinds))
                .expect_err("refused")
                .to_string()
        };
        let pid = text(&[Ipc, Uts, Mount, Network]);
        assert!(pid.contains("hostPID") && !pid.contains("hostIPC"), "{pid}");
        let both = text(&[Uts, Mount, Network]);
        assert!(both.contains("hostPID, hostIPC"), "{both}");
    }

    #[test]
    fn a_member_joins_the_pods_pid_namespace_when_its_spec_names_one() {
        use oci_spec::runtime::LinuxNamespaceType::{Ipc, Pid};
        assert!(!joins_pod_pid_namespace(&with_namespaces(&[Pid, Ipc])));
        let mut spec = with_namespaces(&[Ipc]);
        assert!(!joins_pod_pid_namespace(&spec), "no pid namespace at all");
        let pause = oci_spec::runtime::LinuxNamespaceBuilder::default()
            .typ(Pid)
            .path("/proc/4242/ns/pid")
            .build()
            .expect("a namespace");
        if let Some(linux) = spec.linux_mut() {
            linux
                .namespaces_mut()
                .get_or_insert_with(Vec::new)
                .push(pause);
        }
        assert!(joins_pod_pid_namespace(&spec));
        assert!(
            !joins_pod_pid_namespace(&Spec::default()),
            "{:?}",
            "no linux section"
        );
    }

    #[test]
    fn memory_rounds_up_to_whole_mib_within_the_daemons_bounds() {
        assert_eq!(memory_mib(Some(33_554_432)), Some(32));
        assert_eq!(memory_mib(Some(33_554_433)), Some(33));
        assert_eq!(memory_mib(Some(1)), Some(16));
        assert_eq!(memory_mib(Some(64 << 30)), Some(16384));
        assert_eq!(memory_mib(Some(-1)), None, "-1 is unlimited");
        assert_eq!(memory_mib(Some(0)), None);
        assert_eq!(memory_mib(None), None);
    }

    #[test]
    fn cpus_round_up_to_whole_vcpus() {
        assert_eq!(vcpus(Some(50_000), Some(100_000)), Some(1));
        assert_eq!(vcpus(Some(150_000), Some(100_000)), Some(2));
        assert_eq!(vcpus(Some(200_000), Some(100_000)), Some(2));
        assert_eq!(vcpus(Some(10_000_000), Some(100_000)), Some(16));
        assert_eq!(vcpus(Some(-1), Some(100_000)), None);
        assert_eq!(vcpus(None, Some(100_000)), None);
        assert_eq!(
            vcpus(Some(300_000), None),
            Some(3),
            "the CFS default period"
        );
    }

    #[test]
    fn limits_come_from_linux_resources() {
        let spec: Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "linux": {"resources": {
                "memory": {"limit": 33554432},
                "cpu": {"quota": 50000, "period": 100000}
            }}
        }))
        .expect("a spec");
        assert_eq!(limits(&spec), (Some(32), Some(1)));
        assert_eq!(user(&spec), None, "root is the default");
        let builder: Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "user": {"uid": 1000, "gid": 50}}
        }))
        .expect("a spec");
        assert_eq!(user(&builder).as_deref(), Some("1000:50"));
        let bare: Spec =
            serde_json::from_value(serde_json::json!({"ociVersion": "1.0.2"})).expect("a spec");
        assert_eq!(limits(&bare), (None, None));
    }

    #[test]
    fn the_process_user_and_rlimits_carry_over() {
        let process = exec_process(
            br#"{"args":["sh"],"cwd":"/","user":{"uid":1000,"gid":50,"additionalGids":[7]},
                 "rlimits":[{"type":"RLIMIT_NOFILE","hard":1024,"soft":512},
                            {"type":"RLIMIT_CORE","hard":0,"soft":0}]}"#,
        )
        .expect("an OCI process");
        let request = exec_request(&process, "").expect("a request");
        assert_eq!(request.user, "1000:50");
        assert_eq!(request.group_add, ["7"]);
        assert_eq!(request.exec_id, "init");
        assert_eq!(
            request.rlimits,
            [
                wire::Rlimit {
                    kind: "RLIMIT_NOFILE".into(),
                    soft: 512,
                    hard: 1024
                },
                wire::Rlimit {
                    kind: "RLIMIT_CORE".into(),
                    soft: 0,
                    hard: 0
                }
            ]
        );
        let too_many = exec_process(
            br#"{"args":["sh"],"cwd":"/","user":{"uid":0,"gid":0},
                 "rlimits":[{"type":"RLIMIT_NOFILE","hard":1,"soft":2}]}"#,
        )
        .expect("an OCI process");
        assert!(matches!(
            exec_request(&too_many, ""),
            Err(ShimError::Invalid(_))
        ));
    }

    #[test]
    fn env_entries_split_at_the_first_equals() {
        let env = env_map(&[
            "PATH=/bin:/usr/bin".into(),
            "EQ=a=b".into(),
            "EMPTY=".into(),
            "NOEQUALS".into(),
            "=nokey".into(),
        ]);
        assert_eq!(env.get("PATH").map(String::as_str), Some("/bin:/usr/bin"));
        assert_eq!(env.get("EQ").map(String::as_str), Some("a=b"));
        assert_eq!(env.get("EMPTY").map(String::as_str), Some(""));
        assert_eq!(env.len(), 3);
    }

    #[test]
    fn a_process_becomes_an_exec_request_on_a_terminal_when_it_asks_for_one() {
        let process = exec_process(
            br#"{"args":["sh","-c","echo hi"],"env":["A=1"],"cwd":"/tmp","user":{"uid":0,"gid":0}}"#,
        )
        .expect("an OCI process");
        let request = exec_request(&process, "e1").expect("a request");
        assert_eq!(request.cmd, ["sh", "-c", "echo hi"]);
        assert_eq!(request.user, "0:0");
        assert_eq!(request.exec_id, "x.e1");
        assert!(request.rlimits.is_empty());
        assert_eq!(request.cwd, "/tmp");
        assert_eq!(request.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(request.timeout_s, 0);

        assert!(!request.tty && request.tty_size.is_none());

        let terminal = exec_process(
            br#"{"terminal":true,"consoleSize":{"height":30,"width":100},"args":["sh"],"cwd":"/","user":{"uid":0,"gid":0}}"#,
        )
        .expect("an OCI process");
        let on_terminal = exec_request(&terminal, "").expect("a request");
        assert!(on_terminal.tty);
        assert_eq!(
            on_terminal.tty_size,
            Some(wire::TerminalSize {
                rows: 30,
                cols: 100
            })
        );
        let empty = exec_process(br#"{"args":[],"cwd":"/","user":{"uid":0,"gid":0}}"#)
            .expect("an OCI process");
        assert!(matches!(
            exec_request(&empty, ""),
            Err(ShimError::Invalid(_))
        ));
        assert!(exec_process(b"not json").is_err());
    }
}
