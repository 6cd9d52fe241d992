use std::time::Duration;

use proptest::prelude::*;

use super::*;

// The published Standard Webhooks test vector. The expected header was recomputed here,
// independently of this crate, with Python's standard library:
//   python3 -c 'import hmac,hashlib,base64; k=base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
//     print("v1,"+base64.b64encode(hmac.new(k,b"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{\"test\": 2432232314}",
//     hashlib.sha256).digest()).decode())'
const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const VECTOR_TS: u64 = 1614265330;
const VECTOR_BODY: &[u8] = br#"{"test": 2432232314}"#;
const VECTOR_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

// A second vector with a padded base64 secret (the key is b"commitpoint-test-key-0123456789"),
// computed the same way: key=base64.b64decode(secret[6:]), message b"evt_2Kq9.1700000000." + body.
const PADDED_SECRET: &str = "whsec_Y29tbWl0cG9pbnQtdGVzdC1rZXktMDEyMzQ1Njc4OQ==";
const PADDED_BODY: &[u8] = br#"{"job":"j-1","state":"done"}"#;
const PADDED_SIGNATURE: &str = "v1,xf4/psi7rWti8+ru+VopEXBzYDZoSRxSIMRyS/5a0FM=";

// GitHub's documented example, recomputed with
//   python3 -c 'import hmac,hashlib; print(hmac.new(b"It'"'"'s a Secret to Everybody", b"Hello, World!",
//     hashlib.sha256).hexdigest())'
const GITHUB_SECRET: &str = "It's a Secret to Everybody";
const GITHUB_BODY: &[u8] = b"Hello, World!";
const GITHUB_HEADER: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
const GITHUB_ID: &str = "72d3162e-cc78-11e3-81ab-4c9367dc0958";

fn standard(text: &str) -> WebhookSecret {
    WebhookSecret::standard(text).unwrap()
}

fn github(text: &str) -> WebhookSecret {
    WebhookSecret::github(text).unwrap()
}

fn headers<'h>(id: &'h str, timestamp: &'h str, signature: &'h str) -> StandardHeaders<'h> {
    StandardHeaders { id: Some(id), timestamp: Some(timestamp), signature: Some(signature) }
}

fn verify_vector(signature: &str, now: u64) -> Result<Delivery, SignatureError> {
    let ts = VECTOR_TS.to_string();
    verify_standard(&[standard(VECTOR_SECRET)], headers(VECTOR_ID, &ts, signature), VECTOR_BODY, now, DEFAULT_TOLERANCE)
}

#[test]
fn signs_the_known_answer_vectors() {
    assert_eq!(sign_standard(&standard(VECTOR_SECRET), VECTOR_ID, VECTOR_TS, VECTOR_BODY), VECTOR_SIGNATURE);
    assert_eq!(sign_standard(&standard(PADDED_SECRET), "evt_2Kq9", 1700000000, PADDED_BODY), PADDED_SIGNATURE);
    assert_eq!(sign_github(&github(GITHUB_SECRET), GITHUB_BODY), GITHUB_HEADER);
}

#[test]
fn verifies_the_known_answer_vector() {
    assert_eq!(verify_vector(VECTOR_SIGNATURE, VECTOR_TS).unwrap(), Delivery { id: VECTOR_ID.to_owned() });
    let unpadded = PADDED_SECRET.trim_end_matches('=');
    let found = verify_standard(
        &[standard(unpadded)],
        headers("evt_2Kq9", "1700000000", PADDED_SIGNATURE),
        PADDED_BODY,
        1700000000,
        DEFAULT_TOLERANCE,
    );
    assert_eq!(found.unwrap().id, "evt_2Kq9");
}

#[test]
fn round_trips_sign_then_verify() {
    let secret = standard("whsec_c2VjcmV0LWtleS1mb3ItdGhlLXJvdW5kLXRyaXA=");
    let body = b"{\"any\":\"payload\"}\n";
    let signature = sign_standard(&secret, "evt_1", 1_000_000, body);
    let found = verify_standard(&[secret], headers("evt_1", "1000000", &signature), body, 1_000_100, DEFAULT_TOLERANCE);
    assert_eq!(found.unwrap().id, "evt_1");
}

#[test]
fn rejects_a_tampered_body_id_or_timestamp() {
    let ts = VECTOR_TS.to_string();
    let secrets = [standard(VECTOR_SECRET)];
    let check = |id: &str, ts: &str, body: &[u8]| {
        verify_standard(&secrets, headers(id, ts, VECTOR_SIGNATURE), body, VECTOR_TS, DEFAULT_TOLERANCE)
    };
    assert_eq!(check(VECTOR_ID, &ts, br#"{"test": 2432232315}"#), Err(SignatureError::SignatureMismatch));
    assert_eq!(check("msg_other", &ts, VECTOR_BODY), Err(SignatureError::SignatureMismatch));
    assert_eq!(check(VECTOR_ID, "1614265331", VECTOR_BODY), Err(SignatureError::SignatureMismatch));
}

#[test]
fn rejects_the_wrong_secret_and_accepts_a_rotated_one() {
    let ts = VECTOR_TS.to_string();
    let wrong = standard(PADDED_SECRET);
    let verify = |secrets: &[WebhookSecret]| {
        verify_standard(secrets, headers(VECTOR_ID, &ts, VECTOR_SIGNATURE), VECTOR_BODY, VECTOR_TS, DEFAULT_TOLERANCE)
    };
    assert_eq!(verify(std::slice::from_ref(&wrong)), Err(SignatureError::SignatureMismatch));
    assert_eq!(verify(&[wrong, standard(VECTOR_SECRET)]).unwrap().id, VECTOR_ID);
    assert_eq!(verify(&[]), Err(SignatureError::SignatureMismatch));
}

#[test]
fn accepts_any_matching_v1_entry_and_skips_other_versions() {
    let other = sign_standard(&standard(PADDED_SECRET), VECTOR_ID, VECTOR_TS, VECTOR_BODY);
    let list = format!("v1a,c29tZS1lZDI1NTE5 {other}  v1,!!notbase64 v2,abc {VECTOR_SIGNATURE}");
    assert!(verify_vector(&list, VECTOR_TS).is_ok());
    let first_only = format!("{VECTOR_SIGNATURE} {other}");
    assert!(verify_vector(&first_only, VECTOR_TS).is_ok());
}

#[test]
fn rejects_lists_without_a_matching_v1_entry() {
    let as_v2 = VECTOR_SIGNATURE.replacen("v1,", "v2,", 1);
    assert_eq!(verify_vector(&as_v2, VECTOR_TS), Err(SignatureError::NoSupportedSignature));
    assert_eq!(verify_vector("v1a,abc v1x,def", VECTOR_TS), Err(SignatureError::NoSupportedSignature));
    assert_eq!(verify_vector("   ", VECTOR_TS), Err(SignatureError::NoSupportedSignature));
    // An empty or truncated signature must not match a prefix of the real one.
    assert_eq!(verify_vector("v1,", VECTOR_TS), Err(SignatureError::SignatureMismatch));
    assert_eq!(verify_vector("v1,g0hM9SsE+OTPJTGt", VECTOR_TS), Err(SignatureError::SignatureMismatch));
}

#[test]
fn enforces_the_timestamp_window_both_ways() {
    assert!(verify_vector(VECTOR_SIGNATURE, VECTOR_TS + 300).is_ok());
    assert!(verify_vector(VECTOR_SIGNATURE, VECTOR_TS - 300).is_ok());
    assert_eq!(
        verify_vector(VECTOR_SIGNATURE, VECTOR_TS + 301),
        Err(SignatureError::TimestampTooOld { age_secs: 301, tolerance_secs: 300 })
    );
    assert_eq!(
        verify_vector(VECTOR_SIGNATURE, VECTOR_TS - 301),
        Err(SignatureError::TimestampInFuture { ahead_secs: 301, tolerance_secs: 300 })
    );
    let ts = VECTOR_TS.to_string();
    let wide = verify_standard(
        &[standard(VECTOR_SECRET)],
        headers(VECTOR_ID, &ts, VECTOR_SIGNATURE),
        VECTOR_BODY,
        VECTOR_TS + 3600,
        Duration::from_secs(3600),
    );
    assert!(wide.is_ok());
}

#[test]
fn a_forged_stale_delivery_is_a_mismatch_not_a_stale_timestamp() {
    assert_eq!(verify_vector("v1,AAAA", VECTOR_TS + 10_000), Err(SignatureError::SignatureMismatch));
}

#[test]
fn rejects_malformed_timestamps_and_ids() {
    let secrets = [standard(VECTOR_SECRET)];
    let check = |id: &str, ts: &str| {
        verify_standard(&secrets, headers(id, ts, VECTOR_SIGNATURE), VECTOR_BODY, VECTOR_TS, DEFAULT_TOLERANCE)
    };
    let bad_ts = SignatureError::MalformedHeader { name: WEBHOOK_TIMESTAMP, expected: "integer Unix seconds" };
    for ts in ["", "abc", "+1614265330", "-5", "1614265330.5", " 1614265330", "99999999999999999999999"] {
        assert_eq!(check(VECTOR_ID, ts), Err(bad_ts.clone()), "timestamp {ts:?}");
    }
    for id in ["", "msg.1", &"x".repeat(MAX_DELIVERY_ID_LEN + 1)] {
        assert!(
            matches!(check(id, "1614265330"), Err(SignatureError::MalformedHeader { name: WEBHOOK_ID, .. })),
            "id {id:?}"
        );
    }
}

#[test]
fn reports_each_missing_header_by_name() {
    let ts = VECTOR_TS.to_string();
    let full = headers(VECTOR_ID, &ts, VECTOR_SIGNATURE);
    let secrets = [standard(VECTOR_SECRET)];
    let missing = |h: StandardHeaders<'_>| verify_standard(&secrets, h, VECTOR_BODY, VECTOR_TS, DEFAULT_TOLERANCE);
    assert_eq!(missing(StandardHeaders { id: None, ..full }), Err(SignatureError::MissingHeader { name: WEBHOOK_ID }));
    assert_eq!(
        missing(StandardHeaders { timestamp: None, ..full }),
        Err(SignatureError::MissingHeader { name: WEBHOOK_TIMESTAMP })
    );
    assert_eq!(
        missing(StandardHeaders { signature: None, ..full }),
        Err(SignatureError::MissingHeader { name: WEBHOOK_SIGNATURE })
    );
}

#[test]
fn parses_and_refuses_secrets() {
    assert_eq!(WebhookSecret::standard("").unwrap_err(), SecretError::Empty);
    assert_eq!(WebhookSecret::standard(" \n").unwrap_err(), SecretError::Empty);
    assert_eq!(WebhookSecret::standard("whsec_").unwrap_err(), SecretError::EmptyKey);
    assert_eq!(WebhookSecret::standard("whsec_!!!").unwrap_err(), SecretError::InvalidBase64);
    assert_eq!(WebhookSecret::standard("whsec_=").unwrap_err(), SecretError::InvalidBase64);
    assert_eq!(WebhookSecret::standard("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(), SecretError::MissingPrefix);
    assert_eq!(WebhookSecret::github("").unwrap_err(), SecretError::Empty);
    assert_eq!(WebhookSecret::github("\n").unwrap_err(), SecretError::Empty);
    // A file's trailing newline is not part of the key.
    let from_file = standard(&format!("{VECTOR_SECRET}\n"));
    assert_eq!(sign_standard(&from_file, VECTOR_ID, VECTOR_TS, VECTOR_BODY), VECTOR_SIGNATURE);
    assert_eq!(sign_github(&github(&format!("{GITHUB_SECRET}\n")), GITHUB_BODY), GITHUB_HEADER);
    assert!(Scheme::Standard.parse_secret(GITHUB_SECRET).is_err());
    assert_eq!(sign_github(&Scheme::Github.parse_secret(GITHUB_SECRET).unwrap(), GITHUB_BODY), GITHUB_HEADER);
}

#[test]
fn debug_output_never_shows_the_secret() {
    let printed = format!("{:?} {:?}", standard(VECTOR_SECRET), github(GITHUB_SECRET));
    assert_eq!(printed, "WebhookSecret(<redacted>) WebhookSecret(<redacted>)");
}

#[test]
fn verifies_github_deliveries() {
    let secrets = [github(GITHUB_SECRET)];
    let verify = |sig: Option<&str>, id: Option<&str>, body: &[u8]| verify_github(&secrets, sig, id, body);
    assert_eq!(verify(Some(GITHUB_HEADER), Some(GITHUB_ID), GITHUB_BODY).unwrap().id, GITHUB_ID);
    assert!(
        verify(Some(&GITHUB_HEADER.to_uppercase().replace("SHA256=", "sha256=")), Some(GITHUB_ID), GITHUB_BODY).is_ok()
    );
    assert_eq!(verify(Some(GITHUB_HEADER), Some(GITHUB_ID), b"Hello, World?"), Err(SignatureError::SignatureMismatch));
    let wrong = verify_github(&[github("another secret")], Some(GITHUB_HEADER), Some(GITHUB_ID), GITHUB_BODY);
    assert_eq!(wrong, Err(SignatureError::SignatureMismatch));
    let rotated =
        verify_github(&[github("old"), github(GITHUB_SECRET)], Some(GITHUB_HEADER), Some(GITHUB_ID), GITHUB_BODY);
    assert!(rotated.is_ok());

    let malformed =
        Err(SignatureError::MalformedHeader { name: GITHUB_SIGNATURE, expected: "sha256= followed by 64 hex digits" });
    let bare_hex = GITHUB_HEADER.trim_start_matches("sha256=");
    let odd = &GITHUB_HEADER[..GITHUB_HEADER.len() - 1];
    let short = &GITHUB_HEADER[..GITHUB_HEADER.len() - 2];
    let not_hex = GITHUB_HEADER.replacen('7', "g", 1);
    let sha1 = "sha1=0123456789abcdef0123456789abcdef01234567";
    for sig in [bare_hex, odd, short, &not_hex, sha1, "sha256=", "sha256=é1"] {
        assert_eq!(verify(Some(sig), Some(GITHUB_ID), GITHUB_BODY), malformed, "signature {sig:?}");
    }
    let missing = |name| Err(SignatureError::MissingHeader { name });
    assert_eq!(verify(None, Some(GITHUB_ID), GITHUB_BODY), missing(GITHUB_SIGNATURE));
    assert_eq!(verify(Some(GITHUB_HEADER), None, GITHUB_BODY), missing(GITHUB_DELIVERY));
    assert!(matches!(
        verify(Some(GITHUB_HEADER), Some(""), GITHUB_BODY),
        Err(SignatureError::MalformedHeader { name: GITHUB_DELIVERY, .. })
    ));
}

/// A lookup over raw header pairs, matching names case-insensitively as HTTP does.
fn lookup<'h>(pairs: &'h [(&'h str, String)]) -> impl Fn(&str) -> Option<&'h str> {
    move |name| pairs.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

#[test]
fn scheme_dispatches_with_case_insensitive_header_names() {
    let standard_pairs = [
        ("Webhook-Id", VECTOR_ID.to_owned()),
        ("WEBHOOK-TIMESTAMP", VECTOR_TS.to_string()),
        ("webhook-Signature", VECTOR_SIGNATURE.to_owned()),
    ];
    let secrets = [standard(VECTOR_SECRET)];
    let found = Scheme::Standard.verify(&secrets, &lookup(&standard_pairs), VECTOR_BODY, VECTOR_TS, DEFAULT_TOLERANCE);
    assert_eq!(found.unwrap().id, VECTOR_ID);
    let stale =
        Scheme::Standard.verify(&secrets, &lookup(&standard_pairs), VECTOR_BODY, VECTOR_TS + 900, DEFAULT_TOLERANCE);
    assert!(matches!(stale, Err(SignatureError::TimestampTooOld { .. })));

    let github_pairs = [("X-Hub-Signature-256", GITHUB_HEADER.to_owned()), ("X-GitHub-Delivery", GITHUB_ID.to_owned())];
    let found =
        Scheme::Github.verify(&[github(GITHUB_SECRET)], &lookup(&github_pairs), GITHUB_BODY, 0, DEFAULT_TOLERANCE);
    assert_eq!(found.unwrap().id, GITHUB_ID);
    let cross = Scheme::Github.verify(&secrets, &lookup(&standard_pairs), VECTOR_BODY, VECTOR_TS, DEFAULT_TOLERANCE);
    assert_eq!(cross, Err(SignatureError::MissingHeader { name: GITHUB_SIGNATURE }));
}

#[test]
fn scheme_reads_from_config_text() {
    assert_eq!(serde_json::from_str::<Scheme>("\"standard\"").unwrap(), Scheme::Standard);
    assert_eq!(serde_json::from_str::<Scheme>("\"github\"").unwrap(), Scheme::Github);
    assert!(serde_json::from_str::<Scheme>("\"stripe\"").is_err());
}

#[test]
fn error_messages_never_carry_the_secret_or_expected_signature() {
    let expected_tail = VECTOR_SIGNATURE.trim_start_matches("v1,");
    let errors = [
        verify_vector("v1,AAAA", VECTOR_TS).unwrap_err(),
        verify_vector(VECTOR_SIGNATURE, VECTOR_TS + 301).unwrap_err(),
        verify_github(&[github(GITHUB_SECRET)], Some("sha256=00"), Some(GITHUB_ID), GITHUB_BODY).unwrap_err(),
    ];
    for error in errors {
        let text = error.to_string();
        for secret_part in ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", expected_tail, GITHUB_SECRET, "757107ea"] {
            assert!(!text.contains(secret_part), "{text:?} leaks {secret_part:?}");
        }
    }
    assert_eq!(
        SignatureError::TimestampTooOld { age_secs: 301, tolerance_secs: 300 }.to_string(),
        "webhook-timestamp is 301s old, more than the 300s allowed (replay or clock skew)"
    );
    let refused = WebhookSecret::standard("whsec_!!secret-looking!!").unwrap_err().to_string();
    assert!(!refused.contains("secret-looking"), "{refused}");
}

proptest! {
    #[test]
    fn verify_never_panics_on_arbitrary_input(
        id in proptest::option::of(".{0,40}"),
        timestamp in proptest::option::of(prop_oneof![".{0,24}", "[0-9]{1,22}"]),
        signature in proptest::option::of(prop_oneof![".{0,120}", "(v1,[A-Za-z0-9+/=]{0,50} ?){0,4}"]),
        body in proptest::collection::vec(any::<u8>(), 0..256),
        now in any::<u64>(),
        tolerance in any::<u64>(),
    ) {
        let secrets = [standard(VECTOR_SECRET), github(GITHUB_SECRET)];
        let h = StandardHeaders { id: id.as_deref(), timestamp: timestamp.as_deref(), signature: signature.as_deref() };
        let _ = verify_standard(&secrets, h, &body, now, Duration::from_secs(tolerance));
        let _ = verify_github(&secrets, signature.as_deref(), id.as_deref(), &body);
    }

    #[test]
    fn every_signed_delivery_verifies_and_any_body_change_fails(
        id in "[A-Za-z0-9_-]{1,40}",
        timestamp in 0u64..=4_000_000_000,
        body in proptest::collection::vec(any::<u8>(), 0..256),
        flip in any::<prop::sample::Index>(),
    ) {
        let secret = standard(PADDED_SECRET);
        let signature = sign_standard(&secret, &id, timestamp, &body);
        let ts = timestamp.to_string();
        let secrets = [secret];
        let verify = |body: &[u8]| verify_standard(&secrets, headers(&id, &ts, &signature), body, timestamp, DEFAULT_TOLERANCE);
        prop_assert_eq!(verify(&body), Ok(Delivery { id: id.clone() }));
        let mut tampered = body;
        if tampered.is_empty() {
            tampered.push(0);
        } else {
            let i = flip.index(tampered.len());
            tampered[i] ^= 1;
        }
        prop_assert_eq!(verify(&tampered), Err(SignatureError::SignatureMismatch));
    }
}
