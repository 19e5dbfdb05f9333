// One sandbox: its commands (collected, streamed, interactive, re-attached), files, signals,
// stats and its end. Shaped after the sandbox SDKs people know (E2B's Sandbox, Modal's):
// `await using sb = await Sandbox.create()` deletes it when the scope ends.

import { randomBytes } from "node:crypto";

import { SandboxNotFound } from "./errors.js";
import { ExecStream, collect } from "./exec.js";
import type { CollectOptions, Resume } from "./exec.js";
import { Files } from "./files.js";
import { hijack } from "./hijack.js";
import { InteractiveSession } from "./interactive.js";
import type { CommandResult } from "./result.js";
import { sandboxPath } from "./transport.js";
import type { Transport } from "./transport.js";
import { argv, createRequest, execRequest } from "./types.js";
import type { Command, ExecOptions, ExecStatus, SandboxCreateOptions, SandboxInfo, SandboxStats } from "./types.js";
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

export class Sandbox implements AsyncDisposable {
  readonly id: string;
  readonly files: Files;
  readonly #client: ClientLike;
  readonly #t: Transport;
  readonly #execPath: string;
  #info: SandboxInfo | undefined;

  /** Use `Sandbox.create`, `Sandbox.connect` or `client.sandboxes`; this wraps a known id. */
  constructor(client: ClientLike, id: string, info?: SandboxInfo) {
    this.#client = client;
    this.#t = client.transport;
    this.id = id;
    this.#info = info;
    this.files = new Files(this.#t, id);
    this.#execPath = sandboxPath(id, "/exec");
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

  /**
   * Runs a command to its end: `cmd` is an argv, or a string for `/bin/sh -c`. Output goes to
   * the callbacks as it arrives and is collected into the result.
   */
  run(cmd: Command, options: RunOptions = {}): Promise<CommandResult> {
    const args = argv(cmd);
    const resume = options.onDisconnect === "kill" ? undefined : this.#resume(options);
    return collect(this.#t, { path: this.#execPath, body: JSON.stringify(execRequest(args, options)), subject: "sandbox", cmd: args, resume }, options);
  }

  /** A command's output as events: `for await (const ev of sb.stream(cmd))`. */
  stream(cmd: Command, options: StreamOptions = {}): ExecStream {
    const args = argv(cmd);
    const resume = options.onDisconnect === "kill" ? undefined : this.#resume(options);
    return new ExecStream(this.#t, { path: this.#execPath, body: JSON.stringify(execRequest(args, options)), subject: "sandbox", cmd: args, resume }, options.throwOnError ?? false);
  }

  /** How this sandbox's streams re-attach (none when `resumes` is 0). */
  #resume(options: ResumeOptions): Resume | undefined {
    const tries = options.resumes ?? 5;
    if (!Number.isSafeInteger(tries) || tries < 0) throw new TypeError(`resumes must be a non-negative integer, got ${tries}`);
    if (tries === 0) return undefined;
    return { tries, attachPath: (execId, offset) => this.#attachPath(execId, offset) };
  }

  #attachPath(execId: string, offset: number): string {
    return sandboxPath(this.id, `/execs/${encodeURIComponent(execId)}/attach?offset=${offset}`);
  }

  /** Starts a command with stdin: send(), closeStdin(), iterate its events, wait(). */
  async interactive(cmd: Command, options: InteractiveOptions = {}): Promise<InteractiveSession> {
    const args = argv(cmd);
    if ((options.transport ?? "hijack") === "websocket") {
      // The upgrade's answer comes before the request, so it cannot name the command: name
      // it here, so that signal() and attach() can find a WebSocket session too.
      const execId = options.execId || `ws-${randomBytes(8).toString("hex")}`;
      const body = JSON.stringify(execRequest(args, { ...options, execId }));
      const pipe = await openWebSocket(this.#t, this.#execPath, body, "sandbox");
      return new InteractiveSession(pipe, execId, args, "websocket");
    }
    const body = JSON.stringify(execRequest(args, options));
    const { pipe, headers } = await hijack(this.#t, `${this.#execPath}?stdin=1`, body, "sandbox");
    return new InteractiveSession(pipe, headers.get("x-crucible-exec-id") ?? options.execId ?? "", args, "hijack");
  }

  /** The commands that can be found by exec id: running, or ended with a result nobody collected. */
  async execs(): Promise<ExecStatus[]> {
    return (await this.#t.json<{ execs: ExecStatus[] }>("GET", sandboxPath(this.id, "/execs"), undefined, "sandbox")).execs;
  }

  /** One command's status (ExecNotFound when there is none of that name). */
  async execStatus(execId: string): Promise<ExecStatus> {
    return this.#t.json<ExecStatus>("GET", sandboxPath(this.id, `/execs/${encodeURIComponent(execId)}`), undefined, "exec");
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
    await this.#t.json<void>("POST", sandboxPath(this.id, "/signal"), body, options.execId === undefined ? "sandbox" : "exec");
  }

  /** What the sandbox uses now: memory, CPU time, processes. */
  async stats(): Promise<SandboxStats> {
    return this.#t.json<SandboxStats>("GET", sandboxPath(this.id, "/stats"), undefined, "sandbox");
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
