//! `COMMITPOINT_TEST_STORE=postgres`: the integration tests' servers use PostgreSQL
//! instead of redb. One PostgreSQL server is started for the test process (its own data
//! directory in a temp dir, on a free loopback port, trust auth: tests only) and each
//! commitpoint data directory gets its own database, so a test that restarts its server
//! over the same directory finds its data again.
//!
//! The server runs as the `postgres` OS user (initdb refuses root). A watcher process
//! stops it (`pg_ctl stop -m immediate`) and removes its files once the test process is
//! gone, however it ended.
//!
//! A test that must restart or crash the server itself (the multi-instance torture) starts
//! a dedicated one with [`Cluster::start`]: the same code path as the shared one, stopped
//! when dropped, so the other tests' server is never disturbed.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

pub const STORE_ENV: &str = "COMMITPOINT_TEST_STORE";

/// Whether the tests run against PostgreSQL.
pub fn enabled() -> bool {
    std::env::var(STORE_ENV).as_deref() == Ok("postgres")
}

/// For a test that means nothing on redb: such tests are `#[ignore]`d, so that the README's
/// command reports them as ignored rather than passed, and run with `--include-ignored` in
/// the PostgreSQL step. Run without the store set, one fails rather than pass by doing nothing.
pub fn require() {
    assert!(
        enabled(),
        "this test runs on PostgreSQL only: set {STORE_ENV}=postgres (the server binaries come from Debian's postgresql)"
    );
}

#[derive(Debug)]
pub struct Cluster {
    pub bin: PathBuf,
    pub data: PathBuf,
    pub port: u16,
    /// The temp dir holding the data directory, the socket dir and the server log.
    root: PathBuf,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// The test process's PostgreSQL server, started on first use.
pub fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(Cluster::start)
}

/// Dedicated clusters of this process get distinct directories.
static DEDICATED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The newest installed server's binaries (Debian: /usr/lib/postgresql/<major>/bin).
fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql)")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((major, bin))
        })
        .collect();
    found.sort();
    found.pop().expect("a PostgreSQL server under /usr/lib/postgresql/*/bin").1
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn as_postgres(bin: &Path, tool: &str) -> Command {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "postgres", "--"]).arg(bin.join(tool));
    cmd
}

impl Cluster {
    /// Starts a PostgreSQL server of its own (the shared one is [`cluster`]). It is stopped
    /// and removed when dropped, or by the watcher when the test process ends.
    pub fn start() -> Cluster {
        let n = DEDICATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        start_in(std::env::temp_dir().join(format!("commitpoint-pg-{}-{n}", std::process::id())))
    }
}

fn start_in(root: PathBuf) -> Cluster {
    let bin = bin_dir();
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("sock")).expect("create the PostgreSQL temp dir");
    run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&root), "chown the PostgreSQL temp dir");
    let data = root.join("data");
    run(
        as_postgres(&bin, "initdb").args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync", "-D"]).arg(&data),
        "initdb",
    );
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let options = format!(
        "-h 127.0.0.1 -p {port} -k {} -c max_connections=300 -c shared_buffers=32MB",
        root.join("sock").display()
    );
    run(
        as_postgres(&bin, "pg_ctl")
            .args(["-w", "-t", "60", "-D"])
            .arg(&data)
            .args(["-l"])
            .arg(root.join("log"))
            .args(["-o", &options, "start"])
            .stdout(Stdio::null()),
        "pg_ctl start",
    );
    // Stops the server and removes its files once this process is gone.
    let watcher = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         runuser -u postgres -- {pg_ctl} -D {data} stop -m immediate >/dev/null 2>&1; rm -rf {root}",
        pid = std::process::id(),
        pg_ctl = bin.join("pg_ctl").display(),
        data = data.display(),
        root = root.display(),
    );
    // `setsid -f` forks the watcher into its own session and returns at once.
    // Its output goes nowhere: a pipe it held would keep this call waiting.
    let started = Command::new("setsid")
        .args(["-f", "sh", "-c", &watcher])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("start the PostgreSQL watcher");
    assert!(started.success(), "the PostgreSQL watcher did not start: {started}");
    Cluster { bin, data, port, root }
}

impl Cluster {
    /// `pg_ctl restart -m immediate`: every session is cut without a checkpoint and the
    /// server recovers from its WAL, like a crash of the database host's server process.
    /// Waits until it accepts connections again.
    pub fn restart_immediate(&self) {
        run(
            as_postgres(&self.bin, "pg_ctl")
                .args(["-w", "-t", "60", "-m", "immediate", "-D"])
                .arg(&self.data)
                .args(["-l"])
                .arg(self.root.join("log"))
                .arg("restart")
                .stdout(Stdio::null()),
            "pg_ctl restart -m immediate",
        );
    }

    /// Creates `database` unless it exists.
    pub fn create_database(&self, name: &str) {
        let exists = self.psql("postgres", &format!("SELECT 1 FROM pg_database WHERE datname = '{name}'"));
        if exists.is_empty() {
            self.psql("postgres", &format!("CREATE DATABASE {name}"));
        }
    }

    /// Runs SQL as the superuser in `database`; the output is psql's unaligned rows.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", "postgres"])
            .args(["-p", &self.port.to_string(), "-d", database, "-c", sql])
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Starts `sql` in `database` in a psql of its own and returns at once: for a test that
    /// holds a lock while it watches the server.
    pub fn spawn_psql(&self, database: &str, sql: &str) -> std::process::Child {
        Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", "postgres"])
            .args(["-p", &self.port.to_string(), "-d", database, "-c", sql])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start psql")
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

/// The database a commitpoint data directory maps to, created on first use.
pub fn database_for(data_dir: &Path) -> String {
    let hash = blake3::hash(data_dir.as_os_str().as_encoded_bytes());
    let name = format!("t_{}", &hash.to_hex()[..20]);
    cluster().create_database(&name);
    name
}

/// The variable `serve` reads its PostgreSQL URL from.
pub const STORE_URL_ENV: &str = "COMMITPOINT_STORE_URL";

/// `serve` commands get the PostgreSQL store when the switch is on, unless the command
/// names a database itself (a test's dedicated cluster).
pub fn apply(cmd: &mut Command, data_dir: &Path) {
    let named = cmd.get_envs().any(|(name, value)| name == STORE_URL_ENV && value.is_some());
    if enabled() && !named {
        let database = database_for(data_dir);
        cmd.env(STORE_URL_ENV, cluster().url(&database));
    }
}

/// `commitpoint verify --store-url` on the database of `data_dir`, with no URL or config
/// file from the environment.
pub fn verify_command(data_dir: &Path) -> Command {
    cluster().verify_command(&database_for(data_dir))
}

impl Cluster {
    /// `commitpoint verify --store-url` on `database` of this server.
    pub fn verify_command(&self, database: &str) -> Command {
        let mut cmd = Command::new(super::process::BIN);
        cmd.arg("verify")
            .arg("--store-url")
            .arg(self.url(database))
            .env_remove("COMMITPOINT_STORE_URL")
            .env_remove("COMMITPOINT_CONFIG")
            .stdin(Stdio::null());
        cmd
    }

    /// Asserts `commitpoint verify` finds every invariant holding in `database`, and that
    /// its counts are the tables' own; returns its report.
    pub fn assert_verifies(&self, database: &str) -> String {
        let out = self.verify_command(database).output().expect("run commitpoint verify");
        let report = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(0),
            "verify failed\nstdout:\n{report}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(report.contains("ok: every invariant holds"), "{report}");
        self.assert_counts_match(database, &report);
        report
    }

    /// A cross-check of `verify`'s report by plain SQL: the counts it prints (read from
    /// the decoded records) are the tables' row counts, so a `verify` that skipped rows
    /// would be caught here.
    pub fn assert_counts_match(&self, database: &str, report: &str) {
        let count = |table: &str| self.psql(database, &format!("SELECT count(*) FROM {table}"));
        let lines = [
            ("extractions", "extractions"),
            ("findings", "findings"),
            ("raw results", "results"),
            ("ledger entries", "ledger"),
            ("outbox events", "outbox"),
        ];
        for (label, table) in lines {
            let line = format!("{label}: {}", count(table));
            assert!(report.lines().any(|l| l == line), "expected {line:?} (SQL count) in verify's report:\n{report}");
        }
    }
}

/// Every row of the store of `data_dir`, decoded, one line per row (`table`, TAB, …): the
/// PostgreSQL counterpart of `commitpoint debug-dump` on a redb file.
pub fn dump(data_dir: &Path) -> String {
    let options =
        commitpoint::store::postgres::PgOptions { url: cluster().url(&database_for(data_dir)), password: None };
    // Tests call this from inside their own runtime: the dump gets a thread and runtime of its own.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(commitpoint::store::postgres::dump_database(&options)).expect("dump the PostgreSQL store")
    })
    .join()
    .expect("the dump thread")
}

/// A dedicated cluster is stopped and removed with its owner (the shared one is a static,
/// never dropped; the watcher ends it).
impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin, "pg_ctl")
            .args(["-D"])
            .arg(&self.data)
            .args(["stop", "-m", "immediate"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
