// One sandbox: its commands (collected, streamed, interactive, re-attached), files, signals,
// stats and its end. Shaped after the sandbox SDKs people know (E2B's Sandbox, Modal's):
// `await using sb = await Sandbox.create()` deletes it when the scope ends.

import { randomBytes } from "node:crypto";

import { ContainerNotFound, CrucibleError, SandboxNotFound } from "./errors.js";
import { FrameType, decodeFrames } from "./codec.js";
import { ExecStream, collect } from "./exec.js";
import type { CollectOptions, Resume } from "./exec.js";
import { Files } from "./files.js";
import { hijack } from "./hijack.js";
import { InteractiveSession } from "./interactive.js";
import { ExecResult } from "./result.js";
import type { CommandResult } from "./result.js";
import { checkContainerName, inContainer, sandboxPath } from "./transport.js";
import type { Transport } from "./transport.js";
import { argv, createRequest, execRequest } from "./types.js";
import type { Command, ContainerInfo, ContainerRequest, ExecOptions, ExecResultDocument, ExecStatus, SandboxCreateOptions, SandboxInfo, SandboxStats } from "./types.js";
import { openWebSocket } from "./websocket.js";

/** The Crucible client a Sandbox was made with (kept structural so the two files need not import each other). */
export interface ClientLike {
  readonly transport: Transport;
}

export interface ResumeOptions {
  /**
   * Re-attaches a stream may make when its connection breaks mid-stream, from the output
   * already received (default 5; 0: a break is the caller's to see). A command started with
   * `onDisconnect: "kill"` dies with its connection and is never re-attached.
   */
  resumes?: number;
}

export interface RunOptions extends ExecOptions, CollectOptions, ResumeOptions {}

export interface StreamOptions extends ExecOptions, ResumeOptions {
  /** Throw CommandError at the end unless the command exited 0. Default false. */
  throwOnError?: boolean;
}

export interface InteractiveOptions extends ExecOptions {
  /** `hijack` (the default: one raw connection) or `websocket`. */
  transport?: "hijack" | "websocket";
}

/** Linux signal numbers by name, for signal(). */
export const SIGNALS = {
  SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGILL: 4, SIGTRAP: 5, SIGABRT: 6, SIGBUS: 7, SIGFPE: 8,
  SIGKILL: 9, SIGUSR1: 10, SIGSEGV: 11, SIGUSR2: 12, SIGPIPE: 13, SIGALRM: 14, SIGTERM: 15,
  SIGSTKFLT: 16, SIGCHLD: 17, SIGCONT: 18, SIGSTOP: 19, SIGTSTP: 20, SIGTTIN: 21, SIGTTOU: 22,
  SIGURG: 23, SIGXCPU: 24, SIGXFSZ: 25, SIGVTALRM: 26, SIGPROF: 27, SIGWINCH: 28, SIGIO: 29,
  SIGPWR: 30, SIGSYS: 31,
} as const;
export type SignalName = keyof typeof SIGNALS;

/**
 * Where commands run and files go: a sandbox's own root (a `Sandbox`) or one of its
 * containers (a `Container`, from `sandbox.container(name)`).
 */
export class Root {
  /** The sandbox's id. */
  readonly id: string;
  readonly files: Files;
  readonly #t: Transport;
  readonly #container: string | undefined;

  constructor(t: Transport, id: string, container?: string) {
    this.#t = t;
    this.id = id;
    this.#container = container;
    this.files = new Files(t, id, container);
  }

  /** `tail` of this sandbox's path, addressed to this root. */
  #path(tail: string): string {
    return inContainer(sandboxPath(this.id, tail), this.#container);
  }

  /**
   * Runs a command to its end: `cmd` is an argv, or a string for `/bin/sh -c`. Output goes to
   * the callbacks as it arrives and is collected into the result.
   */
  run(cmd: Command, options: RunOptions = {}): Promise<CommandResult> {
    const args = argv(cmd);
    const resume = options.onDisconnect === "kill" ? undefined : this.#resume(options);
    return collect(this.#t, { path: this.#path("/exec"), body: JSON.stringify(execRequest(args, options)), subject: "sandbox", cmd: args, resume }, options);
  }

  /** A command's output as events: `for await (const ev of sb.stream(cmd))`. */
  stream(cmd: Command, options: StreamOptions = {}): ExecStream {
    const args = argv(cmd);
    const resume = options.onDisconnect === "kill" ? undefined : this.#resume(options);
    return new ExecStream(this.#t, { path: this.#path("/exec"), body: JSON.stringify(execRequest(args, options)), subject: "sandbox", cmd: args, resume }, options.throwOnError ?? false);
  }

  /** How this sandbox's streams re-attach (none when `resumes` is 0). */
  #resume(options: ResumeOptions): Resume | undefined {
    const tries = options.resumes ?? 5;
    if (!Number.isSafeInteger(tries) || tries < 0) throw new TypeError(`resumes must be a non-negative integer, got ${tries}`);
    if (tries === 0) return undefined;
    return { tries, attachPath: (execId, offset) => this.#attachPath(execId, offset) };
  }

  #attachPath(execId: string, offset: number): string {
    return this.#path(`/execs/${encodeURIComponent(execId)}/attach?offset=${offset}`);
  }

  /**
   * Starts a command with stdin: send(), closeStdin(), iterate its events, wait(). With
   * `tty: true` it runs on a terminal (`ttySize`, default 24×80) that resize() resizes.
   */
  async interactive(cmd: Command, options: InteractiveOptions = {}): Promise<InteractiveSession> {
    const args = argv(cmd);
    if ((options.transport ?? "hijack") === "websocket") {
      // The upgrade's answer comes before the request, so it cannot name the command: name
      // it here, so that signal() and attach() can find a WebSocket session too.
      const execId = options.execId || `ws-${randomBytes(8).toString("hex")}`;
      const body = JSON.stringify(execRequest(args, { ...options, execId }));
      const pipe = await openWebSocket(this.#t, this.#path("/exec"), body, "sandbox");
      return new InteractiveSession(pipe, execId, args, "websocket", options.tty === true);
    }
    const body = JSON.stringify(execRequest(args, options));
    const { pipe, headers } = await hijack(this.#t, this.#path("/exec?stdin=1"), body, "sandbox");
    return new InteractiveSession(pipe, headers.get("x-crucible-exec-id") ?? options.execId ?? "", args, "hijack", options.tty === true);
  }

  /** The commands that can be found by exec id: running, or ended with a result nobody collected. */
  async execs(): Promise<ExecStatus[]> {
    return (await this.#t.json<{ execs: ExecStatus[] }>("GET", this.#path("/execs"), undefined, "sandbox")).execs;
  }

  /** One command's status (ExecNotFound when there is none of that name). */
  async execStatus(execId: string): Promise<ExecStatus> {
    return this.#t.json<ExecStatus>("GET", this.#path(`/execs/${encodeURIComponent(execId)}`), undefined, "exec");
  }

  /**
   * Re-attaches to a command whose connection dropped, from output byte `offset` (the stdout
   * and stderr bytes already received; 0: all that is still kept). Attaching to an ended
   * command collects its result: a second attach is ExecNotFound.
   */
  attach(execId: string, options: { offset?: number; throwOnError?: boolean } & ResumeOptions = {}): ExecStream {
    const offset = options.offset ?? 0;
    if (!Number.isSafeInteger(offset) || offset < 0) throw new TypeError(`offset must be a non-negative integer, got ${offset}`);
    const path = this.#attachPath(execId, offset);
    return new ExecStream(this.#t, { path, body: "", subject: "exec", cmd: [], offset, resume: this.#resume(options) }, options.throwOnError ?? false);
  }

  /**
   * Sends a signal to every process of the sandbox but its agent, or with `execId` to that
   * running command's process group only (ExecNotFound when none runs).
   */
  async signal(signal: number | SignalName, options: { execId?: string } = {}): Promise<void> {
    const number = typeof signal === "number" ? signal : SIGNALS[signal];
    if (!Number.isInteger(number) || number < 1 || number > 64) throw new TypeError(`not a signal: ${String(signal)}`);
    const body = options.execId === undefined ? { signal: number } : { signal: number, exec_id: options.execId };
    await this.#t.json<void>("POST", this.#path("/signal"), body, options.execId === undefined ? "sandbox" : "exec");
  }

  /**
   * What the sandbox uses now: memory, CPU time, processes; for a Container, its share (its
   * processes' memory, CPU time and count, with the sandbox's limits).
   */
  async stats(): Promise<SandboxStats> {
    return this.#t.json<SandboxStats>("GET", this.#path("/stats"), undefined, "sandbox");
  }
}

/** A sandbox on a daemon; `await using sb = await Sandbox.create()` deletes it when the scope ends. */
export class Sandbox extends Root implements AsyncDisposable {
  readonly #client: ClientLike;
  readonly #t: Transport;
  #info: SandboxInfo | undefined;

  /** Use `Sandbox.create`, `Sandbox.connect` or `client.sandboxes`; this wraps a known id. */
  constructor(client: ClientLike, id: string, info?: SandboxInfo) {
    super(client.transport, id);
    this.#client = client;
    this.#t = client.transport;
    this.#info = info;
  }

  /** Creates a sandbox (with the default client, from CRUCIBLE_HOST / CRUCIBLE_API_KEY, unless `client` is given). */
  static async create(options: SandboxCreateOptions & { client?: ClientLike } = {}): Promise<Sandbox> {
    const { client, ...rest } = options;
    return createSandbox(client ?? (await defaultClient()), rest);
  }

  /** A sandbox that exists (checked: an unknown id is SandboxNotFound). */
  static async connect(id: string, options: { client?: ClientLike } = {}): Promise<Sandbox> {
    return connectSandbox(options.client ?? (await defaultClient()), id);
  }

  get client(): ClientLike {
    return this.#client;
  }

  /** The info as of creation or the last info() call. */
  get lastInfo(): SandboxInfo | undefined {
    return this.#info;
  }

  async info(): Promise<SandboxInfo> {
    this.#info = await this.#t.json<SandboxInfo>("GET", sandboxPath(this.id), undefined, "sandbox");
    return this.#info;
  }

  /** Deletes the sandbox and everything in it. */
  async kill(): Promise<void> {
    await this.#t.json<void>("DELETE", sandboxPath(this.id), undefined, "sandbox");
  }

  /** kill(), by its HTTP name. */
  delete(): Promise<void> {
    return this.kill();
  }

  /** Deletes the sandbox unless it is gone already: what `await using` calls. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.kill();
    } catch (e) {
      if (!(e instanceof SandboxNotFound)) throw e;
    }
  }

  /** Container `name` of this sandbox, to run commands and move files there (each call says ContainerNotFound if it has none by that name). */
  container(name: string): Container {
    return new Container(this.#t, this.id, checkContainerName(name));
  }

  /** Its containers: each one's state, main process, restarts and last exit. */
  async containers(): Promise<ContainerInfo[]> {
    return (await this.#t.json<{ containers: ContainerInfo[] }>("GET", sandboxPath(this.id, "/containers"), undefined, "sandbox")).containers;
  }

  /** Adds a container to this running sandbox (a namespace sandbox, or a microVM created with `containerSlots`) and returns it once it is ready: ContainerNotReady when it does not get ready (it stays, failed or exited, with its log), Conflict when the name is in use or a microVM has no free slot. */
  async addContainer(request: ContainerRequest): Promise<Container> {
    const info = await this.#t.json<ContainerInfo>("POST", sandboxPath(this.id, "/containers"), request, "sandbox");
    return new Container(this.#t, this.id, info.name);
  }
}

/** A container's log: what its main process wrote, every run of it (the latest MiB the daemon keeps). */
export interface ContainerLog {
  stdout: Buffer;
  stderr: Buffer;
  /** Its last exit, once it has exited for good; undefined while it runs. */
  exit: ExecResult | undefined;
}

/** One of a sandbox's containers: commands, files, signals and stats there, its state and its log. */
export class Container extends Root {
  readonly name: string;
  readonly #t: Transport;

  constructor(t: Transport, sandboxId: string, name: string) {
    super(t, sandboxId, name);
    this.#t = t;
    this.name = name;
  }

  /** Its state, main process, restarts and last exit (ContainerNotFound when the sandbox has none of this name). */
  async info(): Promise<ContainerInfo> {
    const all = (await this.#t.json<{ containers: ContainerInfo[] }>("GET", sandboxPath(this.id, "/containers"), undefined, "sandbox")).containers;
    const found = all.find((c) => c.name === this.name);
    if (found === undefined) throw new ContainerNotFound(404, "container_not_found", `sandbox ${this.id} has no container ${JSON.stringify(this.name)}`);
    return found;
  }

  /** Removes it from the sandbox: it ends with every process in it and is not started again; the rest runs on. */
  async remove(): Promise<void> {
    await this.#t.json<void>("DELETE", sandboxPath(this.id, `/containers/${encodeURIComponent(this.name)}`), undefined, "sandbox");
  }

  /** Its main process's output: stdout and stderr as it wrote them, and its exit once it has exited for good. */
  async logs(): Promise<ContainerLog> {
    const path = sandboxPath(this.id, `/containers/${encodeURIComponent(this.name)}/logs`);
    const res = await this.#t.send("GET", path, undefined, this.#t.authHeaders(), "sandbox", this.#t.requestTimeoutMs);
    let bytes: Buffer;
    try {
      bytes = Buffer.from(await res.body.arrayBuffer());
    } catch (e) {
      throw this.#t.connectionError(e, `reading container ${this.name}'s log`);
    }
    // The log ends with an exit frame only once the container has exited for good: decoded
    // without the rule that an output stream must end with one (the other direction's rules).
    const frames = decodeFrames([bytes], "host_to_guest");
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let exit: ExecResult | undefined;
    for (const frame of frames) {
      if (exit !== undefined) throw new CrucibleError(0, "protocol_error", `container ${this.name}'s log has frames after its exit frame`);
      if (frame.type === FrameType.Stdout) out.push(frame.payload);
      else if (frame.type === FrameType.Stderr) err.push(frame.payload);
      else if (frame.type === FrameType.Exit) exit = new ExecResult(JSON.parse(frame.payload.toString("utf8")) as ExecResultDocument, "main");
      else throw new CrucibleError(0, "protocol_error", `container ${this.name}'s log holds a ${frame.type} frame`);
    }
    return { stdout: Buffer.concat(out), stderr: Buffer.concat(err), exit };
  }
}

export async function createSandbox(client: ClientLike, options: SandboxCreateOptions): Promise<Sandbox> {
  const info = await client.transport.json<SandboxInfo>("POST", "/sandboxes", createRequest(options));
  return new Sandbox(client, info.id, info);
}

export async function connectSandbox(client: ClientLike, id: string): Promise<Sandbox> {
  const info = await client.transport.json<SandboxInfo>("GET", sandboxPath(id), undefined, "sandbox");
  return new Sandbox(client, info.id, info);
}

let shared: Promise<ClientLike> | undefined;

/** One client from the environment for `Sandbox.create()` without a client, made on first use. */
function defaultClient(): Promise<ClientLike> {
  shared ??= import("./client.js").then(({ Crucible }) => new Crucible());
  return shared;
}
