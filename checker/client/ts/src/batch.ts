// Coalescing of concurrent checks into CheckRateLimits calls: checker/client/batch.go.
import { Code, ConnectError } from "@connectrpc/connect";
import type { CheckRateLimitRequest, CheckRateLimitResponse } from "./gen/quotaflow/v1/ratelimit_pb.js";
import type { Client } from "./client.js";

interface Call {
  msg: CheckRateLimitRequest;
  /** The caller stopped waiting (its signal ended). */
  gone: boolean;
  /** Called when the caller leaves, set while the call's batch is in flight. */
  onGone?: () => void;
  resolve(r: CheckRateLimitResponse): void;
  reject(err: unknown): void;
}

/** Coalesces the checks of concurrent callers. A check that finds no batch in flight leaves at
 * once: waiting would only add latency. Checks that arrive while a batch is in flight wait for
 * it to come back, at most batchWaitMs, and a batch of batchMax leaves at once. */
export class Batcher {
  private pending: Call[] = [];
  private timer?: ReturnType<typeof setTimeout>;
  private inFlight = 0;

  constructor(private c: Client) {}

  /** Sends msg with the next batch and waits for its answer or the caller's signal. */
  check(msg: CheckRateLimitRequest, signal?: AbortSignal): Promise<CheckRateLimitResponse> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      // The batch still goes out when the caller leaves: the check may be charged, as a
      // cancelled CheckRateLimit may.
      const call: Call = {
        msg,
        gone: false,
        resolve: (r) => (done(), resolve(r)),
        reject: (e) => (done(), reject(e)),
      };
      const onAbort = () => {
        call.gone = true;
        call.onGone?.();
        reject(signal!.reason);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      const done = () => signal?.removeEventListener("abort", onAbort);
      this.pending.push(call);
      if (this.inFlight === 0 || this.pending.length >= this.c.cfg.batchMax) {
        this.send(this.take());
      } else if (this.pending.length === 1) {
        this.timer = setTimeout(() => this.flushNow(), this.c.cfg.batchWaitMs);
      }
    });
  }

  /** Sends the pending batch, if any. */
  flushNow(): void {
    const p = this.take();
    if (p.length > 0) this.send(p);
  }

  private take(): Call[] {
    const p = this.pending;
    this.pending = [];
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    if (p.length > 0) this.inFlight++;
    return p;
  }

  /** Sends one batch, retried as a whole while it fails transiently (its checks keep their
   * idempotency keys), and answers each call; then sends the checks that waited for it. The
   * callers' signals do not bound it, as it serves them all; once every one of them has left,
   * its retries stop. */
  private async send(calls: Call[]): Promise<void> {
    const everyoneGone = new AbortController();
    for (const cl of calls) cl.onGone = () => calls.every((c) => c.gone) && everyoneGone.abort();
    if (calls.every((c) => c.gone)) everyoneGone.abort();
    try {
      if (calls.length === 1) {
        calls[0].resolve(await this.c.checkOne(calls[0].msg, everyoneGone.signal));
        return;
      }
      const resp = await this.c.retry(everyoneGone.signal, (o) => this.c.rpc.checkRateLimits({ checks: calls.map((c) => c.msg) }, o));
      if (resp.results.length !== calls.length) {
        throw new ConnectError(`checker answered ${resp.results.length} checks of ${calls.length}`, Code.Internal);
      }
      calls.forEach((cl, i) => {
        const r = resp.results[i].result;
        if (r.case === "response") cl.resolve(r.value);
        else if (r.case === "error") cl.reject(new ConnectError(r.value.message, r.value.code as Code));
        else cl.reject(new ConnectError("checker answered a check with neither a response nor an error", Code.Internal));
      });
    } catch (err) {
      for (const cl of calls) cl.reject(err);
    } finally {
      this.inFlight--;
      const p = this.take();
      if (p.length > 0) this.send(p);
    }
  }
}
