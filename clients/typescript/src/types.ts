// The worker API's shapes, written by hand after the OpenAPI document's components
// (`ClaimGrant`, `ResultReply`, `LeaseReply`, `ErrorBody`); docs/API.md has the prose.

export interface IssueView {
  path: string;
  message: string;
}

export interface PreviousAttempt {
  output: string;
  issues: IssueView[];
}

export interface Grant {
  extraction_id: string;
  lease_token: string;
  lease_expires_at: string;
  tenant: string;
  source_id: string;
  schema: string;
  attempt: number;
  metadata: Record<string, unknown> | null;
  content: string;
  instructions: string;
  schema_url: string;
  previous_attempt: PreviousAttempt | null;
}

export interface ClaimRequest {
  worker: string;
  limit?: number;
  lease_seconds?: number;
  schema?: string;
}

export interface Usage {
  model: string;
  input_tokens: number;
  output_tokens: number;
  cached_input_tokens?: number;
  reasoning_tokens?: number;
  cost_micros?: number;
  request_id?: string;
  provider?: string;
  latency_ms?: number;
}

export interface ResultReply {
  state: "committed";
  findings: number;
  /** True when the extraction was already committed: nothing was written. */
  replay: boolean;
}

export interface LeaseReply {
  lease_token: string;
  lease_expires_at: string;
}

export interface IntakeReply {
  extraction_id: string;
  state: string;
  created: boolean;
}

export interface ErrorBody {
  error: { code: string; message: string; details?: unknown };
}
