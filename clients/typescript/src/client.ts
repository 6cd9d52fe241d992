// The HTTP calls a worker makes, each retried with backoff where a retry is safe: a result
// posted twice is a replay, an extension sets the same expiry again, and a claim whose
// answer was lost leaves a lease that simply expires.

import type { ClaimRequest, ErrorBody, Grant, IntakeReply, LeaseReply, ResultReply, Usage } from "./types.js";

/** An answer of the documented error shape `{"error": {"code", "message", "details"?}}`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details?: unknown,
  ) {
    super(`${status} ${code}: ${message}`);
    this.name = "ApiError";
  }

  /** `409 stale_lease`: the token is not the current lease; another worker has the work. */
  get staleLease(): boolean {
    return this.code === "stale_lease";
  }
}

export interface RetryPolicy {
  attempts: number;
  baseMs: number;
  maxMs: number;
}

export interface ClientOptions {
  token?: string;
  retry?: Partial<RetryPolicy>;
  timeoutMs?: number;
}

// The server is busy (429) or briefly unable (5xx): worth another try.
const RETRYABLE = new Set([429, 500, 502, 503, 504]);

export class Client {
  private readonly base: string;
  private readonly retry: RetryPolicy;

  constructor(
    baseUrl: string,
    private readonly options: ClientOptions = {},
  ) {
    this.base = baseUrl.replace(/\/+$/, "");
    this.retry = { attempts: 6, baseMs: 200, maxMs: 10_000, ...options.retry };
  }

  async claim(request: ClaimRequest): Promise<Grant[]> {
    const body = { limit: 1, lease_seconds: 300, ...request };
    const page = await this.request<{ claims: Grant[] }>("POST", "/v1/claims", body);
    return page.claims;
  }

  /** The lease's new expiry; an `ApiError` with `staleLease` once the work is another's. */
  async extendLease(extractionId: string, leaseToken: string, leaseSeconds: number): Promise<LeaseReply> {
    const body = { lease_token: leaseToken, lease_seconds: leaseSeconds };
    return this.request<LeaseReply>("POST", `/v1/extractions/${extractionId}/lease`, body);
  }

  async postResult(
    extractionId: string,
    leaseToken: string,
    output: unknown,
    options: { usage?: Usage; reask?: boolean } = {},
  ): Promise<ResultReply> {
    const body = { lease_token: leaseToken, output, reask: options.reask ?? true, ...(options.usage ? { usage: options.usage } : {}) };
    return this.request<ResultReply>("POST", `/v1/extractions/${extractionId}/result`, body);
  }

  async submit(item: { tenant: string; source_id: string; schema: string; content: string; metadata?: object }): Promise<IntakeReply> {
    return this.request<IntakeReply>("POST", "/v1/extractions", item);
  }

  async extraction(extractionId: string): Promise<Record<string, unknown>> {
    return this.request<Record<string, unknown>>("GET", `/v1/extractions/${extractionId}`);
  }

  /** One call with retries on connection errors, 429 and 5xx, never sooner than `Retry-After`. */
  async request<T>(method: string, path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.options.token) headers["authorization"] = `Bearer ${this.options.token}`;
    for (let attempt = 0; ; attempt++) {
      const last = attempt === this.retry.attempts - 1;
      let response: Response;
      try {
        response = await fetch(this.base + path, {
          method,
          headers,
          body: body === undefined ? null : JSON.stringify(body),
          signal: AbortSignal.timeout(this.options.timeoutMs ?? 30_000),
        });
      } catch (e) {
        if (last) throw e;
        await sleep(this.delay(attempt, undefined));
        continue;
      }
      if (response.ok) return (await response.json()) as T;
      if (RETRYABLE.has(response.status) && !last) {
        await response.body?.cancel();
        await sleep(this.delay(attempt, retryAfterMs(response.headers.get("retry-after"))));
        continue;
      }
      throw await errorOf(response);
    }
  }

  private delay(attempt: number, retryAfter: number | undefined): number {
    const backoff = Math.random() * Math.min(this.retry.maxMs, this.retry.baseMs * 2 ** attempt);
    return Math.max(backoff, retryAfter ?? 0);
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Milliseconds from a `Retry-After` of delta-seconds (commitpoint sends no HTTP dates). */
function retryAfterMs(value: string | null): number | undefined {
  const seconds = value === null ? NaN : Number(value);
  return Number.isFinite(seconds) && seconds >= 0 ? seconds * 1000 : undefined;
}

async function errorOf(response: Response): Promise<ApiError> {
  const text = await response.text();
  try {
    const { error } = JSON.parse(text) as ErrorBody;
    return new ApiError(response.status, error.code, error.message, error.details);
  } catch {
    return new ApiError(response.status, "unexpected_answer", text.slice(0, 200));
  }
}
