//! Issue 30, items 5 and 9, on the real binary. `commitpoint export` and `backup` used to
//! open their temporary file with a plain create, so a symlink planted at that name sent
//! the data wherever it pointed; the temporary name was `out.partial` for `out.jsonl`
//! (not the documented `FILE.partial`); and exports, backups and the redb file came out
//! 0644 under the default umask. And CSV cells that start like a formula (`=`, `+`, `-`,
//! `@`, TAB, CR) were written as is, for a spreadsheet to run.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::util::{Server, cli, finding, output, stderr, stop_and_verify, temp_dir};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

/// Plants a link to `victim` at every name a careless writer of `out` might use.
fn plant(out: &Path, victim: &Path) {
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    for name in [std::path::PathBuf::from(partial), out.with_extension("partial")] {
        std::os::unix::fs::symlink(victim, &name).expect("plant a symlink");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_backups_and_the_store_are_private_and_never_written_through_a_planted_link() {
    let dir = temp_dir();
    // A directory serve creates itself (the harness makes none).
    let data = dir.path().join("data/nested");
    let server = Server::start(&data);
    let api = server.api();
    let id = api.create("acme", "src/a.rs", "fn a() {}").await;
    let (claimed, token) = api.claim_one("w", 60).await;
    assert_eq!(claimed, id);
    api.post_result(&id, &token, &output(&[finding("R1", "src/a.rs", 1, "x")])).await;

    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep").expect("write the victim");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let out = dir.path().join("acme.jsonl");
    plant(&out, &victim);
    let run = cli(&["export", "--tenant", "acme", "--out", out.to_str().expect("utf-8"), "--admin", &server.url]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep", "the export went through the link");
    assert_eq!(std::fs::read_to_string(&out).expect("export").lines().count(), 1);
    assert_eq!(mode(&out), 0o600, "an export is owner-only");

    if !crate::support::postgres::enabled() {
        assert_eq!(mode(&data), 0o700, "the data directory serve creates");
        assert_eq!(mode(&data.join("commitpoint.redb")), 0o600, "the store file");
        let backup = dir.path().join("all.redb");
        plant(&backup, &victim);
        let run =
            cli(&["backup", "--out", backup.to_str().expect("utf-8"), "--admin", &server.url, "--keep-on-server"]);
        assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep", "the backup went through the link");
        assert_eq!(mode(&backup), 0o600, "a downloaded backup is owner-only");
        let backups = data.join("backups");
        assert_eq!(mode(&backups), 0o700, "the server's backup directory");
        for entry in std::fs::read_dir(&backups).expect("backups") {
            let path = entry.expect("entry").path();
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
    stop_and_verify(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_cells_that_start_like_formulas_are_defused_unless_raw_is_asked_for() {
    let dir = temp_dir();
    let server = Server::start(&dir.path().join("data"));
    let api = server.api();
    let id = api.create("acme", "=HYPERLINK(\"http://x.example\")", &crate::util::diff_adding(&["src/a.rs"], 3)).await;
    let (_, token) = api.claim_one("w", 60).await;
    let findings = [
        finding("+R1", "src/a.rs", 1, "@SUM(A1:A9)"),
        finding("-R2", "src/a.rs", 2, "\tcmd"),
        finding("R3", "src/a.rs", 3, "plain = fine"),
    ];
    let reply = api.post_result(&id, &token, &output(&findings)).await;
    assert_eq!(reply.status, 200, "{:#}", reply.body);

    let csv = |raw: bool| {
        let out = dir.path().join(if raw { "raw.csv" } else { "safe.csv" });
        let mut args = vec!["export", "--tenant", "acme", "--format", "csv", "--out", out.to_str().expect("utf-8")];
        args.extend(["--admin", &server.url]);
        if raw {
            args.push("--csv-raw");
        }
        let run = cli(&args);
        assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
        std::fs::read_to_string(&out).expect("the CSV")
    };
    let safe = csv(false);
    for cell in ["\"'=HYPERLINK(\"\"http://x.example\"\")\"", "'+R1", "'@SUM(A1:A9)", "'-R2", "'\tcmd"] {
        assert!(safe.contains(cell), "{cell:?} in\n{safe}");
    }
    assert!(safe.contains(",plain = fine,"), "{safe}");
    for line in safe.lines().skip(1) {
        for cell in line.split(',') {
            assert!(!cell.starts_with(['=', '+', '-', '@', '\t']), "{cell:?} in {line:?}");
        }
    }
    let raw = csv(true);
    assert!(raw.contains(",+R1,") && raw.contains(",@SUM(A1:A9)") && raw.contains("\"=HYPERLINK("), "{raw}");
    assert!(!raw.contains('\''), "{raw}");
    stop_and_verify(server);
}

/// Issue 43, item 6: `eval promote --apply` wrote `config.toml.partial` with a plain
/// create, so a link planted at that name sent the new configuration wherever it pointed,
/// and the rename then put the link itself in place of the configuration file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_promote_apply_never_writes_through_a_planted_link() {
    let dir = temp_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "# the operator's file\n[providers.sim]\nkind = \"simulator\"\n").expect("write config");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let config_name = config.to_str().expect("utf-8");
    let server = Server::start_with(&dir.path().join("data"), &["--config", config_name]);
    let api = server.api();
    let id = api.create("acme", "src/a.rs", "fn a() {}").await;
    let body = serde_json::json!({"name": "bake", "schema": crate::util::SCHEMA, "select": {"ids": [id]},
        "candidates": ["sim"]});
    let started = api.post("/v1/evaluations", &body).await;
    assert_eq!(started.status, 201, "{:#}", started.body);

    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep").expect("write the victim");
    plant(&config, &victim);
    let run = cli(&["eval", "promote", "bake", "sim", "--apply", "--config", config_name, "--admin", &server.url]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep", "the new config went through the link");
    let meta = std::fs::symlink_metadata(&config).expect("config");
    assert!(meta.file_type().is_file(), "the configuration is a file, not the planted link");
    assert_eq!(meta.permissions().mode() & 0o777, 0o640, "the file keeps its mode");
    let text = std::fs::read_to_string(&config).expect("config");
    assert!(text.starts_with("# the operator's file\n") && text.contains("provider = \"sim\""), "{text}");
    stop_and_verify(server);
}
