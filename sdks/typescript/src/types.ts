// The SDK's public data types, built on the ones generated from docs/openapi.json, so that an
// API change shows up here as a compile error (npm run check-types catches the drift first).
// Documents the daemon returns (sandbox info, images, caches, exec statuses) are exposed as it
// sends them, snake_case and all: renaming every nested field would be a second schema to keep
// in step. What the caller writes (options) is camelCase, mapped to the wire names in one place
// each, with the generated request types checking the mapping.

import type { components } from "./generated/openapi.js";

type Schemas = components["schemas"];

export type SandboxInfo = Schemas["SandboxInfo"];
export type SandboxList = Schemas["SandboxList"];
export type SandboxState = Schemas["SandboxState"];
export type SandboxStats = Schemas["SandboxStats"];
export type SandboxTimings = Schemas["SandboxTimings"];
export type NetworkInfo = Schemas["NetworkInfo"];
export type BackendKind = Schemas["BackendKind"];
export type CacheMount = Schemas["CacheMount"];
export type VolumeMount = Schemas["VolumeMount"];
export type CacheInfo = Schemas["CacheInfo"];
export type ImageInfo = Schemas["ImageInfo"];
export type ImagesPruned = Schemas["ImagesPruned"];
export type ExecStatus = Schemas["ExecStatus"];
export type FilesPutResult = Schemas["FilesPutResult"];
export type Rlimit = Schemas["Rlimit"];
export type OnDisconnect = Schemas["OnDisconnect"];
export type Usage = Schemas["Usage"];
export type ErrorBody = Schemas["ErrorBody"];
/** One entry of a create's `containers`, in its wire form: `{ name, image?, command?, ready?, shared?, … }`. */
export type ContainerRequest = Schemas["ContainerRequest"];
/** A shared directory mounted in a container or the sandbox's own root: `{ name, path }`. */
export type SharedMount = Schemas["SharedMount"];
export type ReadyCheck = Schemas["ReadyCheck"];
export type ContainerInfo = Schemas["ContainerInfo"];
export type ContainerState = Schemas["ContainerState"];
/** The wire form of a request body, as the daemon checks it. */
export type CreateSandboxRequest = Schemas["CreateSandbox"];
export type ExecRequest = Schemas["ExecRequest"];
/** A terminal's size in characters: `{ rows, cols }` (an exec's `ttySize`, a resize's payload). */
export type TerminalSize = Schemas["TerminalSize"];
export type SignalRequest = Schemas["SignalRequest"];
/** The exit frame's payload as it travels. */
export type ExecResultDocument = Schemas["ExecResult"];

/** `GET /healthz`; the schema says only "an object", so the fields the daemon sends today are optional. */
export interface Health {
  status?: string;
  sandboxes?: number;
  default_backend?: BackendKind;
  [key: string]: unknown;
}

type Value<T> = Exclude<T, null | undefined>;

/** What `POST /sandboxes` takes; every field is optional, `{}` gives a working sandbox. */
export interface SandboxCreateOptions {
  /** `"default"` (the built-in busybox image) or one of the caller's imported images. */
  image?: Value<CreateSandboxRequest["image"]>;
  /** 16 … 16384; default 512. */
  memoryMib?: Value<CreateSandboxRequest["memory_mib"]>;
  /** 1 … 16; default 1. */
  vcpus?: Value<CreateSandboxRequest["vcpus"]>;
  /** Lifetime in seconds (default 3600, at most a week). */
  ttlS?: Value<CreateSandboxRequest["ttl_s"]>;
  /** Added to every command's environment. */
  env?: Value<CreateSandboxRequest["env"]>;
  labels?: Value<CreateSandboxRequest["labels"]>;
  /** Egress through the daemon's proxy to these hosts only; each rule within the operator's `--egress-allow`. */
  network?: { allow: string[] };
  /** Named persistent caches: `{ name, path, size_mib? }`. */
  caches?: CacheMount[];
  /** Operator-declared read-only volumes: `{ name, path }`. */
  volumes?: VolumeMount[];
  /** A disk-backed writable layer of this many MiB (at least 64). */
  diskMib?: Value<CreateSandboxRequest["disk_mib"]>;
  /** Who every command runs as (`uid`, `uid:gid`, `name`, `name:group`). */
  user?: Value<CreateSandboxRequest["user"]>;
  backend?: BackendKind;
  /** Containers beside the sandbox's own root (both backends); the create answers once each is ready. */
  containers?: ContainerRequest[];
  /** Shared directories the sandbox's own root mounts (containers name theirs in their own `shared`). */
  shared?: SharedMount[];
  /** A microVM's room for containers added once it runs (each takes one of its 6 disks). */
  containerSlots?: Value<CreateSandboxRequest["container_slots"]>;
  /** One PID namespace for the sandbox's root and its containers: each sees the others' processes (by default none does). */
  shareProcessNamespace?: Value<CreateSandboxRequest["share_process_namespace"]>;
  /** Its hostname: RFC 1123 labels, at most 64 bytes (default: the sandbox's id). */
  hostname?: Value<CreateSandboxRequest["hostname"]>;
}

/** The create request's wire form; fields left out take the daemon's defaults. */
export function createRequest(o: SandboxCreateOptions): CreateSandboxRequest {
  const body: CreateSandboxRequest = {};
  if (o.image !== undefined) body.image = o.image;
  if (o.memoryMib !== undefined) body.memory_mib = o.memoryMib;
  if (o.vcpus !== undefined) body.vcpus = o.vcpus;
  if (o.ttlS !== undefined) body.ttl_s = o.ttlS;
  if (o.env !== undefined) body.env = o.env;
  if (o.labels !== undefined) body.labels = o.labels;
  if (o.network !== undefined) body.network = { allow: [...o.network.allow] };
  if (o.caches !== undefined) body.caches = o.caches;
  if (o.volumes !== undefined) body.volumes = o.volumes;
  if (o.diskMib !== undefined) body.disk_mib = o.diskMib;
  if (o.user !== undefined) body.user = o.user;
  if (o.backend !== undefined) body.backend = o.backend;
  if (o.containers !== undefined) body.containers = o.containers;
  if (o.shared !== undefined) body.shared = o.shared;
  if (o.containerSlots !== undefined) body.container_slots = o.containerSlots;
  if (o.shareProcessNamespace !== undefined) body.share_process_namespace = o.shareProcessNamespace;
  if (o.hostname !== undefined) body.hostname = o.hostname;
  return body;
}

/** How a command runs: the ExecRequest's optional fields, camelCase. */
export interface ExecOptions {
  env?: Record<string, string>;
  /** Absolute; empty or absent: the image's WorkingDir, else the agent's. */
  cwd?: string;
  /** Deadline in seconds; the whole process group is SIGKILLed at it. 0 or absent: none. */
  timeoutS?: number;
  /** Who this command runs as (`uid`, `uid:gid`, `name`, `name:group`). */
  user?: string;
  /** Supplementary groups (gids or names from the image's /etc/group). */
  groupAdd?: string[];
  rlimits?: Rlimit[];
  /** A name for the running command (for signal() and attach()); absent: the daemon makes one up. */
  execId?: string;
  /** `keep` (one-shot default): the command outlives a dropped connection; `kill`: it dies with it. */
  onDisconnect?: OnDisconnect;
  /**
   * Run on a pseudo-terminal, as `docker exec -t`: the terminal is the command's stdin, stdout
   * and stderr, so stderr is merged into stdout (no stderr events), lines end in `\r\n`, and
   * input goes through the terminal's line discipline. Default false: pipes.
   */
  tty?: boolean;
  /** The terminal's size when the command starts (only with `tty`); absent: 24 rows of 80 columns. */
  ttySize?: TerminalSize;
}

/** A command as the daemon runs it: an argv, or a string for `/bin/sh -c`. */
export type Command = string | readonly string[];

export function argv(cmd: Command): string[] {
  if (typeof cmd === "string") return ["/bin/sh", "-c", cmd];
  if (cmd.length === 0) throw new TypeError("a command needs at least one argument");
  return [...cmd];
}

/** The ExecRequest for `cmd` and `o`; fields left out take the daemon's defaults. */
export function execRequest(cmd: Command, o: ExecOptions): ExecRequest {
  const body: ExecRequest = { cmd: argv(cmd) };
  if (o.env !== undefined) body.env = o.env;
  if (o.cwd !== undefined) body.cwd = o.cwd;
  if (o.timeoutS !== undefined) body.timeout_s = o.timeoutS;
  if (o.user !== undefined) body.user = o.user;
  if (o.groupAdd !== undefined) body.group_add = o.groupAdd;
  if (o.rlimits !== undefined) body.rlimits = o.rlimits;
  if (o.execId !== undefined) body.exec_id = o.execId;
  if (o.onDisconnect !== undefined) body.on_disconnect = o.onDisconnect;
  if (o.tty !== undefined) {
    if (typeof o.tty !== "boolean") throw new TypeError(`tty must be a boolean, got ${String(o.tty)}`);
    if (o.tty) body.tty = true;
  }
  if (o.ttySize !== undefined) {
    if (o.tty !== true) throw new TypeError("ttySize sizes a terminal, and only a command started with `tty: true` has one");
    if (typeof o.ttySize !== "object" || o.ttySize === null) throw new TypeError(`ttySize must be { rows, cols }, got ${String(o.ttySize)}`);
    body.tty_size = { rows: terminalDimension(o.ttySize.rows, "ttySize.rows"), cols: terminalDimension(o.ttySize.cols, "ttySize.cols") };
  }
  return body;
}

/** The largest terminal dimension: rows and columns are 16-bit on the wire. */
export const MAX_TERMINAL_DIMENSION = 65535;

/** `value` if it is a terminal's rows or columns (an integer from 0 to 65535), else a TypeError naming `what`. */
export function terminalDimension(value: unknown, what: string): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value > MAX_TERMINAL_DIMENSION) {
    throw new TypeError(`${what} must be an integer from 0 to ${MAX_TERMINAL_DIMENSION}, got ${typeof value === "string" ? JSON.stringify(value) : String(value)}`);
  }
  return value;
}
