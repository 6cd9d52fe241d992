//! Operator mistakes that used to be accepted silently (or hung the server) are refused
//! with exit 78 by both `config check` and `serve`, naming the file (and the line), never
//! printing a token.

use std::path::Path;
use std::process::{Command, Output};

use crate::util::{cli, run_to_end, serve_command, stderr, temp_dir, write_secret};

const EXIT_CONFIG: i32 = 78;
const ADMIN: &str = "admin-token-0123456789";

/// `config check` and `serve` with this configuration file; both outputs.
fn check_and_serve(dir: &Path, config: &Path) -> [(&'static str, Output); 2] {
    let config = config.to_str().expect("utf-8 path");
    let check = cli(&["config", "check", "--config", config]);
    let serve = run_to_end(serve_command(&dir.join("data"), &["--config", config]));
    [("config check", check), ("serve", serve)]
}

fn assert_refused(outputs: &[(&str, Output)], needles: &[&str], secrets: &[&str]) {
    for (what, out) in outputs {
        let err = stderr(out);
        assert_eq!(out.status.code(), Some(EXIT_CONFIG), "{what}: {err}");
        for needle in needles {
            assert!(err.contains(needle), "{what} should say {needle:?}: {err}");
        }
        for secret in secrets {
            let printed = err.contains(secret) || String::from_utf8_lossy(&out.stdout).contains(secret);
            assert!(!printed, "{what} printed a token: {err}");
        }
    }
}

#[test]
fn token_file_mistakes_are_refused_with_the_line_named() {
    let dir = temp_dir();
    let admin = dir.path().join("admin");
    write_secret(&admin, &format!("{ADMIN}\n"));
    let tenants = dir.path().join("tenants");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[access]\nadmin_token_file = \"{}\"\ntenant_tokens_file = \"{}\"\n",
            admin.display(),
            tenants.display()
        ),
    )
    .expect("write config");
    let tenants_name = tenants.to_str().expect("utf-8 path");

    write_secret(&tenants, "acme acme-token-0123456789\nglobex globex-token-012345678\n");
    let out = cli(&["config", "check", "--config", config.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(0), "a good file passes: {}", stderr(&out));

    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "the admin token as a tenant's",
            &format!("acme acme-token-0123456789\n# ops\nglobex {ADMIN}\n"),
            &["line 3", "is the admin token"],
        ),
        (
            "one token for two tenants",
            "acme shared-token-0123456789\nglobex shared-token-0123456789\n",
            &["line 2", "already on line 1", "acme"],
        ),
        ("a tenant no extraction can carry", "acme/eu acme-token-0123456789\n", &["line 1", "can never match"]),
        ("a short token", "acme acme-token-0123456789\nglobex tok-globex\n", &["line 2", "shorter than 16"]),
    ];
    for (what, text, needles) in cases {
        write_secret(&tenants, text);
        let mut needles = needles.to_vec();
        needles.push(tenants_name);
        let outputs = check_and_serve(dir.path(), &config);
        assert_refused(&outputs, &needles, &[ADMIN, "shared-token-0123456789", "acme-token-0123456789", "tok-globex"]);
        eprintln!("refused: {what}");
    }

    write_secret(&tenants, "acme acme-token-0123456789\n");
    // A worker token file is checked against the other tokens, and by line too.
    let workers = dir.path().join("workers");
    let mut text = std::fs::read_to_string(&config).expect("read config");
    text.push_str(&format!("worker_tokens_file = \"{}\"\n", workers.display()));
    std::fs::write(&config, text).expect("write config");
    write_secret(&workers, "triage worker-token-0123456789 tenants=acme\n");
    let out = cli(&["config", "check", "--config", config.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(0), "a good worker file passes: {}", stderr(&out));
    let workers_name = workers.to_str().expect("utf-8 path");
    let cases: [(&str, &[&str]); 2] = [
        ("triage worker-token-0123456789\nbatch acme-token-0123456789\n", &["line 2", "tenant \"acme\""]),
        ("triage worker-token-0123456789 tenant=acme\n", &["line 1", "unknown field \"tenant\""]),
    ];
    for (text, needles) in cases {
        write_secret(&workers, text);
        let mut needles = needles.to_vec();
        needles.push(workers_name);
        let outputs = check_and_serve(dir.path(), &config);
        assert_refused(&outputs, &needles, &["worker-token-0123456789", "acme-token-0123456789"]);
    }
    write_secret(&workers, "triage worker-token-0123456789\n");

    write_secret(&admin, "short-admin\n");
    assert_refused(&check_and_serve(dir.path(), &config), &["shorter than 16", "admin"], &["short-admin"]);
}

/// A schema directory holding `file`, and a configuration that names it.
fn schema_config(dir: &Path) -> std::path::PathBuf {
    let schemas = dir.join("schemas");
    std::fs::create_dir_all(&schemas).expect("create the schema dir");
    let config = dir.join("config.toml");
    std::fs::write(&config, format!("[server]\nschema_dir = \"{}\"\n", schemas.display())).expect("write config");
    config
}

#[test]
fn a_fifo_in_the_schema_dir_is_refused_not_waited_on() {
    let dir = temp_dir();
    let config = schema_config(dir.path());
    let fifo = dir.path().join("schemas/pipe@1.json");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("run mkfifo");
    assert!(made.success());
    // Without the check both commands block on the open for ever (the harness kills them).
    assert_refused(&check_and_serve(dir.path(), &config), &[fifo.to_str().unwrap(), "not a regular file"], &[]);
}

#[test]
fn a_symlink_to_a_device_and_an_oversized_schema_are_refused() {
    let dir = temp_dir();
    let config = schema_config(dir.path());
    let link = dir.path().join("schemas/zero@1.json");
    std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
    assert_refused(&check_and_serve(dir.path(), &config), &[link.to_str().unwrap(), "not a regular file"], &[]);
    std::fs::remove_file(&link).expect("remove the link");

    // Valid JSON, padded past the limit with whitespace.
    let big = dir.path().join("schemas/big@1.json");
    let padding = " ".repeat(1024 * 1024);
    let text = format!(r#"{{"type": "object", "x-commitpoint-identity": ["/rule"]{padding}}}"#);
    std::fs::write(&big, text).expect("write a big schema");
    assert_refused(&check_and_serve(dir.path(), &config), &[big.to_str().unwrap(), "larger than"], &[]);
}

#[test]
fn a_schema_file_replacing_the_built_in_one_is_refused() {
    let dir = temp_dir();
    let config = schema_config(dir.path());
    let shadow = dir.path().join("schemas/code-review@1.json");
    std::fs::write(&shadow, r#"{"type": "object", "x-commitpoint-identity": ["/anything"]}"#).expect("write schema");
    assert_refused(&check_and_serve(dir.path(), &config), &[shadow.to_str().unwrap(), "built-in"], &[]);
}

/// Issue 30, item 8: `config check` (which `ctl reload` relies on) used to pass a store
/// password, sink secret or webhook secret that `serve` then refused at the next start.
/// Each secret is now read by the check exactly as by `serve`.
#[test]
fn every_secret_serve_reads_is_checked_by_config_check() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir();
    let readable = dir.path().join("readable-secret");
    std::fs::write(&readable, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").expect("write");
    std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let missing = dir.path().join("no-such-secret");
    let good = dir.path().join("good-secret");
    write_secret(&good, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n");
    let config = dir.path().join("config.toml");
    let sink = |file: &Path| {
        format!(
            "[[outbox.sinks]]\nname = \"down\"\nurl = \"http://127.0.0.1:9/hook\"\nsecret_file = \"{}\"\n",
            file.display()
        )
    };
    let webhook = |file: &Path| {
        format!(
            "[[webhooks]]\nname = \"gh\"\nscheme = \"standard\"\nsecret_file = \"{}\"\ntenant = \"acme\"\n\
             source_id_pointer = \"/id\"\ncontent_pointer = \"/body\"\nschema = \"code-review@1\"\n",
            file.display()
        )
    };
    let store = |file: &Path| {
        format!(
            "[store]\nbackend = \"postgres\"\nurl = \"postgres://cp@127.0.0.1:1/cp\"\npassword_file = \"{}\"\n",
            file.display()
        )
    };
    let cases: [(&str, String, &Path); 5] = [
        ("a world-readable store password", store(&readable), &readable),
        ("a missing store password", store(&missing), &missing),
        ("a world-readable sink secret", sink(&readable), &readable),
        ("a missing sink secret", sink(&missing), &missing),
        ("a world-readable webhook secret", webhook(&readable), &readable),
    ];
    for (what, text, file) in cases {
        std::fs::write(&config, &text).expect("write config");
        let outputs = check_and_serve(dir.path(), &config);
        assert_refused(&outputs, &[file.to_str().expect("utf-8 path")], &["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
        eprintln!("refused: {what}");
    }
    // The same tables with a good file pass the check.
    std::fs::write(&config, format!("{}{}", sink(&good), webhook(&good))).expect("write config");
    let out = cli(&["config", "check", "--config", config.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(0), "good secrets pass: {}", stderr(&out));
}

/// Settings `CreateModelInvocationJob` refuses on every create (service model constraints:
/// `timeoutDurationInHours` 24–168, `roleArn` with a 12-digit account, `S3Uri`'s pattern)
/// stop `config check` and `serve` with the rule, instead of failing every extraction.
#[test]
fn bedrock_settings_bedrock_would_refuse_are_refused_with_the_rule() {
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    let base = [
        ("region", "\"us-east-1\""),
        ("model", "\"anthropic.claude-3-5-haiku-20241022-v1:0\""),
        ("role_arn", "\"arn:aws:iam::123456789012:role/batch\""),
        ("input_s3_uri", "\"s3://cp-in/commitpoint/in/\""),
        ("output_s3_uri", "\"s3://cp-out/commitpoint/out/\""),
        ("timeout_hours", "48"),
    ];
    let write = |key: &str, value: &str| {
        let table: String = base
            .iter()
            .map(|(k, v)| if *k == key { format!("{k} = {value}\n") } else { format!("{k} = {v}\n") })
            .collect();
        std::fs::write(&config, format!("[providers.bedrock]\nkind = \"bedrock\"\n{table}")).expect("write config");
    };
    write("region", "\"us-east-1\"");
    let out = cli(&["config", "check", "--config", config.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(0), "a good table passes: {}", stderr(&out));
    let cases = [
        ("timeout_hours", "12", "24–168"),
        ("timeout_hours", "200", "24–168"),
        ("role_arn", "\"arn:aws:iam::12345:role/batch\"", "12-digit account"),
        ("role_arn", "\"arn:aws:iam:::role/batch\"", "12-digit account"),
        ("input_s3_uri", "\"s3://cp-in/commit point/\"", "S3 URI pattern"),
        ("output_s3_uri", "\"s3://cp-out/a=b/\"", "S3 URI pattern"),
    ];
    for (key, value, rule) in cases {
        write(key, value);
        assert_refused(&check_and_serve(dir.path(), &config), &[key, rule], &[]);
    }
}

#[test]
fn a_bad_otlp_endpoint_is_refused_naming_the_key() {
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    let cases = [
        ("\"127.0.0.1:4318\"", "is not a URL"),
        ("\"collector:4318\"", "http:// or https://"),
        ("\"http://otel:collector-token-0123456789@127.0.0.1:4318\"", "must not hold credentials"),
        ("\"not a url\"", "is not a URL"),
    ];
    for (value, rule) in cases {
        std::fs::write(&config, format!("[telemetry]\notlp_endpoint = {value}\n")).expect("write config");
        assert_refused(
            &check_and_serve(dir.path(), &config),
            &["telemetry.otlp_endpoint", rule],
            &["collector-token-0123456789"],
        );
    }
    // The standard variable is held to the same rule.
    let out = run_to_end({
        let mut cmd = serve_command(&dir.path().join("data"), &[]);
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318");
        cmd
    });
    assert_refused(&[("serve", out)], &["telemetry.otlp_endpoint"], &[]);
}

/// Issue 43, item 7: a budget or tenant table for a name no tenant can have (`café`,
/// `../x`) was accepted and never applied, and a second `[[prices]]` row for one model
/// silently replaced the first (a stray $0 row zeroed the model's cost). Both are refused,
/// naming the table or the rows.
#[test]
fn tables_for_impossible_tenants_and_duplicate_price_rows_are_refused() {
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    let price = |model: &str, input: &str| {
        format!(
            "[[prices]]\nprovider = \"sim\"\nmodel = \"{model}\"\ninput_per_mtok = {input}\noutput_per_mtok = 0.6\n"
        )
    };
    let good = format!(
        "[budgets.tenants]\nacme = 5.0\n\"acme.eu\" = 1.0\n[tenants.acme]\nweight = 2\n{}{}",
        price("gpt-4o-mini", "0.15"),
        price("gpt-4o", "2.5")
    );
    std::fs::write(&config, &good).expect("write config");
    let out = cli(&["config", "check", "--config", config.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(0), "a good file passes: {}", stderr(&out));
    let cases: [(String, &[&str]); 4] = [
        ("[budgets.tenants]\n\"café\" = 10.0\n".to_string(), &["budgets.tenants", "\"café\""]),
        ("[tenants.\"../x\"]\nweight = 2\n".to_string(), &["tenants", "\"../x\""]),
        ("[budgets.tenants]\n\"\" = 1.0\n".to_string(), &["budgets.tenants", "\"\""]),
        (
            format!("{}{}{}", price("gpt-4o-mini", "0.15"), price("gpt-4o", "2.5"), price("gpt-4o-mini", "0")),
            &["prices", "\"sim\"", "\"gpt-4o-mini\"", "rows 1 and 3"],
        ),
    ];
    for (text, needles) in cases {
        std::fs::write(&config, &text).expect("write config");
        assert_refused(&check_and_serve(dir.path(), &config), needles, &[]);
    }
}

/// Issue 43, item 8: a SIGHUP whose token file could not be read kept the old tokens (as
/// it should) but then logged "routing, budgets, prices and tokens apply now".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_keeps_the_old_tokens_does_not_say_they_apply() {
    let dir = temp_dir();
    let (admin, tenants) = (dir.path().join("admin"), dir.path().join("tenants"));
    write_secret(&admin, &format!("{ADMIN}\n"));
    write_secret(&tenants, "acme acme-token-0123456789\n");
    let config = dir.path().join("config.toml");
    let access = format!(
        "[access]\nadmin_token_file = \"{}\"\ntenant_tokens_file = \"{}\"\n",
        admin.display(),
        tenants.display()
    );
    std::fs::write(&config, &access).expect("write config");
    let server =
        crate::util::Server::start_with(&dir.path().join("data"), &["--config", config.to_str().expect("utf-8")]);
    let stats = format!("{}/v1/stats", server.url);
    let budgets = async || {
        let (status, body) = crate::util::call_as(&stats, Some(ADMIN), reqwest::Method::GET, None).await;
        assert_eq!(status, 200, "the admin token still works: {body}");
        body["budgets"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(budgets().await, 0);

    // The tenants' file goes away, and a budget comes in: the budget applies, the tokens stay.
    std::fs::remove_file(&tenants).expect("remove the tenants' tokens");
    std::fs::write(&config, format!("{access}[budgets.tenants]\nacme = 5.0\n")).expect("write config");
    let sent = Command::new("kill").args(["-HUP", &server.pid().to_string()]).status().expect("run kill -HUP");
    assert!(sent.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while budgets().await == 0 {
        assert!(std::time::Instant::now() < deadline, "the reload never applied the budget");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let acme = format!("{}/v1/extractions?tenant=acme", server.url);
    let (status, _) = crate::util::call_as(&acme, Some("acme-token-0123456789"), reqwest::Method::GET, None).await;
    assert_eq!(status, 200, "the tenant's old token is still in force");
    let (_, log) = server.terminate();
    let reloaded: Vec<&str> = log.lines().filter(|l| l.contains("configuration reloaded")).collect();
    assert_eq!(reloaded.len(), 1, "{log}");
    assert!(log.contains("tokens not reloaded"), "{log}");
    assert!(!reloaded[0].contains("tokens apply now"), "{}", reloaded[0]);
    assert!(reloaded[0].contains("the tokens in force were kept"), "{}", reloaded[0]);
}
