//! The fuzz targets' entry points on the stable toolchain: every corpus seed and every
//! kept crash (fuzz/corpus/<target>/, fuzz/regressions/<target>/) is replayed, then a
//! few thousand seeded random mutations per target, within a time budget. Also the
//! bad-input classes the catalogue in docs/FUZZING.md lists that no other test covers.
//!
//! Run with `cargo test --features fuzzing --test fuzz_smoke`.

// clippy.toml's allow-expect-in-tests covers #[test] functions only; the helpers fail a
// test the same way, by panicking with a message.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use commitpoint::domain::batch::LineResult;
use commitpoint::fuzzing::{self, TARGETS};
use commitpoint::providers::ResultLine;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The whole random phase stays under this, whatever the machine.
const RANDOM_BUDGET: Duration = Duration::from_secs(14);
const RANDOM_CASES_PER_TARGET: usize = 4000;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn entry(target: &str) -> fn(&[u8]) {
    match TARGETS.iter().find(|(name, _)| *name == target) {
        Some((_, run)) => *run,
        None => panic!("{target}: no entry point in commitpoint::fuzzing::TARGETS"),
    }
}

fn files_under(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut files = Vec::new();
    let Ok(targets) = std::fs::read_dir(dir) else { return files };
    for target in targets {
        let target = target.expect("read dir").path();
        let name = target.file_name().expect("name").to_string_lossy().into_owned();
        for file in std::fs::read_dir(&target).expect("read target dir") {
            files.push((name.clone(), file.expect("read dir").path()));
        }
    }
    files.sort();
    files
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = fuzz_dir().join("corpus").join(target);
    let mut paths: Vec<PathBuf> =
        std::fs::read_dir(&dir).expect("corpus dir").map(|f| f.expect("read dir").path()).collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).expect("read seed")).collect()
}

#[test]
fn every_target_has_seeds_and_every_directory_names_a_target() {
    for (target, _) in TARGETS {
        assert!(!seeds(target).is_empty(), "{target}: no seeds under fuzz/corpus/{target}");
        let source = fuzz_dir().join("fuzz_targets").join(format!("{target}.rs"));
        let text = std::fs::read_to_string(&source).expect("fuzz target source");
        assert!(text.contains(&format!("commitpoint::fuzzing::{target}(")), "{}", source.display());
    }
    for (target, path) in
        files_under(&fuzz_dir().join("corpus")).iter().chain(&files_under(&fuzz_dir().join("regressions")))
    {
        assert!(TARGETS.iter().any(|(name, _)| name == target), "{}: not a target", path.display());
    }
}

#[test]
fn corpus_and_regression_files_replay_without_panicking() {
    let mut replayed = 0;
    for dir in ["corpus", "regressions"] {
        for (target, path) in files_under(&fuzz_dir().join(dir)) {
            let data = std::fs::read(&path).expect("read");
            let outcome = std::panic::catch_unwind(|| entry(&target)(&data));
            assert!(outcome.is_ok(), "{target} panicked on {}", path.display());
            replayed += 1;
        }
    }
    assert!(replayed >= TARGETS.len(), "only {replayed} files replayed");
}

/// Seed mutations in the spirit of libFuzzer's: flips, random bytes, inserted JSON
/// punctuation, truncation, duplication, and splicing two seeds.
fn mutate(rng: &mut StdRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    const TOKENS: &[&[u8]] = &[
        b"{",
        b"}",
        b"[",
        b"]",
        b"\"",
        b":",
        b",",
        b"\n",
        b"null",
        b"-1",
        b"1e999",
        b"18446744073709551616",
        b"\\u0000",
        b"\xff",
        b"\xc3",
        b"v1,",
        b"sha256=",
        b"whsec_",
        b".",
    ];
    let mut data = seeds[rng.random_range(0..seeds.len())].clone();
    for _ in 0..rng.random_range(1..=8) {
        let at = rng.random_range(0..=data.len());
        match rng.random_range(0..6) {
            0 if at < data.len() => data[at] ^= 1 << rng.random_range(0..8),
            1 => data.insert(at, rng.random()),
            2 => {
                let token = TOKENS[rng.random_range(0..TOKENS.len())];
                data.splice(at..at, token.iter().copied());
            }
            3 => data.truncate(at),
            4 if at < data.len() => {
                let end = rng.random_range(at..=data.len());
                let copy = data[at..end].to_vec();
                data.splice(at..at, copy);
            }
            _ => {
                let other = &seeds[rng.random_range(0..seeds.len())];
                let from = rng.random_range(0..=other.len());
                data.truncate(at);
                data.extend_from_slice(&other[from..]);
            }
        }
    }
    data
}

#[test]
fn thousands_of_mutated_and_random_inputs_do_not_panic() {
    let started = Instant::now();
    let per_target = RANDOM_BUDGET / u32::try_from(TARGETS.len()).expect("few targets");
    let mut rng = StdRng::seed_from_u64(0x5eed_f022);
    let mut total = 0;
    for (target, run) in TARGETS {
        let seeds = seeds(target);
        let target_started = Instant::now();
        let mut cases = 0;
        while cases < RANDOM_CASES_PER_TARGET && target_started.elapsed() < per_target {
            let data = if cases % 4 == 0 {
                let len = rng.random_range(0..256);
                (0..len).map(|_| rng.random()).collect()
            } else {
                mutate(&mut rng, &seeds)
            };
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                panic!("{target} panicked on {:?}", String::from_utf8_lossy(&data));
            }
            cases += 1;
        }
        assert!(cases >= 500, "{target}: only {cases} cases in {per_target:?}");
        total += cases;
    }
    assert!(started.elapsed() < RANDOM_BUDGET + Duration::from_secs(5), "{:?}", started.elapsed());
    eprintln!("{total} random inputs in {:?}", started.elapsed());
}

/// Gemini's rows may lack their key (the adapter matches those apart): as keyed lines here.
fn keyed(rows: Vec<Result<(Option<String>, LineResult), String>>) -> Vec<Result<ResultLine, String>> {
    rows.into_iter().map(|row| row.map(|(key, result)| (key.unwrap_or_default(), result))).collect()
}

fn deep(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// Nesting beyond serde_json's limit (128) is an error at every JSON boundary, never a
/// stack overflow: intake bodies, result lines of each provider, completion bodies.
#[test]
fn deep_nesting_is_refused_not_a_stack_overflow() {
    let intake = format!(
        r#"{{"tenant":"acme","source_id":"s","schema":"code-review@1","content":"x","metadata":{{"a":{}}}}}"#,
        deep(100_000)
    );
    let refused = fuzzing::intake(intake.as_bytes()).expect_err("too deep");
    assert!(refused.starts_with("malformed_json:") && refused.contains("recursion limit"), "{refused}");
    let shallow = intake.replace(&deep(100_000), &deep(100));
    assert!(fuzzing::intake(shallow.as_bytes()).is_ok(), "nesting under the limit is fine");

    let nested = deep(50_000);
    let openai = format!(r#"{{"custom_id":"a","response":{{"status_code":200,"body":{nested}}}}}"#);
    let anthropic = format!(r#"{{"custom_id":"a","result":{{"type":"succeeded","message":{{"content":{nested}}}}}}}"#);
    let generic = format!(r#"{{"custom_id":"a","data":{nested}}}"#);
    let mistral = format!(r#"{{"custom_id":"a","response":{{"status_code":200,"body":{nested}}}}}"#);
    let bedrock = format!(r#"{{"recordId":"a","modelOutput":{nested}}}"#);
    let google = format!(r#"{{"key":"a","response":{nested}}}"#);
    for (name, lines) in [
        ("openai", fuzzing::openai_result_file(openai.as_bytes())),
        ("anthropic", fuzzing::anthropic_result_file(anthropic.as_bytes())),
        ("generic", fuzzing::generic_result_file(generic.as_bytes())),
        ("gemini", keyed(fuzzing::gemini_result_file(google.as_bytes()))),
        ("mistral", fuzzing::mistral_result_file(mistral.as_bytes())),
        ("bedrock", fuzzing::bedrock_result_file(bedrock.as_bytes())),
        ("vertex", fuzzing::vertex_result_file(google.as_bytes())),
    ] {
        assert!(matches!(lines.as_slice(), [Err(e)] if e.contains("recursion limit")), "{name}: {lines:?}");
    }
    let completion = fuzzing::chat_completion(format!(r#"{{"choices":{nested}}}"#).as_bytes());
    assert!(completion.is_err_and(|e| e.contains("recursion limit")));
}

/// Invalid UTF-8 in a downloaded result file is decoded lossily, as the adapters read
/// it: the line still parses and only the bad bytes become U+FFFD.
#[test]
fn invalid_utf8_in_a_result_line_is_replaced_not_fatal() {
    let mut file =
        br#"{"custom_id":"a","response":{"status_code":200,"body":{"choices":[{"message":{"content":"ok "#.to_vec();
    file.extend_from_slice(&[0xff, 0xc3]);
    file.extend_from_slice(b"\"}}]}}}\n");
    let lines = fuzzing::openai_result_file(&file);
    let [Ok((id, LineResult::Answer { output, .. }))] = lines.as_slice() else { panic!("{lines:?}") };
    assert_eq!((id.as_str(), output.as_str()), ("a", "ok \u{fffd}\u{fffd}"));
    let refused =
        fuzzing::intake(b"{\"tenant\":\"a\xff\",\"source_id\":\"s\",\"schema\":\"code-review@1\",\"content\":\"x\"}");
    assert!(refused.is_err_and(|e| e.starts_with("malformed_json:")), "invalid UTF-8 in an intake body is a 400");
}

/// A result file cut off mid-line (a dropped download, a crash while the provider wrote
/// it) costs only its last line: every complete line before it still counts.
#[test]
fn a_truncated_result_file_loses_only_its_torn_last_line() {
    let openai =
        r#"{"custom_id":"a","response":{"status_code":200,"body":{"choices":[{"message":{"content":"{}"}}]}}}"#;
    let anthropic = r#"{"custom_id":"a","result":{"type":"expired"}}"#;
    let generic = r#"{"custom_id":"a","data":{"choices":[{"message":{"content":"{}"}}]}}"#;
    type FileParser = fn(&[u8]) -> Vec<Result<ResultLine, String>>;
    let parsers: [(&str, FileParser); 7] = [
        (openai, fuzzing::openai_result_file),
        (anthropic, fuzzing::anthropic_result_file),
        (generic, fuzzing::generic_result_file),
        (r#"{"key":"a","error":{"code":14,"message":"later"}}"#, |d| keyed(fuzzing::gemini_result_file(d))),
        (r#"{"custom_id":"a","response":{"status_code":429,"body":{}}}"#, fuzzing::mistral_result_file),
        (r#"{"recordId":"a","error":{"errorCode":500}}"#, fuzzing::bedrock_result_file),
        (r#"{"key":"a","status":"UNAVAILABLE"}"#, fuzzing::vertex_result_file),
    ];
    for (line, parse) in parsers {
        for cut in 1..line.len() {
            let file = format!("{line}\r\n\n{line}\n{}", &line[..cut]);
            let parsed = parse(file.as_bytes());
            assert_eq!(parsed.len(), 3, "blank lines are skipped: {file}");
            assert!(parsed[0].is_ok() && parsed[1].is_ok(), "{file}: {parsed:?}");
            assert!(parsed[2].is_err(), "a torn line is an error, not an answer: {file}");
        }
    }
}

/// A provider's `Retry-After` of any size or shape is a delay or nothing, never a panic.
#[test]
fn absurd_retry_after_values_are_ignored_or_capped_not_a_panic() {
    for value in ["1e20", "1e300", "18446744073709551616", "inf", "NaN", "-0", "1e-400", "9999999999999999999.5"] {
        for name in ["retry-after", "retry-after-ms"] {
            let _ = fuzzing::retry_after(name, value.as_bytes());
        }
    }
    assert_eq!(fuzzing::retry_after("retry-after", b"7"), Some(Duration::from_secs(7)));
    assert_eq!(fuzzing::retry_after("retry-after-ms", b"1500"), Some(Duration::from_millis(1500)));
    assert_eq!(fuzzing::retry_after("retry-after", b"Tue, 14 Nov 2023 22:14:50 GMT"), Some(Duration::from_secs(90)));
}
