// How a command ended, from its exit frame. A lost stream (the daemon lost the guest and wrote
// the exit frame itself: exit_code -1 plus `error`) is a result like any other, so a caller
// that streams a build's log still gets to see it; `throwOnError` turns any failure into a
// CommandError for callers that prefer exceptions.

import { CrucibleError } from "./errors.js";
import type { ExecResultDocument, Usage } from "./types.js";

/** How a command ended. */
export class ExecResult {
  /** The exit status; -1 when the process was killed by a signal, never started, or was lost. */
  readonly exitCode: number;
  /** `"SIGKILL"` when a signal ended it, else `""`. */
  readonly signal: string;
  /** The agent killed it at its `timeoutS` deadline. */
  readonly timedOut: boolean;
  /** Best effort: the OOM killer ended it. */
  readonly oomKilled: boolean;
  /** Why it could not start or was lost (`exitCode` -1 without a signal); `""` otherwise. */
  readonly error: string;
  /** `null` when the agent collected none. */
  readonly usage: Usage | null;
  readonly durationMs: number;
  /** Output the agent no longer kept when this client re-attached; 0 when none was lost. */
  readonly outputDroppedBytes: number;
  /** The command's name: given as `execId`, or made up by the daemon (`ex-…`). */
  readonly execId: string;
  /** The exit frame's document as the daemon sent it. */
  readonly raw: ExecResultDocument;

  constructor(raw: ExecResultDocument, execId: string) {
    this.raw = raw;
    this.exitCode = raw.exit_code;
    this.signal = raw.signal ?? "";
    this.timedOut = raw.timed_out ?? false;
    this.oomKilled = raw.oom_killed ?? false;
    this.error = raw.error ?? "";
    this.usage = raw.usage ?? null;
    this.durationMs = raw.duration_ms ?? 0;
    this.outputDroppedBytes = raw.output_dropped_bytes ?? 0;
    this.execId = execId;
  }

  /** Exited 0, on its own. */
  get ok(): boolean {
    return this.exitCode === 0 && this.signal === "" && !this.timedOut && this.error === "";
  }

  /** The daemon lost the command's stream (or it never started): `error` says why. */
  get lost(): boolean {
    return this.exitCode === -1 && this.signal === "" && !this.timedOut && this.error !== "";
  }

  /** One line for people: `exit 3`, `killed by SIGKILL (timed out)`, `lost: …`. */
  describe(): string {
    if (this.timedOut) return `timed out (${this.signal || "killed"})`;
    if (this.signal) return `killed by ${this.signal}${this.oomKilled ? " (out of memory)" : ""}`;
    if (this.error) return this.exitCode === -1 ? `lost: ${this.error}` : `exit ${this.exitCode}: ${this.error}`;
    return `exit ${this.exitCode}`;
  }
}

/** A finished command with its collected output. */
export class CommandResult extends ExecResult {
  readonly stdout: Buffer;
  readonly stderr: Buffer;

  constructor(raw: ExecResultDocument, execId: string, stdout: Buffer, stderr: Buffer) {
    super(raw, execId);
    this.stdout = stdout;
    this.stderr = stderr;
  }

  /** stdout as UTF-8 (invalid sequences replaced). */
  get stdoutText(): string {
    return this.stdout.toString("utf8");
  }

  /** stderr as UTF-8 (invalid sequences replaced). */
  get stderrText(): string {
    return this.stderr.toString("utf8");
  }
}

/** Status 0, `command_failed`: a command run with `throwOnError` did not exit 0. */
export class CommandError extends CrucibleError {
  readonly result: ExecResult;

  constructor(result: ExecResult, cmd: readonly string[]) {
    const what = cmd.length > 0 ? JSON.stringify(cmd) : "the command";
    super(0, "command_failed", `${what} failed: ${result.describe()}`);
    this.result = result;
  }
}

/** Parses an exit frame's payload; a payload that is not an ExecResult is a protocol error. */
export function parseExecResult(payload: Uint8Array): ExecResultDocument {
  let doc: unknown;
  try {
    const buf = Buffer.isBuffer(payload) ? payload : Buffer.from(payload.buffer, payload.byteOffset, payload.length);
    doc = JSON.parse(buf.toString("utf8"));
  } catch (e) {
    throw new CrucibleError(0, "protocol_error", `the exit frame is not JSON: ${(e as Error).message}`);
  }
  if (typeof doc !== "object" || doc === null || typeof (doc as { exit_code?: unknown }).exit_code !== "number") {
    throw new CrucibleError(0, "protocol_error", "the exit frame is not an ExecResult (no numeric exit_code)");
  }
  return doc as ExecResultDocument;
}
