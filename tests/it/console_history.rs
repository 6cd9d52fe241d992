//! The listings an operator reads back: extractions newest first (the console's order,
//! and `order=newest` in the API, cursors included) and the batch history with one
//! batch's page, against the embedded simulator's real batches.

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::StatusCode;

use crate::console::Browser;
use crate::util::{Server, id_of, temp_dir};

const ARGS: [&str; 6] = ["--provider", "simulator", "--batch-max-wait", "200ms", "--poll-interval", "100ms"];

/// Intakes `sources` and waits until every one is committed; their ids in intake order.
async fn committed(server: &Server, sources: &[&str]) -> Vec<String> {
    let api = server.api();
    let mut ids = Vec::new();
    for source in sources {
        ids.push(api.create("acme", source, &format!("fn {source}() {{ x.unwrap() }}")).await);
    }
    let wanted: BTreeSet<String> = ids.iter().cloned().collect();
    let records = crate::provider::settle_within(&api, &wanted, Duration::from_secs(30)).await;
    assert!(records.values().all(|r| r["state"] == "committed"), "{records:#?}");
    ids
}

/// Every id of a listing, a page of `limit` at a time, following `next`.
async fn walk(server: &Server, query: &str, limit: usize) -> Vec<String> {
    let api = server.api();
    let (mut ids, mut after) = (Vec::new(), String::new());
    loop {
        let reply = api.get(&format!("/v1/extractions?{query}&limit={limit}&after={after}")).await;
        assert_eq!(reply.status, 200, "{:#}", reply.body);
        ids.extend(reply.body["extractions"].as_array().expect("extractions").iter().map(id_of));
        match reply.body["next"].as_str() {
            Some(next) => after = next.to_string(),
            None => return ids,
        }
    }
}

/// The numbers in `attribute="…"` of `html`, in page order.
fn numbers_in(html: &str, attribute: &str) -> Vec<u64> {
    html.split(&format!("{attribute}=\"")).skip(1).filter_map(|rest| rest.split('"').next()?.parse().ok()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractions_list_newest_first_and_batches_have_a_history_with_their_members() {
    let dir = temp_dir();
    let server = Server::start_with(&dir.path().join("data"), &ARGS);
    // Two rounds, so that there are two batches, the second holding the newer work.
    let mut intake_order = committed(&server, &["first", "second"]).await;
    intake_order.extend(committed(&server, &["third", "fourth"]).await);
    let newest_first: Vec<String> = intake_order.iter().rev().cloned().collect();

    // The API: the default stays intake order; `order=newest` reverses it, and its
    // cursors keep going backwards a page at a time.
    assert_eq!(walk(&server, "tenant=acme", 100).await, intake_order);
    assert_eq!(walk(&server, "order=intake", 3).await, intake_order);
    assert_eq!(walk(&server, "order=newest", 1).await, newest_first, "one at a time");
    assert_eq!(walk(&server, "order=newest&tenant=acme&state=committed", 3).await, newest_first);
    let api = server.api();
    let first = api.get("/v1/extractions?order=newest&limit=2").await;
    let cursor = first.body["next"].as_str().expect("a next page").to_string();
    api.get(&format!("/v1/extractions?limit=2&after={cursor}")).await.assert_error(400, "invalid_cursor");
    let wrong = api.get("/v1/extractions?order=sideways").await;
    assert_eq!(wrong.status, 400, "{:#}", wrong.body);

    // The console lists extractions newest first.
    let browser = Browser::open_session(&server.url).await;
    let (status, html) = browser.page("/ui/extractions").await;
    assert_eq!(status, StatusCode::OK);
    let shown: Vec<usize> =
        intake_order.iter().map(|id| html.find(&format!("/ui/extractions/{id}")).expect("every id listed")).collect();
    assert!(shown.windows(2).all(|w| w[0] > w[1]), "newest first: positions {shown:?} for {intake_order:?}");

    // The history: every batch, newest first, closed ones included.
    let (status, html) = browser.page("/ui/batches").await;
    assert_eq!(status, StatusCode::OK, "{html}");
    let history = numbers_in(&html, "data-batch");
    assert!(history.len() >= 2, "both rounds' batches: {history:?}\n{html}");
    assert!(history.windows(2).all(|w| w[0] > w[1]), "newest first: {history:?}");
    assert!(html.contains("closed: "), "closed batches say how they ended");

    // The newest batch's page lists its members as they are now, linked; the older
    // batch holds the first round.
    let (status, page) = browser.page(&format!("/ui/batches/{}", history[0])).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    for id in &intake_order[2..] {
        assert!(page.contains(&format!("/ui/extractions/{id}")), "member {id} on the newest batch's page");
    }
    for id in &intake_order[..2] {
        assert!(!page.contains(&format!("/ui/extractions/{id}")), "{id} was in an earlier batch");
    }
    assert_eq!(page.matches("state-committed").count(), 2, "{page}");
    let (_, oldest) = browser.page(&format!("/ui/batches/{}", history[history.len() - 1])).await;
    assert!(oldest.contains(&format!("/ui/extractions/{}", intake_order[0])), "{oldest}");

    let (missing, _) = browser.page("/ui/batches/999999").await;
    assert_eq!(missing, StatusCode::NOT_FOUND);
    let (bad, _) = browser.page("/ui/batches/not-a-number").await;
    assert_eq!(bad, StatusCode::BAD_REQUEST);
    // Paging back: a page before the oldest batch is empty, not an error.
    let (status, empty) = browser.page(&format!("/ui/batches?before={}", history[history.len() - 1])).await;
    assert_eq!(status, StatusCode::OK);
    assert!(numbers_in(&empty, "data-batch").is_empty() && empty.contains("No batch yet."), "{empty}");
    crate::util::stop_and_verify(server);
}
