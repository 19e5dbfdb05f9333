"""The JSON types of the crucible API 0.1.0, generated from docs/openapi.json.

Do not edit: run `python3 sdks/python/tools/gen_models.py` (CI runs it with --check).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, TypeVar

_T = TypeVar("_T")


def _opt(value: Any, load: Callable[[Any], _T]) -> _T | None:
    return None if value is None else load(value)


#: Where a sandbox's agent runs.
BackendKind = Literal["microvm", "namespace", "process"]


#: Where a container is in its life.
ContainerState = Literal["waiting", "starting", "ready", "exited", "failed"]


#: Whether a command still runs.
ExecState = Literal["running", "exited"]


#: How a host path takes the host's later mounts (Kubernetes' `mountPropagation`; its
#: `Bidirectional` is refused: it would let the sandbox mount on the host).
HostPathPropagation = Literal["private", "host_to_container"]


#: What runs a microVM sandbox's guest.
Hypervisor = Literal["crucible-vmm", "qemu-tcg"]


#: What a command does when the connection that started it drops.
OnDisconnect = Literal["keep", "kill"]


#: `"restart"` of a container.
RestartPolicy = Literal["no", "on-failure"]


#: A sandbox's lifecycle state.
SandboxState = Literal["running", "stopping", "dead"]


@dataclass
class CacheInfo:
    """A named cache, as `GET /caches` lists it."""

    #: The backend whose sandboxes use it: a microVM's cache is written block by block by its
    #: guest, so it is never mounted by the host kernel for a namespace sandbox (the same name
    #: on the two backends is two caches).
    backend: BackendKind

    #: When it was made, Unix milliseconds.
    created_at_ms: int

    #: Its name.
    name: str

    #: The API key it belongs to (`"unix"` for the Unix socket without a key).
    owner: str

    #: Its size limit.
    size_mib: int

    #: Host disk it takes now (its image is sparse), in MiB, rounded up.
    used_mib: int

    #: The first of the sandboxes using it now, if any.
    in_use_by: str | None = None

    #: The sandbox whose copy it last became (since the daemon started): the first of those
    #: running at once to end.
    saved_by: str | None = None

    #: Every sandbox using it now, each on a copy of its own made when it started.
    users: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheInfo:
        return cls(
            backend=data['backend'],
            created_at_ms=data['created_at_ms'],
            name=data['name'],
            owner=data['owner'],
            size_mib=data['size_mib'],
            used_mib=data['used_mib'],
            in_use_by=data.get('in_use_by', None),
            saved_by=data.get('saved_by', None),
            users=list(data.get('users', [])),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['backend'] = self.backend
        out['created_at_ms'] = self.created_at_ms
        out['name'] = self.name
        out['owner'] = self.owner
        out['size_mib'] = self.size_mib
        out['used_mib'] = self.used_mib
        if self.in_use_by is not None:
            out['in_use_by'] = self.in_use_by
        if self.saved_by is not None:
            out['saved_by'] = self.saved_by
        if self.users:
            out['users'] = list(self.users)
        return out


@dataclass
class CacheList:
    """The body of `GET /caches`."""

    #: The caller's caches (every cache for the admin key and the Unix socket), by name.
    caches: list[CacheInfo]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheList:
        return cls(
            caches=[CacheInfo.from_dict(x) for x in data['caches']],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['caches'] = [x.to_dict() for x in self.caches]
        return out


@dataclass
class CacheMount:
    """A named cache mounted into a sandbox."""

    # The daemon refuses unknown fields in this body.

    #: The cache's name: 1 to 64 of `[A-Za-z0-9._-]`, not starting with `.`; caches belong to
    #: the API key that made them.
    name: str

    #: Where it appears inside the sandbox (absolute).
    path: str

    #: Whether this sandbox's copy may become the cache when it ends (default `true`; the
    #: first of the sandboxes using the cache at once to end wins). `false` for a job that
    #: only reads it:
    #: its writes stay its own, and it never stands in the way of the jobs that fill it.
    save: bool | None = None

    #: Its size limit when this request creates it; default from the daemon. An existing
    #: cache keeps the size it was made with.
    size_mib: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheMount:
        return cls(
            name=data['name'],
            path=data['path'],
            save=data.get('save', None),
            size_mib=data.get('size_mib', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['name'] = self.name
        out['path'] = self.path
        if self.save is not None:
            out['save'] = self.save
        if self.size_mib is not None:
            out['size_mib'] = self.size_mib
        return out


@dataclass
class ContainerInfo:
    """A container, as `GET /sandboxes/{id}/containers` and a sandbox's `containers` show it."""

    #: Its main process's command line (empty: it has none).
    command: list[str]

    #: Its image.
    image: str

    #: Its name.
    name: str

    #: How many times its main process was started again.
    restarts: int

    #: Where it is in its life.
    state: ContainerState

    #: Why it failed, or why its main process could not run.
    error: str | None = None

    #: The exec id of its main process (`GET …/execs/{exec_id}?container=NAME`).
    exec_id: str | None = None

    #: Its main process's last exit status (-1: killed by a signal or never started).
    exit_code: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContainerInfo:
        return cls(
            command=list(data['command']),
            image=data['image'],
            name=data['name'],
            restarts=data['restarts'],
            state=data['state'],
            error=data.get('error', None),
            exec_id=data.get('exec_id', None),
            exit_code=data.get('exit_code', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command'] = list(self.command)
        out['image'] = self.image
        out['name'] = self.name
        out['restarts'] = self.restarts
        out['state'] = self.state
        if self.error is not None:
            out['error'] = self.error
        if self.exec_id is not None:
            out['exec_id'] = self.exec_id
        if self.exit_code is not None:
            out['exit_code'] = self.exit_code
        return out


@dataclass
class ContainerList:
    """The body of `GET /sandboxes/{id}/containers`."""

    #: Its containers, in the order they were asked for.
    containers: list[ContainerInfo]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContainerList:
        return cls(
            containers=[ContainerInfo.from_dict(x) for x in data['containers']],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['containers'] = [x.to_dict() for x in self.containers]
        return out


@dataclass
class ContainerRequest:
    """One entry of `"containers"` in a create request."""

    # The daemon refuses unknown fields in this body.

    #: Its name, used as `?container=NAME`: 1 to 63 of `a-z`, `0-9` and `-`, starting and
    #: ending with a letter or a digit; not `main` (the sandbox's own root).
    name: str

    #: Its main process's arguments, replacing the image's `Cmd` (Docker's `command`). With
    #: neither this nor an entrypoint (the request's or the image's), the container has no
    #: main process: it is a root to run commands in.
    command: list[str] | None = None

    #: Its first command (its `command`, or the first exec in it) is PID 1 of its PID
    #: namespace, as under runc and `docker run`, instead of its agent, which stays outside
    #: that namespace: a signal reaches it as a PID 1 receives one (one it has no handler for
    #: is ignored, but `SIGKILL`), and when it exits every process of the container ends and
    #: no command can start there again. What the Kubernetes shim asks for each container.
    #: Namespace backend only; not with `share_process_namespace` or a `restart` other than
    #: `"no"` (`400`).
    command_is_pid1: bool | None = None

    #: The directory its main process and commands start in, over its image's `WorkingDir`.
    cwd: str | None = None

    #: Containers that must be ready before its main process starts.
    depends_on: list[str] = field(default_factory=list)

    #: Its main process's entrypoint, replacing the image's `Entrypoint`.
    entrypoint: list[str] | None = None

    #: Environment of its main process and of every command run in it, over the sandbox's
    #: `env` and its image's `Env`: at most 1,024 variables and 64 KiB of names and values.
    env: dict[str, str] = field(default_factory=dict)

    #: Host directories it mounts (Kubernetes `hostPath` volumes): at most 16, each
    #: idmapped so that host uid 0 is the sandbox's root (what the sandbox's root writes
    #: there is the host root's), `nosuid` and `nodev`. Namespace backend, and only for a
    #: container added to a running sandbox (`POST /sandboxes/{id}/containers`); only the
    #: admin key or the daemon's Unix socket may ask (`403` otherwise).
    host_paths: list[HostPath] = field(default_factory=list)

    #: Its image: `"default"` (also when absent) or one imported with `POST /images`.
    image: str | None = None

    #: When it counts as ready; absent: once its main process has started.
    ready: ReadyCheck | None = None

    #: What happens when its main process exits: `no` (default) or `on-failure` (started
    #: again after a non-zero exit, after 0.1 s, doubling to at most 10 s).
    restart: RestartPolicy = 'no'

    #: What its processes may do, as a Kubernetes container's `securityContext` asks: within
    #: the sandbox's own rules, never beyond them. Namespace backend only (a microVM answers
    #: `400`).
    security: ContainerSecurity | None = None

    #: It joins the PID namespace of the sandbox's own root (`main`, whose agent is its PID
    #: 1), as a member of a Kubernetes pod with `shareProcessNamespace`: it sees, and may
    #: signal, the processes of `main` and of every container that joined, and they see its.
    #: Default `false`: a PID namespace of its own (the sandbox's `share_process_namespace`
    #: makes every container join).
    share_process_namespace: bool | None = None

    #: Shared directories it mounts.
    shared: list[SharedMount] = field(default_factory=list)

    #: Who its main process and commands run as (`uid`, `uid:gid`, `name`, `name:group`,
    #: resolved against its image's accounts), over its image's `User`.
    user: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContainerRequest:
        return cls(
            name=data['name'],
            command=_opt(data.get('command'), list),
            command_is_pid1=data.get('command_is_pid1', None),
            cwd=data.get('cwd', None),
            depends_on=list(data.get('depends_on', [])),
            entrypoint=_opt(data.get('entrypoint'), list),
            env=dict(data.get('env', {})),
            host_paths=[HostPath.from_dict(x) for x in data.get('host_paths', [])],
            image=data.get('image', None),
            ready=_opt(data.get('ready'), ReadyCheck.from_dict),
            restart=data.get('restart', 'no'),
            security=_opt(data.get('security'), ContainerSecurity.from_dict),
            share_process_namespace=data.get('share_process_namespace', None),
            shared=[SharedMount.from_dict(x) for x in data.get('shared', [])],
            user=data.get('user', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['name'] = self.name
        if self.command is not None:
            out['command'] = None if self.command is None else list(self.command)
        if self.command_is_pid1 is not None:
            out['command_is_pid1'] = self.command_is_pid1
        if self.cwd is not None:
            out['cwd'] = self.cwd
        if self.depends_on:
            out['depends_on'] = list(self.depends_on)
        if self.entrypoint is not None:
            out['entrypoint'] = None if self.entrypoint is None else list(self.entrypoint)
        if self.env:
            out['env'] = dict(self.env)
        if self.host_paths:
            out['host_paths'] = [x.to_dict() for x in self.host_paths]
        if self.image is not None:
            out['image'] = self.image
        if self.ready is not None:
            out['ready'] = None if self.ready is None else self.ready.to_dict()
        if self.restart != 'no':
            out['restart'] = self.restart
        if self.security is not None:
            out['security'] = None if self.security is None else self.security.to_dict()
        if self.share_process_namespace is not None:
            out['share_process_namespace'] = self.share_process_namespace
        if self.shared:
            out['shared'] = [x.to_dict() for x in self.shared]
        if self.user is not None:
            out['user'] = self.user
        return out


@dataclass
class ContainerSecurity:
    """`"security"` of a container. Each setting only takes away from what the sandbox allows."""

    # The daemon refuses unknown fields in this body.

    #: The capabilities its commands may hold at most (their bounding set): names as Docker
    #: and Kubernetes write them (`CAP_CHOWN` or `CHOWN`, any case), `ALL` for the whole set
    #: a sandbox grants by default (`CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `FSETID`, `KILL`,
    #: `SETGID`, `SETUID`, `SETPCAP`, `NET_BIND_SERVICE`, `SYS_CHROOT`, `SETFCAP`), `[]` for
    #: none. Any other capability (`SYS_ADMIN`, `NET_ADMIN`, …) is granted too, within the
    #: sandbox's user namespace: it acts on what the sandbox owns (its hostname, its own
    #: network namespace), never on the host's, and the sandbox's seccomp filter still
    #: refuses mounts, new namespaces, the keyring, `bpf`, packet and netfilter sockets. A
    #: name that is no Linux capability is a `400` naming it. Absent: the default set.
    capabilities: list[str] | None = None

    #: Paths hidden from it (OCI's and Kubernetes' `maskedPaths`): a directory is covered by
    #: an empty read-only tmpfs, anything else by `/dev/null`. A path missing from its root is left
    #: alone, as runc does; a symlink is followed within the root. At most 64, each absolute,
    #: at most 256 bytes of ASCII letters, digits and `/._-,@:`, with no `.` or `..`. Its
    #: `/proc` already hides what runc's defaults hide (`/proc/kcore`, `/proc/keys`, …).
    masked_paths: list[str] = field(default_factory=list)

    #: No process of it gains privileges through `execve`: a setuid binary runs with its
    #: caller's ids, file capabilities are not granted (`allowPrivilegeEscalation: false`,
    #: `--security-opt no-new-privileges`).
    no_new_privileges: bool | None = None

    #: Paths of it made read-only (OCI's `readonlyPaths`): each is bound on itself read-only,
    #: the mounts below it included; the same rules as `masked_paths`. Its `/proc` already
    #: has runc's defaults (`/proc/sys`, `/proc/bus`, …) read-only.
    read_only_paths: list[str] = field(default_factory=list)

    #: Its root filesystem is mounted read-only (`readOnlyRootFilesystem`, `docker run
    #: --read-only`): a write there fails with `EROFS`. Its shared directories, `/tmp`,
    #: `/dev/shm` and `/proc` are mounts of their own and keep their modes.
    read_only_root: bool | None = None

    #: A seccomp profile of its own (OCI's `linux.seccomp`, Docker's `--security-opt
    #: seccomp=FILE`, a Kubernetes `Localhost` or `RuntimeDefault` profile), stacked on the
    #: sandbox's own filter: a call must pass both, so a profile can refuse more but never
    #: allow what the sandbox refuses (no profile makes a container unconfined). It binds the
    #: container's agent too, as runc's binds a container's init: a profile that refuses
    #: what starting a command takes (`execve`, `clone`, `wait4`, …) leaves the container
    #: unable to run one.
    seccomp: SeccompProfile | None = None

    #: Files that stay writable when its root is read-only, as kubelet's `/etc/hosts`,
    #: `/etc/hostname` and `/etc/resolv.conf` do: each becomes a mount of its own, on a tmpfs
    #: of the container's (1 MiB for them all), holding the image's file (empty if the image
    #: has none). A symlink is followed within the root; a file is written in place (`PUT`
    #: of `/files` too), never replaced. The same rules as `masked_paths`.
    writable_files: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContainerSecurity:
        return cls(
            capabilities=_opt(data.get('capabilities'), list),
            masked_paths=list(data.get('masked_paths', [])),
            no_new_privileges=data.get('no_new_privileges', None),
            read_only_paths=list(data.get('read_only_paths', [])),
            read_only_root=data.get('read_only_root', None),
            seccomp=_opt(data.get('seccomp'), SeccompProfile.from_dict),
            writable_files=list(data.get('writable_files', [])),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.capabilities is not None:
            out['capabilities'] = None if self.capabilities is None else list(self.capabilities)
        if self.masked_paths:
            out['masked_paths'] = list(self.masked_paths)
        if self.no_new_privileges is not None:
            out['no_new_privileges'] = self.no_new_privileges
        if self.read_only_paths:
            out['read_only_paths'] = list(self.read_only_paths)
        if self.read_only_root is not None:
            out['read_only_root'] = self.read_only_root
        if self.seccomp is not None:
            out['seccomp'] = None if self.seccomp is None else self.seccomp.to_dict()
        if self.writable_files:
            out['writable_files'] = list(self.writable_files)
        return out


@dataclass
class CpuStats:
    """A sandbox's CPU time, all its processes together, since it was made."""

    #: Nanoseconds of CPU time.
    usage_ns: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CpuStats:
        return cls(
            usage_ns=data['usage_ns'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['usage_ns'] = self.usage_ns
        return out


@dataclass
class CreateSandbox:
    """The body of `POST /sandboxes`; every field is optional and `{}` gives a working sandbox."""

    # The daemon refuses unknown fields in this body.

    #: Backend; default: the best one this host offers.
    backend: BackendKind | None = None

    #: Named caches to mount: persistent, daemon-managed, size-limited; sandboxes at once each
    #: mount a copy as last saved, and the first to end saves its copy back.
    caches: list[CacheMount] = field(default_factory=list)

    #: A microVM's room for containers added once it runs (`POST
    #: /sandboxes/{id}/containers`): this many empty read-only disks are attached at boot,
    #: and each added container's image fills one (a microVM's disks are fixed when it
    #: boots). They count toward its 6 disks beside the root, with caches, volumes,
    #: `disk_mib` and the containers given here. Default 0. A namespace sandbox takes added
    #: containers without it.
    container_slots: int | None = None

    #: Containers besides the sandbox's own root (its `main`, made of `image`): each its own
    #: image, root, main process and log, all sharing the sandbox's network (`localhost`),
    #: IPC, limits and the shared directories they mount. Both backends (the process backend
    #: of the tests runs none). At most 16, with those added later.
    containers: list[ContainerRequest] = field(default_factory=list)

    #: A disk-backed writable layer of this many MiB (a sparse file on the host's disk)
    #: instead of the default memory-backed one; for builds and checkouts bigger than memory.
    disk_mib: int | None = None

    #: Environment added to every command run in the sandbox: at most 1,024 variables and
    #: 64 KiB of names and values.
    env: dict[str, str] = field(default_factory=dict)

    #: Its hostname (what `hostname` prints and `$HOSTNAME` holds in it and its containers):
    #: 1 to 64 bytes, dot-separated labels of letters, digits and `-`, each 1 to 63 bytes and
    #: neither starting nor ending with `-`. Default: the sandbox's id.
    hostname: str | None = None

    #: Image name: `"default"` (the built-in image, also when absent) or one imported with
    #: `POST /images`.
    image: str | None = None

    #: Free-form labels, returned as given: at most 64, keys of 1 to 128 bytes, 16 KiB of
    #: keys and values in all.
    labels: dict[str, str] = field(default_factory=dict)

    #: Memory limit (guest RAM for a microVM, cgroup limit for a namespace sandbox).
    memory_mib: int | None = None

    #: Egress through the daemon's proxy; absent: the sandbox reaches no network at all.
    network: NetworkRequest | None = None

    #: A network namespace on the host whose network the sandbox uses: the path of a
    #: namespace file (a bind mount of `/proc/PID/ns/net`), such as the one CNI configured for
    #: a Kubernetes pod. Its IPv4 addresses become the sandbox's (on an `eth0` linked to it),
    #: it routes them to the sandbox, and the sandbox can change nothing of it; ports below
    #: 1024 may be bound. A microVM instead gets egress through its agent's proxy, each
    #: connection opened from that namespace, with no allowlist. `"host"`: the daemon's own
    #: network namespace (a Kubernetes `hostNetwork` pod; namespace backend): it listens and
    #: connects as a host process does, changes nothing of the host's network, may not bind
    #: ports below 1024 and takes no `net.*` sysctl (a `400`); the host's namespace named by
    #: its file is refused. Never with `network`; only the admin key and the daemon's Unix
    #: socket may ask (`403` otherwise): the host's network, or a host path, is theirs to give.
    network_namespace: str | None = None

    #: One PID namespace for the sandbox's own root and every container, as Kubernetes'
    #: `shareProcessNamespace`: each member then sees, and may signal, the others' processes
    #: (their `/proc/PID/root` and environment too), the sandbox's agent being PID 1. Default
    #: `false`: each member has a PID namespace of its own and sees none of the others'.
    share_process_namespace: bool | None = None

    #: Shared directories mounted in the sandbox's own root (see a container's `shared`).
    shared: list[SharedMount] = field(default_factory=list)

    #: Kernel settings of the sandbox's own namespaces, written before anything runs in it,
    #: as a Kubernetes pod's `sysctls`: only namespaced ones (`kernel.shm*`, `kernel.msg*`,
    #: `kernel.sem`, `fs.mqueue.*`, `net.*`), at most 64, each value one line of at most 256
    #: bytes; anything else is a `400` naming it. Namespace backend only.
    sysctls: dict[str, str] = field(default_factory=dict)

    #: Lifetime in seconds, after which the sandbox is deleted; default from the daemon.
    ttl_s: int | None = None

    #: Who every command runs as, as `docker run --user` takes it: `uid`, `uid:gid`, `name` or
    #: `name:group`, resolved against the image's `/etc/passwd` and `/etc/group` (a bare uid
    #: need not be there: its group is then 0). Overrides the image's `User`; `HOME` follows
    #: the user unless the image's `Env` sets it.
    user: str | None = None

    #: vCPUs (microVM) or CPU quota in whole CPUs (namespace).
    vcpus: int | None = None

    #: Read-only volumes the operator declared (`crucible serve --volume NAME=DIR:ro`): the
    #: live directory in a namespace sandbox; in a microVM a read-only snapshot of it, taken
    #: the first time a microVM asks for it after the daemon started.
    volumes: list[VolumeMount] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CreateSandbox:
        return cls(
            backend=data.get('backend', None),
            caches=[CacheMount.from_dict(x) for x in data.get('caches', [])],
            container_slots=data.get('container_slots', None),
            containers=[ContainerRequest.from_dict(x) for x in data.get('containers', [])],
            disk_mib=data.get('disk_mib', None),
            env=dict(data.get('env', {})),
            hostname=data.get('hostname', None),
            image=data.get('image', None),
            labels=dict(data.get('labels', {})),
            memory_mib=data.get('memory_mib', None),
            network=_opt(data.get('network'), NetworkRequest.from_dict),
            network_namespace=data.get('network_namespace', None),
            share_process_namespace=data.get('share_process_namespace', None),
            shared=[SharedMount.from_dict(x) for x in data.get('shared', [])],
            sysctls=dict(data.get('sysctls', {})),
            ttl_s=data.get('ttl_s', None),
            user=data.get('user', None),
            vcpus=data.get('vcpus', None),
            volumes=[VolumeMount.from_dict(x) for x in data.get('volumes', [])],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.backend is not None:
            out['backend'] = self.backend
        if self.caches:
            out['caches'] = [x.to_dict() for x in self.caches]
        if self.container_slots is not None:
            out['container_slots'] = self.container_slots
        if self.containers:
            out['containers'] = [x.to_dict() for x in self.containers]
        if self.disk_mib is not None:
            out['disk_mib'] = self.disk_mib
        if self.env:
            out['env'] = dict(self.env)
        if self.hostname is not None:
            out['hostname'] = self.hostname
        if self.image is not None:
            out['image'] = self.image
        if self.labels:
            out['labels'] = dict(self.labels)
        if self.memory_mib is not None:
            out['memory_mib'] = self.memory_mib
        if self.network is not None:
            out['network'] = None if self.network is None else self.network.to_dict()
        if self.network_namespace is not None:
            out['network_namespace'] = self.network_namespace
        if self.share_process_namespace is not None:
            out['share_process_namespace'] = self.share_process_namespace
        if self.shared:
            out['shared'] = [x.to_dict() for x in self.shared]
        if self.sysctls:
            out['sysctls'] = dict(self.sysctls)
        if self.ttl_s is not None:
            out['ttl_s'] = self.ttl_s
        if self.user is not None:
            out['user'] = self.user
        if self.vcpus is not None:
            out['vcpus'] = self.vcpus
        if self.volumes:
            out['volumes'] = [x.to_dict() for x in self.volumes]
        return out


@dataclass
class DiskStats:
    """A sandbox's writable layer: what `/` (with `/tmp` and `/dev/shm`, where they share it)
    holds beyond the image, in memory or on its `disk_mib` disk. Writes past `limit_bytes`
    fail with `ENOSPC`.
    """

    #: Its size (0 when unknown).
    limit_bytes: int

    #: Bytes written (0 when unknown).
    used_bytes: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DiskStats:
        return cls(
            limit_bytes=data['limit_bytes'],
            used_bytes=data['used_bytes'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['limit_bytes'] = self.limit_bytes
        out['used_bytes'] = self.used_bytes
        return out


@dataclass
class EgressRefusal:
    """A destination a sandbox's egress refused."""

    #: How many connections to it were refused.
    count: int

    #: `host:port`, as the sandbox asked for it.
    destination: str

    #: Why it was refused, as the sandbox's client was told (at most 512 bytes).
    reason: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EgressRefusal:
        return cls(
            count=data['count'],
            destination=data['destination'],
            reason=data['reason'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        out['destination'] = self.destination
        out['reason'] = self.reason
        return out


@dataclass
class ErrorBody:
    """The JSON body of every 4xx/5xx the daemon sends."""

    #: A stable machine-readable code (`"not_found"`, `"invalid_request"`, `"unauthorized"`, …).
    code: str

    #: A human-readable sentence saying what failed and on which input.
    message: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ErrorBody:
        return cls(
            code=data['code'],
            message=data['message'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['code'] = self.code
        out['message'] = self.message
        return out


@dataclass
class ExecList:
    """The commands of a sandbox that can be found by `exec_id`: the answer to
    `GET /sandboxes/{id}/execs` (and the agent's to `execs`).
    """

    #: The commands, oldest first.
    execs: list[ExecStatus]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecList:
        return cls(
            execs=[ExecStatus.from_dict(x) for x in data['execs']],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['execs'] = [x.to_dict() for x in self.execs]
        return out


@dataclass
class ExecRequest:
    """A command to run in the sandbox: the body of `POST /sandboxes/{id}/exec` and the first
    WebSocket message.
    """

    # The daemon refuses unknown fields in this body.

    #: The command and its arguments; `cmd[0]` is resolved on `PATH` inside the guest.
    cmd: list[str]

    #: Working directory; empty inherits the agent's.
    cwd: str = ''

    #: Variables added to (not replacing) the agent's environment.
    env: dict[str, str] = field(default_factory=dict)

    #: A name for the running command, unique in its sandbox while it runs, so that
    #: `POST /sandboxes/{id}/signal {"exec_id": …}` can signal it alone: 1 to 128 letters,
    #: digits, `.`, `_` and `-` (containerd's exec ids fit). Empty: the command has none.
    exec_id: str | None = None

    #: Supplementary groups added for this command, as `docker run --group-add`: gids, or group
    #: names of the image's `/etc/group`; on top of the user's own memberships.
    group_add: list[str] = field(default_factory=list)

    #: What happens to the command when the connection that started it drops (the client
    #: went away, a proxy timed out, the daemon restarted): `keep` runs it on, its output kept
    #: in a bounded tail, and a client re-attaches by `exec_id`; `kill` kills its process
    #: group. Absent: `keep` for a one-shot exec, `kill` for an interactive session (closing
    #: its connection ends it, as the protocol says). An interactive session that asks for
    #: `keep` outlives its connection too: a re-attach (`?stdin=1`) carries its stdin on from
    #: the bytes it took (`ExecStatus::stdin_bytes`), and only `stdin_close` ends its input.
    on_disconnect: OnDisconnect | None = None

    #: Resource limits the command starts with (`setrlimit`), as OCI's `process.rlimits` and
    #: `docker run --ulimit` give them. A limit not listed keeps the agent's default.
    rlimits: list[Rlimit] = field(default_factory=list)

    #: Deadline in seconds after which the agent kills the command's process group; 0 = none.
    timeout_s: int = 0

    #: Whether the command runs on a pseudo-terminal, as `docker exec -t` runs it: the
    #: terminal is its stdin, stdout and stderr and its controlling terminal, so everything
    #: it writes arrives as stdout frames (no stderr frames) with the terminal's line
    #: endings (`\r\n`), and interactive input goes through the terminal's line discipline
    #: (`^C` interrupts, `^D` at the start of a line ends a read). `resize` frames change its
    #: size. `false` (the default): pipes, no terminal.
    tty: bool | None = None

    #: The terminal's size when the command starts; absent: 24 rows of 80 columns. Only with
    #: `tty`.
    tty_size: TerminalSize | None = None

    #: Who the command runs as, as `docker exec --user` takes it: `uid`, `uid:gid`, `name` or
    #: `name:group`, resolved against the sandbox image's `/etc/passwd` and `/etc/group`.
    #: Empty: the sandbox's user (its `user`, else its image's `User`, else root).
    user: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecRequest:
        return cls(
            cmd=list(data['cmd']),
            cwd=data.get('cwd', ''),
            env=dict(data.get('env', {})),
            exec_id=data.get('exec_id', None),
            group_add=list(data.get('group_add', [])),
            on_disconnect=data.get('on_disconnect', None),
            rlimits=[Rlimit.from_dict(x) for x in data.get('rlimits', [])],
            timeout_s=data.get('timeout_s', 0),
            tty=data.get('tty', None),
            tty_size=_opt(data.get('tty_size'), TerminalSize.from_dict),
            user=data.get('user', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['cmd'] = list(self.cmd)
        if self.cwd != '':
            out['cwd'] = self.cwd
        if self.env:
            out['env'] = dict(self.env)
        if self.exec_id is not None:
            out['exec_id'] = self.exec_id
        if self.group_add:
            out['group_add'] = list(self.group_add)
        if self.on_disconnect is not None:
            out['on_disconnect'] = self.on_disconnect
        if self.rlimits:
            out['rlimits'] = [x.to_dict() for x in self.rlimits]
        if self.timeout_s != 0:
            out['timeout_s'] = self.timeout_s
        if self.tty is not None:
            out['tty'] = self.tty
        if self.tty_size is not None:
            out['tty_size'] = None if self.tty_size is None else self.tty_size.to_dict()
        if self.user is not None:
            out['user'] = self.user
        return out


@dataclass
class ExecResult:
    """The payload of the exit frame: how a command ended."""

    #: The exit status; -1 when the process was killed by a signal or never started.
    exit_code: int

    #: Wall time from spawn to exit.
    duration_ms: int = 0

    #: Why the command could not run or was lost; empty on a normal exit.
    error: str = ''

    #: Best-effort: whether the kernel's OOM killer ended the command.
    oom_killed: bool = False

    #: Output bytes this stream never carried: its command outlived a dropped connection and
    #: produced more than the agent keeps before this client attached (absent when none).
    output_dropped_bytes: int | None = None

    #: The signal name (`"SIGKILL"`) when the process was signalled; empty otherwise.
    signal: str = ''

    #: Whether the agent killed the command at its `timeout_s` deadline.
    timed_out: bool = False

    #: Resource usage; `null` when the agent collected none ("no data", not zeroes).
    usage: Usage | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecResult:
        return cls(
            exit_code=data['exit_code'],
            duration_ms=data.get('duration_ms', 0),
            error=data.get('error', ''),
            oom_killed=data.get('oom_killed', False),
            output_dropped_bytes=data.get('output_dropped_bytes', None),
            signal=data.get('signal', ''),
            timed_out=data.get('timed_out', False),
            usage=_opt(data.get('usage'), Usage.from_dict),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['exit_code'] = self.exit_code
        if self.duration_ms != 0:
            out['duration_ms'] = self.duration_ms
        if self.error != '':
            out['error'] = self.error
        if self.oom_killed != False:
            out['oom_killed'] = self.oom_killed
        if self.output_dropped_bytes is not None:
            out['output_dropped_bytes'] = self.output_dropped_bytes
        if self.signal != '':
            out['signal'] = self.signal
        if self.timed_out != False:
            out['timed_out'] = self.timed_out
        if self.usage is not None:
            out['usage'] = None if self.usage is None else self.usage.to_dict()
        return out


@dataclass
class ExecStatus:
    """A command the agent can find by `exec_id`: one that runs, or one that ended while no
    client
    was attached and whose result has not been collected yet.
    """

    #: Whether a client is attached to its output now.
    attached: bool

    #: The command and its arguments.
    cmd: list[str]

    #: Its name.
    exec_id: str

    #: Whether it outlives its connection (`on_disconnect: keep`).
    keep: bool

    #: Output bytes (stdout and stderr payload, in stream order) produced so far: the end of
    #: its output stream, where an attach with `offset` equal to it starts live.
    output_bytes: int

    #: The oldest output byte still kept: an attach from an earlier offset misses the bytes
    #: in between (reported as dropped).
    output_kept_from: int

    #: Its process id inside the sandbox (also its process group).
    pid: int

    #: When it started, in milliseconds since the Unix epoch (the guest's clock).
    started_unix_ms: int

    #: Running or exited.
    state: ExecState

    #: How it ended, once it has.
    result: ExecResult | None = None

    #: An interactive command's stdin: the payload bytes of the stdin frames it had taken
    #: (delivered to it, or queued for it) when its last client left (0 before any did; it
    #: moves on while a client is attached). A client that re-attaches sends its input on
    #: from there: frames it sent past it were lost with the connection. Absent for a
    #: one-shot command.
    stdin_bytes: int | None = None

    #: Whether an interactive command's stdin was closed (`stdin_close`): nothing more is
    #: taken.
    stdin_closed: bool | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecStatus:
        return cls(
            attached=data['attached'],
            cmd=list(data['cmd']),
            exec_id=data['exec_id'],
            keep=data['keep'],
            output_bytes=data['output_bytes'],
            output_kept_from=data['output_kept_from'],
            pid=data['pid'],
            started_unix_ms=data['started_unix_ms'],
            state=data['state'],
            result=_opt(data.get('result'), ExecResult.from_dict),
            stdin_bytes=data.get('stdin_bytes', None),
            stdin_closed=data.get('stdin_closed', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['attached'] = self.attached
        out['cmd'] = list(self.cmd)
        out['exec_id'] = self.exec_id
        out['keep'] = self.keep
        out['output_bytes'] = self.output_bytes
        out['output_kept_from'] = self.output_kept_from
        out['pid'] = self.pid
        out['started_unix_ms'] = self.started_unix_ms
        out['state'] = self.state
        if self.result is not None:
            out['result'] = None if self.result is None else self.result.to_dict()
        if self.stdin_bytes is not None:
            out['stdin_bytes'] = self.stdin_bytes
        if self.stdin_closed is not None:
            out['stdin_closed'] = self.stdin_closed
        return out


@dataclass
class FilesPutResult:
    """The answer to a file upload (`POST /sandboxes/{id}/files`)."""

    #: File content bytes written.
    bytes: int

    #: Directories created.
    dirs: int

    #: Regular files written.
    files: int

    #: Symbolic and hard links created.
    links: int

    #: The guest directory the archive was extracted beneath.
    path: str

    #: Paths written, relative to `path`, in archive order.
    written: list[str]

    #: The first refused entry, if any; extraction stopped there and nothing was written outside
    #: `path`. Entries before it were extracted.
    refused: RefusedEntry | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FilesPutResult:
        return cls(
            bytes=data['bytes'],
            dirs=data['dirs'],
            files=data['files'],
            links=data['links'],
            path=data['path'],
            written=list(data['written']),
            refused=_opt(data.get('refused'), RefusedEntry.from_dict),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['bytes'] = self.bytes
        out['dirs'] = self.dirs
        out['files'] = self.files
        out['links'] = self.links
        out['path'] = self.path
        out['written'] = list(self.written)
        if self.refused is not None:
            out['refused'] = None if self.refused is None else self.refused.to_dict()
        return out


@dataclass
class HostPath:
    """A host directory mounted into a container."""

    # The daemon refuses unknown fields in this body.

    #: Where it appears in the container: a plain absolute path of ASCII letters, digits and
    #: `/._-,@:`, not in `/proc`, `/dev` or `/sys`; the directories on the way are made
    #: (none may be a symlink of the image).
    path: str

    #: The host directory: an absolute path; a symlink to a directory is followed, once, by
    #: the daemon.
    source: str

    #: How mounts the host makes below it later reach the container.
    propagation: HostPathPropagation = 'private'

    #: Mounted read-only.
    read_only: bool | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostPath:
        return cls(
            path=data['path'],
            source=data['source'],
            propagation=data.get('propagation', 'private'),
            read_only=data.get('read_only', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['path'] = self.path
        out['source'] = self.source
        if self.propagation != 'private':
            out['propagation'] = self.propagation
        if self.read_only is not None:
            out['read_only'] = self.read_only
        return out


@dataclass
class ImageInfo:
    """One image a sandbox can be made from."""

    #: Device nodes its layers held that were not created (a sandbox has its own `/dev`).
    dropped_devices: int

    #: Files, directories and links in its unpacked tree.
    entries: int

    #: The environment its sandboxes start with (its config's `Env`).
    env: dict[str, str]

    #: What it was imported from: `builtin` (the daemon's own busybox image), `oci` (an OCI
    #: layout or archive), `docker_save`, or `rootfs` (a tarball or a directory).
    format: str

    #: When it was imported, Unix seconds (0 for the built-in image).
    imported_at: int

    #: Its layers' digests, bottom first (as uploaded: compressed layers by their compressed
    #: bytes).
    layers: list[str]

    #: Its name, as `POST /sandboxes {"image": ...}` gives it.
    name: str

    #: The API key it belongs to (`"unix"` for the Unix socket without a key); the built-in
    #: image belongs to everyone and shows `"*"`.
    owner: str

    #: File content bytes of its unpacked tree.
    size_bytes: int

    #: See `entrypoint`.
    cmd: list[str] | None = None

    #: Its config's `Entrypoint` and `Cmd`, as recorded (nothing runs them: a sandbox runs
    #: what exec asks).
    entrypoint: list[str] | None = None

    #: Its config's digest (the image id Docker shows), if it had a config.
    id: str | None = None

    #: Its name inside the archive (`org.opencontainers.image.ref.name`, or `docker save`'s
    #: first tag), if it had one.
    reference: str | None = None

    #: Who commands run as (its config's `User`, resolved against its own `/etc/passwd`).
    user: ImageUser | None = None

    #: The directory commands run in when a request gives none (its config's `WorkingDir`).
    working_dir: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImageInfo:
        return cls(
            dropped_devices=data['dropped_devices'],
            entries=data['entries'],
            env=dict(data['env']),
            format=data['format'],
            imported_at=data['imported_at'],
            layers=list(data['layers']),
            name=data['name'],
            owner=data['owner'],
            size_bytes=data['size_bytes'],
            cmd=_opt(data.get('cmd'), list),
            entrypoint=_opt(data.get('entrypoint'), list),
            id=data.get('id', None),
            reference=data.get('reference', None),
            user=_opt(data.get('user'), ImageUser.from_dict),
            working_dir=data.get('working_dir', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['dropped_devices'] = self.dropped_devices
        out['entries'] = self.entries
        out['env'] = dict(self.env)
        out['format'] = self.format
        out['imported_at'] = self.imported_at
        out['layers'] = list(self.layers)
        out['name'] = self.name
        out['owner'] = self.owner
        out['size_bytes'] = self.size_bytes
        if self.cmd is not None:
            out['cmd'] = None if self.cmd is None else list(self.cmd)
        if self.entrypoint is not None:
            out['entrypoint'] = None if self.entrypoint is None else list(self.entrypoint)
        if self.id is not None:
            out['id'] = self.id
        if self.reference is not None:
            out['reference'] = self.reference
        if self.user is not None:
            out['user'] = None if self.user is None else self.user.to_dict()
        if self.working_dir is not None:
            out['working_dir'] = self.working_dir
        return out


@dataclass
class ImageList:
    """The body of `GET /images`."""

    #: The built-in image, then the caller's images (every owner's for the admin key and the
    #: Unix socket), by owner and name.
    images: list[ImageInfo]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImageList:
        return cls(
            images=[ImageInfo.from_dict(x) for x in data['images']],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['images'] = [x.to_dict() for x in self.images]
        return out


@dataclass
class ImageUser:
    """The user an image's commands run as."""

    #: The primary group id.
    gid: int

    #: Supplementary group ids.
    groups: list[int]

    #: The config's `User`, as written (`ci`, `1000:1000`, …).
    spec: str

    #: The user id.
    uid: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImageUser:
        return cls(
            gid=data['gid'],
            groups=list(data['groups']),
            spec=data['spec'],
            uid=data['uid'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['gid'] = self.gid
        out['groups'] = list(self.groups)
        out['spec'] = self.spec
        out['uid'] = self.uid
        return out


@dataclass
class ImagesPruned:
    """The answer to `DELETE /images` (prune)."""

    #: What the store took less on disk afterwards (layers and trees no other image shares).
    reclaimed_bytes: int

    #: The names of the images removed.
    removed: list[str]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImagesPruned:
        return cls(
            reclaimed_bytes=data['reclaimed_bytes'],
            removed=list(data['removed']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['reclaimed_bytes'] = self.reclaimed_bytes
        out['removed'] = list(self.removed)
        return out


@dataclass
class MemoryStats:
    """A sandbox's memory: everything its processes and its in-memory writable layer take."""

    #: Page cache within the usage.
    cache_bytes: int

    #: Its limit.
    limit_bytes: int

    #: The most it has used.
    max_usage_bytes: int

    #: Processes the kernel killed for want of memory.
    oom_kills: int

    #: Bytes in use now.
    usage_bytes: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryStats:
        return cls(
            cache_bytes=data['cache_bytes'],
            limit_bytes=data['limit_bytes'],
            max_usage_bytes=data['max_usage_bytes'],
            oom_kills=data['oom_kills'],
            usage_bytes=data['usage_bytes'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['cache_bytes'] = self.cache_bytes
        out['limit_bytes'] = self.limit_bytes
        out['max_usage_bytes'] = self.max_usage_bytes
        out['oom_kills'] = self.oom_kills
        out['usage_bytes'] = self.usage_bytes
        return out


@dataclass
class NetworkInfo:
    """A sandbox's egress: its allowlist, where its proxy listens, and what went through it."""

    #: The sandbox's allowlist, as asked for.
    allow: list[str]

    #: Bytes received by the sandbox from remote hosts.
    bytes_in: int

    #: Bytes sent by the sandbox to remote hosts.
    bytes_out: int

    #: Connections allowed and made.
    connections: int

    #: Connections refused (not allowed, or a private address the operator did not allow).
    denied: int

    #: The proxy URL set as `HTTP_PROXY`/`HTTPS_PROXY` inside.
    proxy: str

    #: The destinations refused, each with the reason its client was given (the first 32
    #: destinations; `denied` counts every refusal).
    refused: list[EgressRefusal] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NetworkInfo:
        return cls(
            allow=list(data['allow']),
            bytes_in=data['bytes_in'],
            bytes_out=data['bytes_out'],
            connections=data['connections'],
            denied=data['denied'],
            proxy=data['proxy'],
            refused=[EgressRefusal.from_dict(x) for x in data.get('refused', [])],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['allow'] = list(self.allow)
        out['bytes_in'] = self.bytes_in
        out['bytes_out'] = self.bytes_out
        out['connections'] = self.connections
        out['denied'] = self.denied
        out['proxy'] = self.proxy
        if self.refused:
            out['refused'] = [x.to_dict() for x in self.refused]
        return out


@dataclass
class NetworkRequest:
    """`"network"` in a create request."""

    # The daemon refuses unknown fields in this body.

    #: Hosts the sandbox may reach through the proxy: names (`crates.io`), wildcards
    #: (`*.pypi.org`: subdomains only), IP literals, each with an optional `:port`. Each must
    #: be within the operator's `--egress-allow` rules.
    allow: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NetworkRequest:
        return cls(
            allow=list(data.get('allow', [])),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.allow:
            out['allow'] = list(self.allow)
        return out


@dataclass
class PidsStats:
    """A sandbox's processes."""

    #: Processes (and threads) now, the agent's included.
    current: int

    #: Its limit (0: none).
    limit: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PidsStats:
        return cls(
            current=data['current'],
            limit=data['limit'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['current'] = self.current
        out['limit'] = self.limit
        return out


@dataclass
class ReadyCheck:
    """`"ready"` of a container: exactly one of `tcp_port` and `command`."""

    # The daemon refuses unknown fields in this body.

    #: Ready once this command, run in the container, exits with 0 (tried at once, then
    #: after 10 ms, the wait doubling to 0.2 s; so is `tcp_port`).
    command: list[str] | None = None

    #: Ready once something accepts connections on this port of the sandbox's loopback.
    tcp_port: int | None = None

    #: How long it may take, in seconds (default 60): a container not ready by then fails
    #: the sandbox's creation, which answers with its log's last lines.
    timeout_s: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReadyCheck:
        return cls(
            command=_opt(data.get('command'), list),
            tcp_port=data.get('tcp_port', None),
            timeout_s=data.get('timeout_s', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.command is not None:
            out['command'] = None if self.command is None else list(self.command)
        if self.tcp_port is not None:
            out['tcp_port'] = self.tcp_port
        if self.timeout_s is not None:
            out['timeout_s'] = self.timeout_s
        return out


@dataclass
class RefusedEntry:
    """A tar entry that `put_files` refused, and why."""

    #: The entry's path as written in the archive.
    path: str

    #: Why it was refused (`"escapes the destination"`, `"device nodes are not allowed"`, …).
    reason: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RefusedEntry:
        return cls(
            path=data['path'],
            reason=data['reason'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['path'] = self.path
        out['reason'] = self.reason
        return out


@dataclass
class Rlimit:
    """One resource limit: `setrlimit(type, {soft, hard})`."""

    # The daemon refuses unknown fields in this body.

    #: The hard limit (how far the command may raise it); at least `soft`.
    hard: int

    #: The soft limit (what the command gets); 18446744073709551615 is unlimited.
    soft: int

    #: The resource, as OCI spells it (`RLIMIT_NOFILE`) or as Docker's `--ulimit` does
    #: (`nofile`).
    type: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rlimit:
        return cls(
            hard=data['hard'],
            soft=data['soft'],
            type=data['type'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['hard'] = self.hard
        out['soft'] = self.soft
        out['type'] = self.type
        return out


@dataclass
class SandboxInfo:
    """A sandbox, as `GET /sandboxes/{id}` and `POST /sandboxes` return it."""

    #: Commands running right now.
    active_execs: int

    #: Which backend runs it.
    backend: BackendKind

    #: Creation time, Unix milliseconds.
    created_at_ms: int

    #: When it will be deleted, Unix milliseconds (TTL or idle timeout, whichever is sooner).
    expires_at_ms: int

    #: `sb-` followed by 16 hex digits.
    id: str

    #: The image it runs.
    image: str

    #: Labels as given at creation.
    labels: dict[str, str]

    #: Memory limit.
    memory_mib: int

    #: Lifecycle state.
    state: SandboxState

    #: Creation timings.
    timings: SandboxTimings

    #: vCPUs.
    vcpus: int

    #: Its caches.
    caches: list[CacheMount] = field(default_factory=list)

    #: Its containers besides its own root, when it has any.
    containers: list[ContainerInfo] = field(default_factory=list)

    #: The size of its disk-backed writable layer, when it has one.
    disk_mib: int | None = None

    #: Why the sandbox is dead, when it is.
    error: str | None = None

    #: Its hostname, when the create request gave one (else it is the id).
    hostname: str | None = None

    #: What runs a `microvm` sandbox's guest; absent for other backends.
    hypervisor: Hypervisor | None = None

    #: Its egress, when it has any.
    network: NetworkInfo | None = None

    #: The name of the API key that created it (never the key itself), or `"unix"` when it was
    #: created over the Unix socket without a key. Only that key, the admin key and the Unix
    #: socket see the sandbox. Absent from daemons older than ownership.
    owner: str | None = None

    #: Whether its root and its containers share one PID namespace (absent: they do not).
    share_process_namespace: bool | None = None

    #: Who its commands run as (`uid:gid`), when not root: from the request's `user` or its
    #: image's `User`.
    user: str | None = None

    #: Its volumes.
    volumes: list[VolumeMount] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxInfo:
        return cls(
            active_execs=data['active_execs'],
            backend=data['backend'],
            created_at_ms=data['created_at_ms'],
            expires_at_ms=data['expires_at_ms'],
            id=data['id'],
            image=data['image'],
            labels=dict(data['labels']),
            memory_mib=data['memory_mib'],
            state=data['state'],
            timings=SandboxTimings.from_dict(data['timings']),
            vcpus=data['vcpus'],
            caches=[CacheMount.from_dict(x) for x in data.get('caches', [])],
            containers=[ContainerInfo.from_dict(x) for x in data.get('containers', [])],
            disk_mib=data.get('disk_mib', None),
            error=data.get('error', None),
            hostname=data.get('hostname', None),
            hypervisor=data.get('hypervisor', None),
            network=_opt(data.get('network'), NetworkInfo.from_dict),
            owner=data.get('owner', None),
            share_process_namespace=data.get('share_process_namespace', None),
            user=data.get('user', None),
            volumes=[VolumeMount.from_dict(x) for x in data.get('volumes', [])],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['active_execs'] = self.active_execs
        out['backend'] = self.backend
        out['created_at_ms'] = self.created_at_ms
        out['expires_at_ms'] = self.expires_at_ms
        out['id'] = self.id
        out['image'] = self.image
        out['labels'] = dict(self.labels)
        out['memory_mib'] = self.memory_mib
        out['state'] = self.state
        out['timings'] = self.timings.to_dict()
        out['vcpus'] = self.vcpus
        if self.caches:
            out['caches'] = [x.to_dict() for x in self.caches]
        if self.containers:
            out['containers'] = [x.to_dict() for x in self.containers]
        if self.disk_mib is not None:
            out['disk_mib'] = self.disk_mib
        if self.error is not None:
            out['error'] = self.error
        if self.hostname is not None:
            out['hostname'] = self.hostname
        if self.hypervisor is not None:
            out['hypervisor'] = self.hypervisor
        if self.network is not None:
            out['network'] = None if self.network is None else self.network.to_dict()
        if self.owner is not None:
            out['owner'] = self.owner
        if self.share_process_namespace is not None:
            out['share_process_namespace'] = self.share_process_namespace
        if self.user is not None:
            out['user'] = self.user
        if self.volumes:
            out['volumes'] = [x.to_dict() for x in self.volumes]
        return out


@dataclass
class SandboxList:
    """The body of `GET /sandboxes`."""

    #: Every sandbox the caller may see (its own; all of them for the admin key and the Unix
    #: socket), oldest first.
    sandboxes: list[SandboxInfo]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxList:
        return cls(
            sandboxes=[SandboxInfo.from_dict(x) for x in data['sandboxes']],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['sandboxes'] = [x.to_dict() for x in self.sandboxes]
        return out


@dataclass
class SandboxStats:
    """What a sandbox uses now, from its cgroups: `GET /sandboxes/{id}/stats`."""

    #: CPU time.
    cpu: CpuStats

    #: Memory.
    memory: MemoryStats

    #: Processes.
    pids: PidsStats

    #: Its writable layer (absent from older daemons and agents: zeros).
    disk: DiskStats = field(default_factory=lambda: DiskStats.from_dict({'limit_bytes': 0, 'used_bytes': 0}))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxStats:
        return cls(
            cpu=CpuStats.from_dict(data['cpu']),
            memory=MemoryStats.from_dict(data['memory']),
            pids=PidsStats.from_dict(data['pids']),
            disk=DiskStats.from_dict(data.get('disk', {'limit_bytes': 0, 'used_bytes': 0})),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['cpu'] = self.cpu.to_dict()
        out['memory'] = self.memory.to_dict()
        out['pids'] = self.pids.to_dict()
        if self.disk != DiskStats.from_dict({'limit_bytes': 0, 'used_bytes': 0}):
            out['disk'] = self.disk.to_dict()
        return out


@dataclass
class SandboxTimings:
    """How long creation took."""

    #: The guest's uptime when its agent became ready: a microVM's kernel's since its boot. A
    #: namespace sandbox runs on the host's kernel, so there it is the host's uptime.
    agent_uptime_ms: int

    #: From the create request to the agent's hello, in milliseconds (fractional).
    create_to_ready_ms: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxTimings:
        return cls(
            agent_uptime_ms=data['agent_uptime_ms'],
            create_to_ready_ms=float(data['create_to_ready_ms']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['agent_uptime_ms'] = self.agent_uptime_ms
        out['create_to_ready_ms'] = self.create_to_ready_ms
        return out


@dataclass
class SeccompArg:
    """An argument check of a [`SeccompRule`], on the 64-bit unsigned value."""

    # The daemon refuses unknown fields in this body.

    #: Which argument, 0–5.
    index: int

    #: `SCMP_CMP_NE`, `SCMP_CMP_LT`, `SCMP_CMP_LE`, `SCMP_CMP_EQ`, `SCMP_CMP_GE`,
    #: `SCMP_CMP_GT` or `SCMP_CMP_MASKED_EQ`.
    op: Literal["SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_MASKED_EQ"]

    #: What it is compared with (the mask, for `SCMP_CMP_MASKED_EQ`).
    value: int

    #: What the masked argument must equal (`SCMP_CMP_MASKED_EQ` only).
    value_two: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SeccompArg:
        return cls(
            index=data['index'],
            op=data['op'],
            value=data['value'],
            value_two=data.get('value_two', 0),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['index'] = self.index
        out['op'] = self.op
        out['value'] = self.value
        if self.value_two != 0:
            out['value_two'] = self.value_two
        return out


@dataclass
class SeccompProfile:
    """A seccomp profile, as OCI's `linux.seccomp` writes one (names in snake case).
    Architectures are not listed: a sandbox runs x86_64 calls, and its own filter refuses
    every other ABI.
    """

    # The daemon refuses unknown fields in this body.

    #: What a call no rule matches gets: `SCMP_ACT_ALLOW`, `SCMP_ACT_ERRNO`,
    #: `SCMP_ACT_KILL` (`_THREAD`), `SCMP_ACT_KILL_PROCESS`, `SCMP_ACT_TRAP` or
    #: `SCMP_ACT_TRACE`. `SCMP_ACT_NOTIFY` is refused (crucible runs no listener), and so is
    #: `SCMP_ACT_LOG` (it would have a tenant write the host's kernel log at will).
    default_action: Literal["SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_TRAP", "SCMP_ACT_TRACE"]

    #: The errno of a default `SCMP_ACT_ERRNO` (default `EPERM`), at most 4095.
    default_errno_ret: int | None = None

    #: The rules, tried in order for a call; at most 512, naming at most 2,048 calls in all.
    #: A name x86_64 does not have is skipped, as runc skips them.
    syscalls: list[SeccompRule] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SeccompProfile:
        return cls(
            default_action=data['default_action'],
            default_errno_ret=data.get('default_errno_ret', None),
            syscalls=[SeccompRule.from_dict(x) for x in data.get('syscalls', [])],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['default_action'] = self.default_action
        if self.default_errno_ret is not None:
            out['default_errno_ret'] = self.default_errno_ret
        if self.syscalls:
            out['syscalls'] = [x.to_dict() for x in self.syscalls]
        return out


@dataclass
class SeccompRule:
    """One rule of a [`SeccompProfile`]."""

    # The daemon refuses unknown fields in this body.

    #: What they get when every check of `args` holds; the same names as `default_action`.
    action: Literal["SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_TRAP", "SCMP_ACT_TRACE"]

    #: The system calls it applies to (`chmod`, `fchmodat`, …).
    names: list[str]

    #: Argument checks, all of which must hold (at most 6); one argument checked twice holds
    #: when either check does, as runc reads it.
    args: list[SeccompArg] = field(default_factory=list)

    #: The errno of `SCMP_ACT_ERRNO` (default `EPERM`) or the data of `SCMP_ACT_TRACE`.
    errno_ret: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SeccompRule:
        return cls(
            action=data['action'],
            names=list(data['names']),
            args=[SeccompArg.from_dict(x) for x in data.get('args', [])],
            errno_ret=data.get('errno_ret', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['action'] = self.action
        out['names'] = list(self.names)
        if self.args:
            out['args'] = [x.to_dict() for x in self.args]
        if self.errno_ret is not None:
            out['errno_ret'] = self.errno_ret
        return out


@dataclass
class SharedMount:
    """A shared directory (a Kubernetes `emptyDir`): a directory of the sandbox's writable
    scratch, empty at creation, the same files in every container that mounts it by name.
    """

    # The daemon refuses unknown fields in this body.

    #: The directory's name (the same rules as a container's).
    name: str

    #: Where it appears in this container (absolute, not in `/proc`, `/dev` or `/sys`, and
    #: not through a symlink of its image: a 400 names the link).
    path: str

    #: Mounted read-only in this container (as a Kubernetes `volumeMounts[].readOnly`): it
    #: reads what the containers that mount it writable write.
    read_only: bool | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SharedMount:
        return cls(
            name=data['name'],
            path=data['path'],
            read_only=data.get('read_only', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['name'] = self.name
        out['path'] = self.path
        if self.read_only is not None:
            out['read_only'] = self.read_only
        return out


@dataclass
class SignalRequest:
    """The body of `POST /sandboxes/{id}/signal`."""

    # The daemon refuses unknown fields in this body.

    #: The signal number (1 to 64).
    signal: int

    #: The running command to signal (its ExecRequest's `exec_id`): the signal goes to its
    #: process group only. Absent: to every process in the sandbox but its agent.
    exec_id: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SignalRequest:
        return cls(
            signal=data['signal'],
            exec_id=data.get('exec_id', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['signal'] = self.signal
        if self.exec_id is not None:
            out['exec_id'] = self.exec_id
        return out


@dataclass
class TerminalSize:
    """A terminal's size in characters: the `tty_size` of an exec request and the payload of a
    `resize` frame (`{"rows":40,"cols":120}`).
    """

    # The daemon refuses unknown fields in this body.

    #: Columns.
    cols: int

    #: Lines.
    rows: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TerminalSize:
        return cls(
            cols=data['cols'],
            rows=data['rows'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['cols'] = self.cols
        out['rows'] = self.rows
        return out


@dataclass
class UpdateSandbox:
    """The body of `PATCH /sandboxes/{id}`: new limits for a running sandbox (`docker update
    --memory --cpus`; the Kubernetes shim's pod limits). A field left out keeps its value.
    """

    # The daemon refuses unknown fields in this body.

    #: Its memory limit, within the bounds a create request has. Lower than what its
    #: processes use, the kernel reclaims and then kills within it, as it would at creation.
    memory_mib: int | None = None

    #: Its CPU limit in whole CPUs, within the bounds a create request has.
    vcpus: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UpdateSandbox:
        return cls(
            memory_mib=data.get('memory_mib', None),
            vcpus=data.get('vcpus', None),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.memory_mib is not None:
            out['memory_mib'] = self.memory_mib
        if self.vcpus is not None:
            out['vcpus'] = self.vcpus
        return out


@dataclass
class Usage:
    """Resource usage of a finished command."""

    #: Times the command was preempted.
    context_switches_involuntary: int

    #: System CPU time.
    cpu_sys_ms: int

    #: User CPU time.
    cpu_user_ms: int

    #: Bytes read from storage (approximate for very short commands).
    io_read_bytes: int

    #: Bytes written to storage (approximate for very short commands).
    io_write_bytes: int

    #: Page faults that needed I/O.
    page_faults_major: int

    #: Peak resident set size.
    peak_memory_bytes: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        return cls(
            context_switches_involuntary=data['context_switches_involuntary'],
            cpu_sys_ms=data['cpu_sys_ms'],
            cpu_user_ms=data['cpu_user_ms'],
            io_read_bytes=data['io_read_bytes'],
            io_write_bytes=data['io_write_bytes'],
            page_faults_major=data['page_faults_major'],
            peak_memory_bytes=data['peak_memory_bytes'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['context_switches_involuntary'] = self.context_switches_involuntary
        out['cpu_sys_ms'] = self.cpu_sys_ms
        out['cpu_user_ms'] = self.cpu_user_ms
        out['io_read_bytes'] = self.io_read_bytes
        out['io_write_bytes'] = self.io_write_bytes
        out['page_faults_major'] = self.page_faults_major
        out['peak_memory_bytes'] = self.peak_memory_bytes
        return out


@dataclass
class VolumeMount:
    """An operator-declared volume mounted (read-only) into a sandbox."""

    # The daemon refuses unknown fields in this body.

    #: The volume's name as the operator declared it.
    name: str

    #: Where it appears inside the sandbox (absolute).
    path: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VolumeMount:
        return cls(
            name=data['name'],
            path=data['path'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['name'] = self.name
        out['path'] = self.path
        return out


__all__ = [
    'BackendKind',
    'CacheInfo',
    'CacheList',
    'CacheMount',
    'ContainerInfo',
    'ContainerList',
    'ContainerRequest',
    'ContainerSecurity',
    'ContainerState',
    'CpuStats',
    'CreateSandbox',
    'DiskStats',
    'EgressRefusal',
    'ErrorBody',
    'ExecList',
    'ExecRequest',
    'ExecResult',
    'ExecState',
    'ExecStatus',
    'FilesPutResult',
    'HostPath',
    'HostPathPropagation',
    'Hypervisor',
    'ImageInfo',
    'ImageList',
    'ImageUser',
    'ImagesPruned',
    'MemoryStats',
    'NetworkInfo',
    'NetworkRequest',
    'OnDisconnect',
    'PidsStats',
    'ReadyCheck',
    'RefusedEntry',
    'RestartPolicy',
    'Rlimit',
    'SandboxInfo',
    'SandboxList',
    'SandboxState',
    'SandboxStats',
    'SandboxTimings',
    'SeccompArg',
    'SeccompProfile',
    'SeccompRule',
    'SharedMount',
    'SignalRequest',
    'TerminalSize',
    'UpdateSandbox',
    'Usage',
    'VolumeMount',
]
