// The lease-aware work loop: claim, run the handler while a heartbeat extends the lease,
// post the result, and move on whatever the server answers.

import { ApiError, Client, sleep } from "./client.js";
import type { Grant, Usage } from "./types.js";

export interface Answer {
  output: unknown;
  usage?: Usage;
}

export type Handler = (grant: Grant, lease: { lost: () => boolean }) => Promise<Answer>;

export interface WorkOptions {
  worker: string;
  schema?: string;
  leaseSeconds?: number;
  /** Between extensions; a third of the lease by default. */
  heartbeatMs?: number;
  idleMs?: number;
  /** Stop once a claim finds no work. */
  untilIdle?: boolean;
  signal?: AbortSignal;
}

export interface WorkStats {
  committed: number;
  replays: number;
  stale: number;
  refused: number;
  extensions: number;
  handlerErrors: number;
}

/** Claims one extraction at a time and answers it with `handler`, extending the lease in
 * the background so a handler may run longer than `leaseSeconds`. A handler that throws
 * leaves the lease to expire and the work to be claimed again. */
export async function work(client: Client, handler: Handler, options: WorkOptions): Promise<WorkStats> {
  const leaseSeconds = options.leaseSeconds ?? 300;
  const every = options.heartbeatMs ?? Math.max((leaseSeconds * 1000) / 3, 500);
  const stats: WorkStats = { committed: 0, replays: 0, stale: 0, refused: 0, extensions: 0, handlerErrors: 0 };
  while (!options.signal?.aborted) {
    const grants = await client.claim({
      worker: options.worker,
      limit: 1,
      lease_seconds: leaseSeconds,
      ...(options.schema === undefined ? {} : { schema: options.schema }),
    });
    const grant = grants[0];
    if (grant === undefined) {
      if (options.untilIdle) break;
      await sleep(options.idleMs ?? 1000);
      continue;
    }
    const heartbeat = new Heartbeat(client, grant, leaseSeconds, every, stats);
    let answer: Answer;
    try {
      answer = await handler(grant, { lost: () => heartbeat.lost });
    } catch (e) {
      console.warn(`handler failed on ${grant.extraction_id}; its lease will expire:`, e);
      stats.handlerErrors++;
      continue;
    } finally {
      await heartbeat.stop();
    }
    try {
      const reply = await client.postResult(grant.extraction_id, grant.lease_token, answer.output,
        answer.usage ? { usage: answer.usage } : {});
      if (reply.replay) stats.replays++;
      else stats.committed++;
    } catch (e) {
      // A stale lease: another worker has the work; a refusal (409, 422): the server
      // already decided what becomes of it. Anything else is the caller's to see.
      if (!(e instanceof ApiError) || (e.status !== 409 && e.status !== 422)) throw e;
      if (e.staleLease) stats.stale++;
      else stats.refused++;
      console.warn(`result for ${grant.extraction_id} refused: ${e.message}`);
    }
  }
  return stats;
}

class Heartbeat {
  lost = false;
  private stopped = false;
  private wake: (() => void) | undefined;
  private readonly running: Promise<void>;

  constructor(
    private readonly client: Client,
    private readonly grant: Grant,
    private readonly leaseSeconds: number,
    private readonly everyMs: number,
    private readonly stats: WorkStats,
  ) {
    this.running = this.run();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.wake?.();
    await this.running;
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, this.everyMs);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      if (this.stopped) return;
      try {
        await this.client.extendLease(this.grant.extraction_id, this.grant.lease_token, this.leaseSeconds);
        this.stats.extensions++;
      } catch (e) {
        if (e instanceof ApiError && e.status === 409) {
          // Another worker has the work, or it ended: the result will be refused or a replay.
          this.lost = true;
          return;
        }
        // A missed beat is tried again at the next one.
        console.warn(`heartbeat for ${this.grant.extraction_id} failed:`, e);
      }
    }
  }
}
