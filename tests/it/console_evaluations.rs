//! The console's evaluation pages on the real binary: a bake-off between two simulated
//! candidates (one cutting every third answer off), its list and side-by-side pages whose
//! numbers are the API's report, a promotion through the console's form (its counts and
//! routing rule shown after the redirect), a cancel, and the pages refused to a tenant.

use std::time::{Duration, Instant};

use commitpoint::simulator::{Faults, Simulator, SimulatorConfig};
use reqwest::header::LOCATION;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::console::{ACME, ADMIN, Browser};
use crate::util::{Server, call_as, temp_dir, write_secret};

const COMMITTED: usize = 6;
const PENDING: usize = 3;
const WAIT: Duration = Duration::from_secs(60);

async fn simulator(complete_after: Duration, faults: Faults) -> Simulator {
    let config =
        SimulatorConfig { api_key: Some("sk-eval".into()), complete_after, faults, ..SimulatorConfig::default() };
    Simulator::start("127.0.0.1:0".parse().expect("loopback address"), config).await.expect("start a simulator")
}

/// `budget`: output tokens an answer may take, so that the simulator's long answers are cut off.
fn provider(name: &str, sim: &Simulator, budget: Option<u32>) -> String {
    let budget = budget.map(|b| format!("max_completion_tokens = {b}\n")).unwrap_or_default();
    format!(
        "[providers.{name}]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"gpt-4o-mini\"\napi_key_env = \"EVAL_KEY\"\n{budget}\n\
         [[prices]]\nprovider = \"{name}\"\nmodel = \"gpt-4o-mini\"\ninput_per_mtok = 0.15\noutput_per_mtok = 0.60\n\n",
        sim.base_url()
    )
}

fn content(i: usize) -> String {
    format!("fn f{i}() -> u32 {{\n    let n = input{i}.parse::<u32>().unwrap();\n    // TODO handle {i}\n    n\n}}\n")
}

async fn admin(base: &str, method: Method, path: &str, body: Option<Value>) -> Value {
    let (status, reply) = call_as(&format!("{base}{path}"), Some(ADMIN), method.clone(), body).await;
    assert!((200..300).contains(&status), "{method} {path}: {status} {reply:#}");
    reply
}

async fn create(base: &str, i: usize) -> String {
    let body = json!({"tenant": "acme", "source_id": format!("src/f{i}.rs"), "schema": "code-review@1", "content": content(i)});
    admin(base, Method::POST, "/v1/extractions", Some(body)).await["extraction_id"].as_str().expect("id").to_string()
}

async fn wait_for(base: &str, what: &str, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, reply) = call_as(&format!("{base}{path}"), Some(ADMIN), Method::GET, None).await;
        if status == 200 && done(&reply) {
            return reply;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {reply:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn dollars(micros: u64) -> String {
    format!("${}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

fn count(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
}

/// Text as the page holds it.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A cell of the side-by-side table, as the page renders it.
fn cell(row: &str, candidate: &str, text: &str) -> String {
    format!("data-row=\"{row}\" data-candidate=\"{candidate}\">{text}<")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_compares_candidates_with_the_apis_numbers_and_promotes_one() {
    let prod = simulator(Duration::from_millis(100), Faults::default()).await;
    let good = simulator(Duration::from_millis(200), Faults::default()).await;
    let faulty =
        simulator(Duration::from_millis(200), Faults { truncate_every: 3, disagree_every: 4, ..Faults::default() })
            .await;
    // Answers only after the test is over: its evaluation stays running until cancelled.
    let slow = simulator(Duration::from_secs(600), Faults::default()).await;
    let dir = temp_dir();
    let (admin_file, tenants_file) = (dir.path().join("admin"), dir.path().join("tenants"));
    write_secret(&admin_file, &format!("{ADMIN}\n"));
    write_secret(&tenants_file, &format!("acme {ACME}\n"));
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[access]\nadmin_token_file = \"{}\"\ntenant_tokens_file = \"{}\"\n\n{}{}{}{}[routing]\ndefault = \"prod\"\n",
            admin_file.display(),
            tenants_file.display(),
            provider("prod", &prod, None),
            provider("good", &good, None),
            provider("faulty", &faulty, Some(1000)),
            provider("slow", &slow, None),
        ),
    )
    .expect("write config");
    let config = config.display().to_string();
    let args =
        ["--config", &config, "--batch-max-size", "100", "--batch-max-wait", "200ms", "--poll-interval", "100ms"];
    let server = Server::start_with_env(&dir.path().join("data"), &args, &[("EVAL_KEY", "sk-eval")]);
    let base = server.url.clone();

    // Committed by production, then some left pending behind a paused production provider.
    for i in 0..COMMITTED {
        create(&base, i).await;
    }
    wait_for(&base, "production commits", "/v1/stats", |s| s["extractions"]["committed"] == json!(COMMITTED)).await;
    admin(&base, Method::POST, "/v1/admin/providers/prod/pause", None).await;
    for i in COMMITTED..COMMITTED + PENDING {
        create(&base, i).await;
    }

    let mut browser = Browser::new(&base);
    browser.login(ADMIN).await;
    let (status, html) = browser.page("/ui/evaluations").await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains("id=\"no-evaluations\"") && html.contains("href=\"/ui/evaluations\""), "{html}");

    let body = json!({"name": "bake", "schema": "code-review@1",
        "select": {"sample": COMMITTED + PENDING, "state": "any", "seed": 1}, "candidates": ["good", "faulty"]});
    admin(&base, Method::POST, "/v1/evaluations", Some(body)).await;
    let status = wait_for(&base, "the evaluation", "/v1/evaluations/bake", |e| e["state"] == "done").await;
    let report = admin(&base, Method::GET, "/v1/evaluations/bake/report", None).await;
    let candidate = |name: &str| {
        report["candidates"].as_array().and_then(|c| c.iter().find(|c| c["candidate"] == name)).cloned().expect(name)
    };
    let (g, f) = (candidate("good"), candidate("faulty"));
    assert_eq!(count(&g["valid"]), (COMMITTED + PENDING) as u64, "{g:#}");
    assert!(count(&f["truncated"]) > 0 && count(&f["disagreements_total"]) > 0, "{f:#}");

    // The list: the evaluation, its state and each candidate's progress, as the API says.
    let (code, html) = browser.page("/ui/evaluations").await;
    assert_eq!(code, StatusCode::OK, "{html}");
    assert!(html.contains("<a href=\"/ui/evaluations/bake\">bake</a>"), "{html}");
    assert!(html.contains("<span class=\"badge ok\">done</span>"), "{html}");
    assert!(html.contains(&format!("<td>{}</td>", COMMITTED + PENDING)), "members: {html}");
    for c in status["candidates"].as_array().expect("candidates") {
        let name = c["name"].as_str().expect("name");
        let progress = format!(
            "<div data-candidate=\"{name}\"><strong>{name}</strong> <span class=\"finished\">{}</span> · <span class=\"waiting\">{}</span> · <span class=\"not-sent\">{}</span></div>",
            c["finished"], c["waiting"], c["not_sent"]
        );
        assert!(html.contains(&progress), "{progress} not in {html}");
    }
    let spent = count(&status["spent_micros"]);
    assert!(spent > 0 && html.contains(&format!("{} (no budget)", dollars(spent))), "{html}");

    // The side-by-side page: one column per candidate, the report's numbers.
    let (code, html) = browser.page("/ui/evaluations/bake").await;
    assert_eq!(code, StatusCode::OK, "{html}");
    assert!(html.contains("Agreement compared with <strong>production</strong>"), "{html}");
    for c in [&g, &f] {
        let name = c["candidate"].as_str().expect("name");
        let valid_rate = format!("{:.1}%", c["valid_rate"].as_f64().expect("rate") * 100.0);
        for (row, text) in [
            ("sent", c["sent"].to_string()),
            ("valid", format!("{} ({valid_rate})", c["valid"])),
            ("truncated", format!("{} ({:.1}%)", c["truncated"], c["truncated_rate"].as_f64().expect("rate") * 100.0)),
            ("compared", c["agreement"]["compared"].to_string()),
            ("tokens", format!("{} / {}", c["input_tokens"], c["output_tokens"])),
            ("cost", dollars(count(&c["cost_micros"]))),
            ("cost-per-valid", dollars(count(&c["cost_per_valid_micros"]))),
        ] {
            let shown = cell(row, name, &text);
            assert!(html.contains(&shown), "{shown} not in the page: {html}");
        }
        let precision = c["agreement"]["precision"].as_f64().expect("precision");
        assert!(html.contains(&cell("precision", name, &format!("{:.1}%", precision * 100.0))), "{html}");
        assert!(html.contains(&format!("name=\"candidate\" value=\"{name}\"")), "a promote form for {name}");
    }
    assert!(!html.contains("id=\"cancel\""), "a done evaluation has nothing to cancel");
    // The faulty candidate's disagreements, each linking to its extraction.
    let disagreements = f["disagreements"].as_array().expect("disagreements");
    assert!(!disagreements.is_empty(), "{f:#}");
    let heading = format!(
        "<h3>faulty: {} of {} compared answers differ</h3>",
        f["disagreements_total"], f["agreement"]["compared"]
    );
    assert!(html.contains(&heading), "{heading} not in {html}");
    for d in disagreements {
        let id = d["extraction_id"].as_str().expect("id");
        assert!(html.contains(&format!("href=\"/ui/extractions/{id}\">{}</a>", &id[..12])), "{id}: {html}");
        let source = format!("<td class=\"wrap\">{}</td>", d["source_id"].as_str().expect("source"));
        assert!(html.contains(&source), "{source}: {html}");
        for identity in d["only_candidate"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(d["only_reference"].as_array().into_iter().flatten())
        {
            let identity = escaped(identity.as_str().expect("identity"));
            assert!(html.contains(&identity), "{identity}: {html}");
        }
    }
    assert!(html.contains("<h3>good: 0 of "), "{html}");
    assert!(html.contains("href=\"/ui/evaluations/bake?against=good\""), "{html}");
    let against = admin(&base, Method::GET, "/v1/evaluations/bake/report?against=good", None).await;
    let (code, html) = browser.page("/ui/evaluations/bake?against=good").await;
    assert_eq!(code, StatusCode::OK, "{html}");
    assert!(html.contains("Agreement compared with <strong>good</strong>"), "{html}");
    assert!(html.contains(&cell("precision", "good", "100.0%")), "good agrees with itself: {html}");
    let faulty_against = &against["candidates"][1];
    assert_eq!(faulty_against["candidate"], "faulty");
    let shown = cell("compared", "faulty", &faulty_against["agreement"]["compared"].to_string());
    assert!(html.contains(&shown), "{shown}: {html}");

    // Promote through the form: refused without the session's CSRF token, then done once.
    let csrf = browser.csrf("/ui/evaluations/bake").await;
    let refused = browser.send(Method::POST, "/ui/evaluations/bake/promote", Some(&[("candidate", "good")])).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let promoted = browser
        .send(Method::POST, "/ui/evaluations/bake/promote", Some(&[("csrf", &csrf), ("candidate", "good")]))
        .await;
    assert_eq!(promoted.status(), StatusCode::SEE_OTHER);
    let location = promoted.headers()[LOCATION].to_str().expect("ascii").to_string();
    assert!(location.starts_with("/ui/evaluations/bake?promoted=good&"), "{location}");
    let (code, html) = browser.page(&location).await;
    assert_eq!(code, StatusCode::OK, "{html}");
    assert!(html.contains(&format!("id=\"promoted-committed\">{PENDING}<")), "{html}");
    assert!(html.contains(&format!("id=\"promoted-already\">{COMMITTED}<")), "{html}");
    let rule = "{ schema = &quot;code-review@1&quot;, provider = &quot;good&quot; }";
    assert!(html.contains(&format!("id=\"routing-rule\">{rule}<")), "{html}");
    assert!(html.contains("commitpoint eval promote bake good --apply"), "{html}");
    let stats = admin(&base, Method::GET, "/v1/stats", None).await;
    assert_eq!(stats["extractions"]["committed"], json!(COMMITTED + PENDING), "{stats:#}");
    // Again: nothing left to commit.
    let again = browser
        .send(Method::POST, "/ui/evaluations/bake/promote", Some(&[("csrf", &csrf), ("candidate", "good")]))
        .await;
    let location = again.headers()[LOCATION].to_str().expect("ascii").to_string();
    let (_, html) = browser.page(&location).await;
    assert!(html.contains("id=\"promoted-committed\">0<"), "{html}");
    assert!(html.contains(&format!("id=\"promoted-already\">{}<", COMMITTED + PENDING)), "{html}");
    let unknown = browser
        .send(Method::POST, "/ui/evaluations/bake/promote", Some(&[("csrf", &csrf), ("candidate", "nobody")]))
        .await;
    assert_eq!(unknown.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(browser.page("/ui/evaluations/nothing").await.0, StatusCode::NOT_FOUND);

    // A running evaluation offers Cancel; after it the page says so, as the API does.
    let body = json!({"name": "stuck", "schema": "code-review@1",
        "select": {"sample": 2, "state": "committed"}, "candidates": ["slow"]});
    admin(&base, Method::POST, "/v1/evaluations", Some(body)).await;
    let (_, html) = browser.page("/ui/evaluations/stuck").await;
    assert!(html.contains("<span class=\"badge warn\">running</span>") && html.contains("id=\"cancel\""), "{html}");
    let cancelled = browser.send(Method::POST, "/ui/evaluations/stuck/cancel", Some(&[("csrf", csrf.as_str())])).await;
    assert_eq!(cancelled.status(), StatusCode::SEE_OTHER);
    assert_eq!(cancelled.headers()[LOCATION], "/ui/evaluations/stuck");
    let (_, html) = browser.page("/ui/evaluations/stuck").await;
    assert!(html.contains("<span class=\"badge\">cancelled</span>") && !html.contains("id=\"cancel\""), "{html}");
    assert_eq!(admin(&base, Method::GET, "/v1/evaluations/stuck", None).await["state"], "cancelled");

    // Admin only, as the API.
    let mut acme = Browser::new(&base);
    acme.login(ACME).await;
    for path in ["/ui/evaluations", "/ui/evaluations/bake"] {
        assert_eq!(acme.page(path).await.0, StatusCode::FORBIDDEN, "{path}");
    }
    let (_, html) = acme.page("/ui/extractions").await;
    assert!(!html.contains("href=\"/ui/evaluations\""), "no Evaluations link for a tenant");
    let acme_csrf = acme.csrf("/ui/extractions").await;
    let refused = acme
        .send(Method::POST, "/ui/evaluations/bake/promote", Some(&[("csrf", &acme_csrf), ("candidate", "good")]))
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
}
