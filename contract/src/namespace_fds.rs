//! The descriptors a namespace sandbox's PID 1 (the agent, `guest-init sandbox-pid1`) is
//! handed by the `sandbox` half that made it: opened on the host before entering, so the
//! sandbox never sees their paths.

/// The listening agent socket (bound on the host before entering).
pub const PID1_LISTEN_FD: i32 = 3;
/// The connection to the daemon's ready socket, for the hello.
pub const PID1_READY_FD: i32 = 4;
/// When the spec has an egress socket: the connection to it, over which the agent hands the
/// daemon connections.
pub const PID1_EGRESS_FD: i32 = 5;
/// The connection to the sandbox's container factory (`namespace::factory`), which makes the
/// containers added after the sandbox was created.
pub const PID1_FACTORY_FD: i32 = 6;
/// When the spec names a commands cgroup: its `cgroup.procs`, opened for writing on the host.
/// PID 1 and every container's agent hold it here, close-on-exec, and each command they start
/// writes itself into it before it executes.
pub const COMMANDS_CGROUP_FD: i32 = 7;
/// A container whose main process is PID 1 of a PID namespace of its own: its agent's
/// connection to that process-to-be (`guest-init container-init`), which starts the
/// container's first command in its own place, as PID 1.
pub const CONTAINER_INIT_FD: i32 = 8;
/// With it: the agent's connection to the container's spawner (`guest-init
/// container-spawner`), which makes every later command in that PID namespace, as the agent's
/// child.
pub const CONTAINER_SPAWNER_FD: i32 = 9;
