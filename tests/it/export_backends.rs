//! Export on PostgreSQL against redb (issue 18): the same stored rows give the same bytes.
//! A workload commits on a redb server; its committed rows (the store's own encodings, read
//! from the file as they are) are copied into a PostgreSQL store; both servers' exports
//! must then be byte for byte the same, for every filter, across PostgreSQL's page size.
//! Runs with `COMMITPOINT_TEST_STORE=postgres` (the redb half runs on redb all the same);
//! without it, it reports that it was skipped.

use std::collections::HashMap;
use std::path::Path;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use crate::support::postgres;
use crate::util::{Api, SCHEMA, Server, finding, output, serve_command, stop_and_verify, temp_dir};

/// More than one of PostgreSQL's export pages (256) for one tenant, and a small tenant.
const TENANTS: [(&str, usize); 2] = [("acme", 300), ("globex", 7)];

/// The redb file's tables this test copies (`store/tables.rs`), read as stored bytes.
const IDENTITY: TableDefinition<&[u8; 32], u64> = TableDefinition::new("identity");
const EXTRACTIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("extractions");
const CONTENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("contents");
const FINDINGS: TableDefinition<(u64, &[u8; 32]), &[u8]> = TableDefinition::new("findings");
const RESULTS: TableDefinition<u64, &[u8]> = TableDefinition::new("results");
const COMMIT_INDEX: TableDefinition<(&str, u64, u64), ()> = TableDefinition::new("commit_index");

/// One committed extraction as the redb file holds it.
struct Committed {
    id: Vec<u8>,
    seq: i64,
    tenant: String,
    at_ms: i64,
    record: Vec<u8>,
    content: Vec<u8>,
    result: Vec<u8>,
    findings: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Commits every `tenant`'s sources out of intake order (some in the same millisecond),
/// with 0–3 findings each, and fails every seventh (failed work is not exported).
async fn populate(api: &Api) {
    for (tenant, n) in TENANTS {
        let mut ids = Vec::new();
        for i in 0..n {
            ids.push(api.create(tenant, &format!("src/{i}.rs"), &crate::util::reviewed()).await);
        }
        let grants = api.claim("w", n as u32, 600).await;
        let tokens: HashMap<String, String> = grants
            .iter()
            .map(|g| (g["extraction_id"].as_str().expect("id").into(), g["lease_token"].as_str().expect("t").into()))
            .collect();
        for (i, id) in ids.iter().enumerate().rev() {
            let body = if i % 7 == 6 {
                serde_json::json!({"findings": "not a list"})
            } else {
                let findings: Vec<_> =
                    (0..i % 4).map(|k| finding(&format!("R{k}"), "a.rs", k as u32 + 1, "x")).collect();
                output(&findings)
            };
            let reply = api.post_result(id, &tokens[id], &body).await;
            assert_eq!(reply.status, if i % 7 == 6 { 422 } else { 200 }, "{:#}", reply.body);
        }
    }
}

/// The raw bytes of `GET /v1/export?{query}` (no access control configured).
async fn export_bytes(base: &str, query: &str) -> Vec<u8> {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(format!("{base}/v1/export?{query}"))
        .send()
        .await
        .expect("reach the server");
    assert_eq!(response.status().as_u16(), 200, "{query}");
    response.bytes().await.expect("the whole body").to_vec()
}

/// Every committed extraction in the redb file, with what hangs off it.
fn read_committed(file: &Path) -> Vec<Committed> {
    let db = redb::Database::open(file).expect("open the redb file");
    let txn = db.begin_read().expect("read");
    let mut ids = HashMap::new();
    for entry in txn.open_table(IDENTITY).expect("identity").iter().expect("iter") {
        let (id, seq) = entry.expect("row");
        ids.insert(seq.value(), id.value().to_vec());
    }
    let (extractions, contents) = (txn.open_table(EXTRACTIONS).expect("t"), txn.open_table(CONTENTS).expect("t"));
    let (findings, results) = (txn.open_table(FINDINGS).expect("t"), txn.open_table(RESULTS).expect("t"));
    let bytes = |v: Option<redb::AccessGuard<'_, &[u8]>>| v.expect("a stored row").value().to_vec();
    let mut out = Vec::new();
    for entry in txn.open_table(COMMIT_INDEX).expect("commit index").iter().expect("iter") {
        let key = entry.expect("row").0;
        let (tenant, at_ms, seq) = key.value();
        let mut found = Vec::new();
        for f in findings.range((seq, &[0u8; 32])..=(seq, &[0xffu8; 32])).expect("range") {
            let (key, value) = f.expect("row");
            found.push((key.value().1.to_vec(), value.value().to_vec()));
        }
        out.push(Committed {
            id: ids[&seq].clone(),
            seq: seq as i64,
            tenant: tenant.to_string(),
            at_ms: at_ms as i64,
            record: bytes(extractions.get(seq).expect("get")),
            content: bytes(contents.get(seq).expect("get")),
            result: bytes(results.get(seq).expect("get")),
            findings: found,
        });
    }
    out
}

/// Writes the rows into the PostgreSQL store of `data_dir` as they are: the same encoded
/// records, with the columns its queries select on.
/// `sources`: each extraction's source id by its hex id (the revisions' column, from the
/// redb export's lines).
async fn copy_into_postgres(rows: &[Committed], sources: &HashMap<String, String>, data_dir: &Path) {
    let url = postgres::cluster().url(&postgres::database_for(data_dir));
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    for row in rows {
        client
            .execute(
                "INSERT INTO extractions (id, seq, tenant, schema_name, state_code, committed_at_ms, updated_at_ms, \
                 format, record, content, source_id, schema_family) \
                 VALUES ($1, $2, $3, $4, 3, $5, $5, $6, $7, $8, $9, split_part($4, '@', 1))",
                &[
                    &row.id,
                    &row.seq,
                    &row.tenant,
                    &SCHEMA,
                    &row.at_ms,
                    &i16::from(row.record[0]),
                    &row.record,
                    &row.content,
                    &sources[&row.id.iter().map(|b| format!("{b:02x}")).collect::<String>()],
                ],
            )
            .await
            .expect("insert an extraction");
        client
            .execute(
                "INSERT INTO results (extraction_seq, format, record) VALUES ($1, $2, $3)",
                &[&row.seq, &i16::from(row.result[0]), &row.result],
            )
            .await
            .expect("insert a result");
        for (key, record) in &row.findings {
            client
                .execute(
                    "INSERT INTO findings (extraction_seq, key, format, record) VALUES ($1, $2, $3, $4)",
                    &[&row.seq, key, &i16::from(record[0]), record],
                )
                .await
                .expect("insert a finding");
        }
    }
    // As an intake would have: the sequence moves past the copied numbers (verify checks it).
    client
        .execute("SELECT setval('extraction_seq', (SELECT max(seq) FROM extractions))", &[])
        .await
        .expect("advance the extraction sequence");
}

#[ignore = "PostgreSQL only: COMMITPOINT_TEST_STORE=postgres, --include-ignored (.ci/run does both)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_exports_the_same_bytes_as_redb_for_the_same_rows() {
    postgres::require();
    let dir = temp_dir();
    let redb_dir = dir.path().join("redb");
    let redb = Server::spawn_as_is(serve_command(&redb_dir, &[]), &redb_dir);
    populate(&redb.api()).await;
    let all = String::from_utf8(export_bytes(&redb.url, "tenant=acme").await).expect("utf-8");
    let lines: Vec<&str> = all.lines().collect();
    assert_eq!(lines.len(), 300 - 300 / 7, "one line per committed extraction");
    let at = |i: usize| {
        let line: serde_json::Value = serde_json::from_str(lines[i]).expect("JSON");
        line["committed_at"].as_str().expect("time").to_string()
    };
    let queries = [
        "tenant=acme".to_string(),
        "tenant=globex".to_string(),
        format!("tenant=acme&schema={SCHEMA}"),
        format!("tenant=acme&since={}&until={}", at(20), at(250)),
        format!("tenant=acme&since={}", at(240)),
        "tenant=nobody".to_string(),
    ];
    let mut expected = Vec::new();
    for query in &queries {
        expected.push(export_bytes(&redb.url, query).await);
    }
    let (status, log) = redb.terminate();
    assert_eq!(status.code(), Some(0), "{log}");

    let rows = read_committed(&redb_dir.join(commitpoint::store::FILE_NAME));
    assert_eq!(rows.len(), lines.len() + 7 - 1, "both tenants' committed rows");
    assert!(rows.iter().any(|r| r.findings.len() > 1), "findings come along");
    let pg_dir = dir.path().join("pg");
    let pg = Server::start(&pg_dir);
    let sources: HashMap<String, String> = [&expected[0], &expected[1]]
        .iter()
        .flat_map(|bytes| std::str::from_utf8(bytes).expect("utf-8").lines())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON"))
        .map(|l| (l["extraction_id"].as_str().expect("id").into(), l["source_id"].as_str().expect("source").into()))
        .collect();
    copy_into_postgres(&rows, &sources, &pg_dir).await;
    for (query, bytes) in queries.iter().zip(&expected) {
        let got = export_bytes(&pg.url, query).await;
        assert!(
            got == *bytes,
            "{query}: PostgreSQL exported {} bytes, redb {}; first difference at byte {:?}",
            got.len(),
            bytes.len(),
            got.iter().zip(bytes.iter()).position(|(a, b)| a != b)
        );
    }
    assert!(expected[3].len() < expected[0].len() && !expected[3].is_empty(), "the window is a real subset");
    assert!(expected[5].is_empty());
    stop_and_verify(pg);
}
