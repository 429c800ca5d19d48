// HearthError: every failure of the package, with a code to branch on and a
// message that says what to do next.

import type { HearthErrorCode } from './types.js';

const CODES: readonly HearthErrorCode[] = [
  'unsupported-backend', 'no-acceleration', 'unsupported-model', 'quota-exceeded', 'network',
  'not-cached', 'aborted', 'bad-request', 'unloaded', 'internal',
];

/** An error of the package; `code` says what kind. */
export class HearthError extends Error {
  readonly code: HearthErrorCode;

  constructor(code: HearthErrorCode, message: string) {
    super(message);
    this.name = 'HearthError';
    this.code = code;
  }

  /** The error as plain data, to cross a worker boundary. */
  toJSON(): { code: HearthErrorCode; message: string } {
    return { code: this.code, message: this.message };
  }

  /** Any thrown value as a HearthError. The wasm facade prefixes its
   * messages with a code (`unsupported-model: ...`). */
  static from(err: unknown): HearthError {
    if (err instanceof HearthError) return err;
    if (err && typeof err === 'object' && 'code' in err && 'message' in err) {
      const { code, message } = err as { code: string; message: string };
      if ((CODES as readonly string[]).includes(code)) return new HearthError(code as HearthErrorCode, message);
    }
    if (err instanceof DOMException && err.name === 'AbortError') {
      return new HearthError('aborted', 'the load was aborted');
    }
    if (err instanceof DOMException && err.name === 'QuotaExceededError') {
      return new HearthError('quota-exceeded', `the browser refused to store more: ${err.message}; free space with Hearth.cache.delete()`);
    }
    const text = err instanceof Error ? err.message : String(err);
    const m = /^([a-z-]+): ([\s\S]*)$/.exec(text);
    if (m && (CODES as readonly string[]).includes(m[1]!)) return new HearthError(m[1] as HearthErrorCode, m[2]!);
    return new HearthError('internal', text);
  }
}
