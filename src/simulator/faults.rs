//! Fault knobs. Request-level counters (`*_next`) are consumed one per API request, in a
//! fixed order, so a test that sets `rate_limit_next: 2` gets exactly two 429s. Line-level
//! knobs (`*_every`) and the batch-level flags are read once, when a batch is created,
//! so changing faults later never rewrites a batch already submitted.

use std::time::Duration;

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::error::ApiError;

/// All fault knobs; `Default` is a well-behaved provider. Unknown JSON keys are rejected so a
/// misspelt knob fails the test that sets it instead of silently injecting nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// The next N API requests get 429 `rate_limit_exceeded` with `retry-after`.
    pub rate_limit_next: u32,
    /// `retry-after` seconds sent with `rate_limit_next` 429s.
    pub retry_after_secs: u32,
    /// The next N API requests get 429 `insufficient_quota` (no `retry-after`: not retryable).
    /// Gemini: a per-day `QuotaFailure` that still carries `RetryInfo` of `retry_after_secs`
    /// (left out at 0), as the real service answers.
    pub insufficient_quota_next: u32,
    /// The next N API requests get an overload answer with `retry-after` (Anthropic: 529
    /// `overloaded_error`; OpenAI, which has no 529: 503 `server_error`).
    pub overloaded_next: u32,
    /// The next N API requests get a `server_error`, alternating 503 and 500.
    pub server_error_next: u32,
    /// The next N API requests get 401 `invalid_api_key`.
    pub unauthorized_next: u32,
    /// Delay before answering every API request.
    pub slow_ms: u64,
    /// The next N successful batch creations create the batch, then close the connection
    /// without answering: the client cannot know whether its create happened.
    pub drop_after_create_next: u32,
    /// Batches end `expired`: about half the lines answered, the rest `batch_expired`.
    /// Gemini: no output at all. Bedrock: `Expired`, a job that never began, no output.
    pub expire_batches: bool,
    /// Bedrock dialect: jobs run out of time while running and end `PartiallyCompleted`
    /// with the first half of the records answered and the rest missing from the output.
    pub partial_batches: bool,
    /// Every Nth input line (1-based) is answered with an error line.
    pub failed_line_every: u32,
    /// Every Nth line of the output file is truncated JSON.
    pub malformed_line_every: u32,
    /// Every Nth line of the output file is written twice.
    pub duplicate_line_every: u32,
    /// Every Nth input line (1-based) gets model content that violates the request's schema
    /// (`code-review@1`: line 0, severity `urgent`; see `Flaw::Invalid`).
    pub invalid_output_every: u32,
    /// Batches fail validation (`failed`, with `errors.data`).
    pub fail_batch_validation: bool,
    /// Models the simulated account cannot use: a synchronous call naming one gets 404
    /// `model_not_found` (OpenAI) or `not_found_error` (Anthropic); Vertex: 404 `NOT_FOUND`
    /// "Publisher Model … was not found …" on `:countTokens`.
    pub missing_models: Vec<String>,
    /// The organisation's enqueued-token limit (0: none). A batch whose input tokens plus
    /// those of the batches still running exceed it is created, then ends `failed` with
    /// `token_limit_exceeded`, as OpenAI does.
    pub enqueued_token_limit: u64,
    /// The next N batch retrievals answer 404 in the provider's words, although the batch
    /// exists (the intermittent 404s users of both APIs report).
    pub poll_not_found_next: u32,
    /// Injected error answers carry `x-should-retry: false`.
    pub should_retry_false: bool,
    /// Listing batches shows this many other batches, newer than any real one, first
    /// (another client of the same organisation, busy).
    pub foreign_batches: u32,
    /// Batch input files over this many bytes are refused at upload (0: the real 200 MB).
    pub max_input_file_bytes: u64,
    /// Azure dialect: batch files without an expiry a resource may hold (0: Azure's 500);
    /// an upload past it is 400 `quotaExceeded`.
    pub azure_unexpiring_file_quota: u32,
    /// The next N batch uploads are refused as a payload the service will not take (not for
    /// their size): Azure 400 `invalidPayload`, OpenAI 400 `invalid_request_error`.
    pub refuse_upload_next: u32,
    /// Vertex dialect: while set, a job that falls due reads `JOB_STATE_PAUSED` ("stopped,
    /// and can be resumed") and goes no further; cleared, it resumes and ends at its next
    /// read. Read at every read, unlike the other batch-level flags: a pause comes from
    /// outside the job.
    pub pause_jobs: bool,
    /// Vertex dialect: the machine's access scopes lack `cloud-platform`, as on a Compute
    /// Engine VM created with the default scopes. Its metadata server ignores the scopes a
    /// client asks for, so every API call on a token it issued is 403 `PERMISSION_DENIED`
    /// `ACCESS_TOKEN_SCOPE_INSUFFICIENT`.
    pub vm_lacks_cloud_platform_scope: bool,
    /// Vertex dialect: prediction lines keep the input line's `key` beside `request`. Off by
    /// default: no Google source says the service copies fields beside `request` into its
    /// output (BerriAI/litellm#14044 found it does not), so the simulator drops them unless
    /// told otherwise and the adapter must correlate through the request's `labels`.
    pub vertex_echoes_key: bool,
    /// Every Nth input line (1-based; for the synchronous chat endpoint, every Nth call)
    /// asks for a long answer of `long_answer_tokens` output tokens. Under a smaller output
    /// budget (`max_completion_tokens`, else `max_tokens`; OpenAI without either: the model's
    /// own 16,384) it is cut off there: OpenAI `finish_reason: "length"`, Anthropic
    /// `stop_reason: "max_tokens"`. Alternately the cut-off content is a *valid* prefix (the
    /// first half of the findings, which passes `code-review@1`) and a torn one (half the
    /// JSON text; Anthropic: a tool call with an empty input). With a budget that fits it is
    /// answered in full, billed at `long_answer_tokens`.
    pub truncate_every: u32,
    /// Output tokens a `truncate_every` answer needs (default 4000).
    pub long_answer_tokens: u32,
    /// Every Nth input line (1-based; chat: every Nth call) is declined. OpenAI:
    /// `message.content: null`, `message.refusal: "I'm sorry, I cannot help with that."`.
    /// Anthropic, alternately: `stop_reason: "refusal"` with no content, and `end_turn`
    /// with that sentence as text and no call of the forced tool.
    pub refuse_every: u32,
    /// Per source (its id, content and the request's schema), the first N answers violate
    /// the request's schema, as a model does before it is re-asked (see `Flaw::Invalid`).
    /// TEST BEHAVIOUR, not a modelled provider behaviour. An answer's attempt number is the
    /// larger of the answers this simulator already gave the source while this knob or
    /// `ungrounded_first` was on, and the answers the request's conversation carries
    /// (`assistant` turns; Gemini `model` turns), plus one: a re-ask is answered by the
    /// next attempt whether or not it replays the conversation. Refusals, cut-off answers
    /// and error lines are not attempts.
    pub invalid_first: u32,
    /// After the `invalid_first` attempts, the next N answers per source are schema-valid
    /// but ungrounded (see `Flaw::Ungrounded`). TEST BEHAVIOUR, like `invalid_first`.
    pub ungrounded_first: u32,
    /// Bedrock dialect: the account's "minimum number of records per batch inference job"
    /// quota (Bedrock's default 100); a job with fewer records fails validation.
    pub bedrock_min_records: u32,
    /// Gemini dialect: the model's input token limit (0: none). A batch request over it is
    /// answered with Gemini's per-request error, a bare `google.rpc.Status` with code 3
    /// (`INVALID_ARGUMENT`), and the batch still succeeds (docs/PROVIDERS.md).
    pub max_input_tokens: u64,
    /// Gemini dialect: every Nth input line (1-based) is answered without a
    /// `finishReason`, which the API reference says means the model has not stopped.
    pub unfinished_every: u32,
    /// Gemini dialect: every Nth per-request error row (1-based, counted per batch) comes
    /// without its key (`key` in a responses file, `metadata` inline). One third-party
    /// measurement saw such rows; no Google source confirms or rules them out.
    pub keyless_error_every: u32,
    /// Every Nth input line (1-based) gets a schema-valid, grounded answer whose findings
    /// differ from the plain answer's (see `Flaw::Disagree`): a second model reading the
    /// same source differently. TEST BEHAVIOUR, for evaluations (docs/EVALUATIONS.md).
    pub disagree_every: u32,
    /// Every Nth input line (1-based) gets its answer wrapped in prose, so the content is
    /// not JSON (OpenAI and Gemini dialects; Anthropic's forced tool input is always an
    /// object). TEST BEHAVIOUR: what a model without structured outputs sends.
    pub not_json_every: u32,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            rate_limit_next: 0,
            retry_after_secs: 1,
            insufficient_quota_next: 0,
            overloaded_next: 0,
            server_error_next: 0,
            unauthorized_next: 0,
            slow_ms: 0,
            drop_after_create_next: 0,
            expire_batches: false,
            partial_batches: false,
            failed_line_every: 0,
            malformed_line_every: 0,
            duplicate_line_every: 0,
            invalid_output_every: 0,
            fail_batch_validation: false,
            missing_models: Vec::new(),
            enqueued_token_limit: 0,
            poll_not_found_next: 0,
            should_retry_false: false,
            foreign_batches: 0,
            max_input_file_bytes: 0,
            azure_unexpiring_file_quota: 0,
            refuse_upload_next: 0,
            pause_jobs: false,
            vm_lacks_cloud_platform_scope: false,
            vertex_echoes_key: false,
            truncate_every: 0,
            long_answer_tokens: DEFAULT_LONG_ANSWER_TOKENS,
            refuse_every: 0,
            invalid_first: 0,
            ungrounded_first: 0,
            bedrock_min_records: super::bedrock::MIN_RECORDS as u32,
            max_input_tokens: 0,
            unfinished_every: 0,
            keyless_error_every: 0,
            disagree_every: 0,
            not_json_every: 0,
        }
    }
}

/// Output tokens of a `truncate_every` answer unless the knob says otherwise.
pub(super) const DEFAULT_LONG_ANSWER_TOKENS: u32 = 4000;

/// What the simulated model does with the request at one position (1-based), after any
/// error line: decline, give a long answer (cut off under a small budget), or answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// `first_kind` alternates the two refusal shapes (odd occurrences: true).
    Refuse {
        first_kind: bool,
    },
    /// An answer that needs `needs` output tokens; `valid_prefix` alternates what a cut-off
    /// one looks like (odd occurrences: a valid prefix).
    Long {
        needs: u32,
        valid_prefix: bool,
    },
    Answer {
        flaw: Flaw,
    },
}

/// What is wrong with an answer on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    None,
    /// It violates the request's schema (`invalid_output_every`, `invalid_first`):
    /// `code-review@1` findings on line 0 with severity `urgent`, any other schema a
    /// required property left out.
    Invalid,
    /// Valid and grounded, but not what the plain answer finds (`disagree_every`):
    /// `code-review@1` leaves out its last finding and adds one on line 1 under the rule
    /// `readability`; any other schema's answer is left as it is.
    Disagree,
    /// The plain answer inside prose, so the text is not JSON (`not_json_every`).
    NotJson,
    /// Schema-valid, but about things the source does not contain (`ungrounded_first`):
    /// `code-review@1` gets two made-up findings, one on a line past the end of the source
    /// and one in a file it never names; any other schema one more finding whose quotes,
    /// files and line numbers point outside the source.
    Ungrounded,
}

impl Faults {
    pub fn behaviour(&self, position: usize) -> Behaviour {
        if every(self.refuse_every, position) {
            return Behaviour::Refuse { first_kind: odd_occurrence(self.refuse_every, position) };
        }
        if every(self.truncate_every, position) {
            let valid_prefix = odd_occurrence(self.truncate_every, position);
            return Behaviour::Long { needs: self.long_answer_tokens, valid_prefix };
        }
        let flaw = if every(self.invalid_output_every, position) {
            Flaw::Invalid
        } else if every(self.not_json_every, position) {
            Flaw::NotJson
        } else if every(self.disagree_every, position) {
            Flaw::Disagree
        } else {
            Flaw::None
        };
        Behaviour::Answer { flaw }
    }
}

/// True for the 1st, 3rd, 5th … position an `every` knob fires on.
fn odd_occurrence(every: u32, position: usize) -> bool {
    every != 0 && (position / every as usize) % 2 == 1
}

/// A request-level fault chosen for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Injected {
    Unauthorized,
    /// The delay a dialect whose quota answers carry one says to wait (Gemini's
    /// `RetryInfo`); 0: none given.
    InsufficientQuota {
        retry_after_secs: u32,
    },
    RateLimited {
        retry_after_secs: u32,
    },
    Overloaded {
        retry_after_secs: u32,
    },
    ServerError {
        unavailable: bool,
    },
}

impl Faults {
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.slow_ms)
    }

    /// Consumes at most one request-level fault. `served_server_errors` picks 503 or 500 so
    /// that consecutive server errors alternate.
    pub fn take_request_fault(&mut self, served_server_errors: u64) -> Option<Injected> {
        if take(&mut self.unauthorized_next) {
            return Some(Injected::Unauthorized);
        }
        if take(&mut self.insufficient_quota_next) {
            return Some(Injected::InsufficientQuota { retry_after_secs: self.retry_after_secs });
        }
        if take(&mut self.rate_limit_next) {
            return Some(Injected::RateLimited { retry_after_secs: self.retry_after_secs.max(1) });
        }
        if take(&mut self.overloaded_next) {
            return Some(Injected::Overloaded { retry_after_secs: self.retry_after_secs.max(1) });
        }
        if take(&mut self.server_error_next) {
            return Some(Injected::ServerError { unavailable: served_server_errors.is_multiple_of(2) });
        }
        None
    }

    pub fn take_drop_after_create(&mut self) -> bool {
        take(&mut self.drop_after_create_next)
    }

    pub fn take_poll_not_found(&mut self) -> bool {
        take(&mut self.poll_not_found_next)
    }
}

fn take(counter: &mut u32) -> bool {
    if *counter == 0 {
        return false;
    }
    *counter -= 1;
    true
}

/// True for the Nth, 2Nth, … item of a 1-based sequence; `every == 0` never fires.
pub(super) fn every(every: u32, position: usize) -> bool {
    every != 0 && position.is_multiple_of(every as usize)
}

impl Injected {
    pub fn into_error(self) -> ApiError {
        match self {
            Injected::Unauthorized => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "Incorrect API key provided. (SIMULATED fault: unauthorized_next)",
            )
            .code("invalid_api_key"),
            Injected::InsufficientQuota { .. } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "insufficient_quota",
                "You exceeded your current quota, please check your plan and billing details. \
                 (SIMULATED fault: insufficient_quota_next)",
            )
            .code("insufficient_quota"),
            Injected::RateLimited { retry_after_secs } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                format!(
                    "Rate limit reached for requests. Please try again in {retry_after_secs}s. \
                     (SIMULATED fault: rate_limit_next)"
                ),
            )
            .code("rate_limit_exceeded")
            .header("retry-after", retry_after_secs.to_string())
            .header("retry-after-ms", (u64::from(retry_after_secs) * 1000).to_string())
            .header("x-ratelimit-limit-requests", "60".to_string())
            .header("x-ratelimit-remaining-requests", "0".to_string())
            .header("x-ratelimit-reset-requests", format!("{retry_after_secs}s"))
            .header("x-ratelimit-limit-tokens", "150000".to_string())
            .header("x-ratelimit-remaining-tokens", "0".to_string())
            .header("x-ratelimit-reset-tokens", format!("{retry_after_secs}s")),
            Injected::Overloaded { retry_after_secs } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "The engine is currently overloaded, please try again later. (SIMULATED fault: overloaded_next)",
            )
            .header("retry-after", retry_after_secs.to_string()),
            Injected::ServerError { unavailable } => {
                let status =
                    if unavailable { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::INTERNAL_SERVER_ERROR };
                ApiError::new(
                    status,
                    "server_error",
                    "The server had an error while processing your request. \
                     (SIMULATED fault: server_error_next)",
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_consumed_exactly_and_in_order() {
        let mut faults = Faults {
            unauthorized_next: 1,
            insufficient_quota_next: 1,
            rate_limit_next: 2,
            retry_after_secs: 3,
            server_error_next: 2,
            ..Faults::default()
        };
        let mut served = 0;
        let mut got = Vec::new();
        while let Some(fault) = faults.take_request_fault(served) {
            if matches!(fault, Injected::ServerError { .. }) {
                served += 1;
            }
            got.push(fault);
        }
        assert_eq!(
            got,
            [
                Injected::Unauthorized,
                Injected::InsufficientQuota { retry_after_secs: 3 },
                Injected::RateLimited { retry_after_secs: 3 },
                Injected::RateLimited { retry_after_secs: 3 },
                Injected::ServerError { unavailable: true },
                Injected::ServerError { unavailable: false },
            ]
        );
        assert_eq!(faults, Faults { retry_after_secs: 3, ..Faults::default() });
        assert_eq!(faults.take_request_fault(served), None);
    }

    #[test]
    fn drop_after_create_counts_down() {
        let mut faults = Faults { drop_after_create_next: 2, ..Faults::default() };
        assert!(faults.take_drop_after_create());
        assert!(faults.take_drop_after_create());
        assert!(!faults.take_drop_after_create());
    }

    #[test]
    fn every_fires_on_multiples_only() {
        let hits: Vec<usize> = (1..=10).filter(|p| every(3, *p)).collect();
        assert_eq!(hits, [3, 6, 9]);
        assert!(!(1..=10).any(|p| every(0, p)));
    }

    #[test]
    fn behaviours_take_turns_and_alternate_their_shapes() {
        let faults = Faults { refuse_every: 3, truncate_every: 2, invalid_output_every: 5, ..Faults::default() };
        let got: Vec<Behaviour> = (1..=6).map(|p| faults.behaviour(p)).collect();
        let long = |valid_prefix| Behaviour::Long { needs: DEFAULT_LONG_ANSWER_TOKENS, valid_prefix };
        assert_eq!(
            got,
            [
                Behaviour::Answer { flaw: Flaw::None },
                long(true),
                Behaviour::Refuse { first_kind: true },
                long(false),
                Behaviour::Answer { flaw: Flaw::Invalid },
                Behaviour::Refuse { first_kind: false },
            ]
        );
    }

    #[test]
    fn partial_json_fills_defaults_and_typos_are_rejected() {
        let faults: Faults = serde_json::from_str(r#"{"rate_limit_next": 2}"#).unwrap();
        assert_eq!(faults.rate_limit_next, 2);
        assert_eq!(faults.retry_after_secs, 1);
        assert!(serde_json::from_str::<Faults>(r#"{"rate_limit_nxt": 2}"#).is_err());
    }

    #[test]
    fn rate_limit_error_carries_retry_headers() {
        let error = Injected::RateLimited { retry_after_secs: 2 }.into_error();
        assert_eq!(error.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(error.header_value("retry-after"), Some("2"));
        assert_eq!(error.header_value("retry-after-ms"), Some("2000"));
        let quota = Injected::InsufficientQuota { retry_after_secs: 0 }.into_error();
        assert_eq!(quota.header_value("retry-after"), None);
    }
}
