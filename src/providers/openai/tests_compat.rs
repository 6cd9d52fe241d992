//! The adapter against the simulator speaking a Groq-like platform (another base path,
//! metadata dropped or refused, one-page lists, its 429 headers): a lost create is found
//! by its input file, never claimed absent while a batch could still be ours.

use std::time::Duration;

use super::*;
use crate::domain::batch::BatchMember;
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::schema::{BUILTIN_CODE_REVIEW, Registry};
use crate::simulator::{Faults, MetadataMode, RateLimitHeaders, Simulator, SimulatorConfig, Variant};

async fn start(variant: Variant, faults: Faults) -> Simulator {
    let config = SimulatorConfig { api_key: Some("gsk-sim".into()), variant, faults, ..SimulatorConfig::default() };
    Simulator::start(([127, 0, 0, 1], 0).into(), config).await.unwrap()
}

fn adapter(sim: &Simulator, metadata_kept: bool) -> OpenAiBatches {
    OpenAiBatches::new(OpenAiConfig {
        name: "groq".into(),
        base_url: sim.base_url(),
        api_key: ApiKey::new("gsk-sim".into()),
        model: "llama-3.1-8b-instant".into(),
        request_timeout: Duration::from_secs(5),
        max_completion_tokens: None,
        max_completion_tokens_cap: 16_384,
    })
    .unwrap()
    .with_flavour(Flavour::openai(metadata_kept))
}

fn members(n: usize) -> Vec<BatchMember> {
    (0..n)
        .map(|i| {
            let source = format!("f{i}.rs");
            let hash = SourceHash::compute(source.as_bytes(), BUILTIN_CODE_REVIEW);
            BatchMember {
                id: ExtractionId::compute("t", &source, &hash, BUILTIN_CODE_REVIEW),
                source_id: source,
                content: "let x = y.unwrap();".into(),
                output_budget: None,
                previous_attempt: None,
            }
        })
        .collect()
}

fn intent<'a>(key: &'a str, known: &'a [String]) -> IntentRef<'a> {
    IntentRef { batch_key: key, created_at_ms: crate::domain::clock::now_ms(), members: &[], known_jobs: known }
}

#[tokio::test]
async fn a_create_lost_on_a_platform_without_metadata_is_found_by_its_input_file() {
    let sim = start(Variant::groq_like(), Faults { drop_after_create_next: 1, ..Faults::default() }).await;
    assert!(sim.base_url().ends_with("/openai/v1"), "{}", sim.base_url());
    let provider = adapter(&sim, false);
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let members = members(3);
    let spec = BatchSpec { batch_key: "cpb-lost", schema: &schema, members: &members };
    let err = provider.submit(&spec).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert_eq!(sim.stats().batches_created, 1);

    let Lookup::Found(job) = provider.find_job(&intent("cpb-lost", &[])).await.unwrap() else { panic!("not found") };
    assert_eq!(provider.poll(&job).await.unwrap().job_id, job);
    // Another intent, never uploaded: no file, so no batch can be its.
    assert_eq!(provider.find_job(&intent("cpb-never", &[])).await.unwrap(), Lookup::Absent);
    assert_eq!(sim.stats().batches_created, 1, "a lookup creates nothing");
}

#[tokio::test]
async fn an_upload_without_a_batch_is_absent_and_a_list_too_long_is_undecided() {
    let sim = start(Variant::groq_like(), Faults::default()).await;
    let provider = adapter(&sim, false);
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let members = members(2);
    provider.upload(&BatchSpec { batch_key: "cpb-upload-only", schema: &schema, members: &members }).await.unwrap();
    assert_eq!(provider.find_job(&intent("cpb-upload-only", &[])).await.unwrap(), Lookup::Absent);

    // OpenAI-style paged lists with more batches of another client than a lookup walks.
    let busy = start(Variant { metadata: MetadataMode::Ignored, ..Variant::default() }, Faults::default()).await;
    let provider = adapter(&busy, false);
    provider.upload(&BatchSpec { batch_key: "cpb-busy", schema: &schema, members: &members }).await.unwrap();
    busy.set_faults(Faults { foreign_batches: 2_500, ..Faults::default() });
    let lookup = provider.find_job(&intent("cpb-busy", &[])).await.unwrap();
    assert!(matches!(lookup, Lookup::Undecided { .. }), "{lookup:?}");
}

#[tokio::test]
async fn refused_metadata_is_left_out_and_the_lookup_stops_trusting_it() {
    let sim = start(Variant { metadata: MetadataMode::Refused, ..Variant::groq_like() }, Faults::default()).await;
    let provider = adapter(&sim, true);
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let members = members(2);
    let job = provider.submit(&BatchSpec { batch_key: "cpb-r", schema: &schema, members: &members }).await.unwrap();
    assert_eq!(sim.stats().batches_created, 1, "the refused create created nothing; the second did");
    assert!(!provider.metadata_trusted());
    assert_eq!(provider.find_job(&intent("cpb-r", &[])).await.unwrap(), Lookup::Found(job));
}

#[tokio::test]
async fn dropped_metadata_seen_on_a_create_turns_the_lookup_to_files() {
    let sim = start(Variant::groq_like(), Faults::default()).await;
    let provider = adapter(&sim, true);
    assert!(provider.metadata_trusted());
    let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
    let members = members(1);
    let job = provider.submit(&BatchSpec { batch_key: "cpb-d", schema: &schema, members: &members }).await.unwrap();
    assert!(!provider.metadata_trusted(), "a create answered without the key");
    assert_eq!(provider.find_job(&intent("cpb-d", &[])).await.unwrap(), Lookup::Found(job));
}

#[tokio::test]
async fn a_429_with_only_reset_headers_still_says_when() {
    let variant = Variant { rate_limit_headers: RateLimitHeaders::ResetOnly, ..Variant::groq_like() };
    let sim = start(variant, Faults { rate_limit_next: 1, retry_after_secs: 3, ..Faults::default() }).await;
    let provider = adapter(&sim, false);
    let err = provider.poll("batch_x").await.unwrap_err();
    assert_eq!((err.class, err.retry_after), (ErrorClass::RateLimited, Some(Duration::from_secs(3))));
    let groq =
        start(Variant::groq_like(), Faults { rate_limit_next: 1, retry_after_secs: 2, ..Faults::default() }).await;
    let err = adapter(&groq, false).poll("batch_x").await.unwrap_err();
    assert_eq!(err.retry_after, Some(Duration::from_secs(2)));
}
