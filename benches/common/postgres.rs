//! A throw-away local PostgreSQL for side-by-side figures: its server binaries found on
//! the machine (Debian's `postgresql` package puts them under /usr/lib/postgresql/N/bin),
//! a fresh cluster in a temp dir, durable settings (fsync and synchronous_commit on, the
//! defaults), `pgbench` with a custom script as the load, and the bytes the postmaster and
//! all its children wrote to files. When the binaries are absent the caller prints
//! "skipped" with the reason; nothing here panics.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::Result;

const TOOLS: [&str; 5] = ["initdb", "pg_ctl", "postgres", "pgbench", "psql"];
/// Linux runs as root in CI and here; initdb and postgres refuse root.
const OS_USER: &str = "postgres";

/// The directory holding every tool in `TOOLS`: the newest /usr/lib/postgresql/N/bin,
/// else the directory of `pg_ctl` on PATH. `Err` is the reason to print after "skipped".
pub fn find_bin() -> Result<PathBuf, String> {
    let mut candidates: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .collect();
    candidates.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    let mut dirs: Vec<PathBuf> = candidates.into_iter().map(|(_, dir)| dir).collect();
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.into_iter().find(|dir| TOOLS.iter().all(|t| dir.join(t).is_file())).ok_or_else(|| {
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres, pgbench, psql) under /usr/lib/postgresql/*/bin \
         or on PATH; `apt-get install postgresql` adds them"
            .to_string()
    })
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").map(|v| v.split_whitespace().nth(1) == Some("0"))))
        .unwrap_or(false)
}

/// A running cluster; dropping it stops the server (fast shutdown) and removes its files.
#[derive(Debug)]
pub struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
    as_root: bool,
    running: bool,
}

impl Cluster {
    /// initdb + pg_ctl start in a fresh directory under `parent`.
    pub fn start(parent: &Path, shared_buffers: &str) -> Result<Self> {
        let bin = find_bin()?;
        let as_root = running_as_root();
        let dir = tempfile::Builder::new().prefix("postgres-").tempdir_in(parent)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut cluster = Self { bin, dir, port, as_root, running: false };
        if as_root {
            let status = Command::new("chown").arg(format!("{OS_USER}:")).arg(cluster.dir.path()).status()?;
            if !status.success() {
                return Err(format!("chown {OS_USER} {} failed ({status})", cluster.dir.path().display()).into());
            }
        }
        let data = cluster.data_dir();
        cluster.run_server_tool(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "-A".as_ref(),
                "trust".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--locale=C".as_ref(),
            ],
        )?;
        let socket_dir = cluster.dir.path().join("sock");
        cluster.run_server_tool("mkdir", &[socket_dir.as_os_str()])?;
        // Durable like commitpoint: fsync, synchronous_commit and full_page_writes keep
        // their defaults (on); only memory and the listener are set.
        let settings = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             shared_buffers = {shared_buffers}\nmax_connections = 200\nfsync = on\nsynchronous_commit = on\n\
             full_page_writes = on\nmax_wal_size = 4GB\n",
            socket_dir.display()
        );
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf)?;
        text.push_str(&settings);
        std::fs::write(&conf, text)?;
        let log = cluster.dir.path().join("server.log");
        cluster.run_server_tool(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-l".as_ref(),
                log.as_os_str(),
                "-w".as_ref(),
                "-t".as_ref(),
                "120".as_ref(),
                "start".as_ref(),
            ],
        )?;
        cluster.running = true;
        Ok(cluster)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A scratch directory for pgbench's scripts and logs (owned by the caller's user).
    pub fn scratch(&self) -> Result<tempfile::TempDir> {
        Ok(tempfile::Builder::new().prefix("pgbench-").tempdir()?)
    }

    /// Runs a server-side tool (`initdb`, `pg_ctl`, or a plain command) as the postgres OS
    /// user when we are root.
    fn run_server_tool(&self, tool: &str, args: &[&std::ffi::OsStr]) -> Result<()> {
        let program = if TOOLS.contains(&tool) { self.bin.join(tool) } else { PathBuf::from(tool) };
        let mut cmd = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", OS_USER, "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let output = cmd.args(args).current_dir(self.dir.path()).stdin(Stdio::null()).output()?;
        if !output.status.success() {
            return Err(format!(
                "{tool} failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout).trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            )
            .into());
        }
        Ok(())
    }

    /// The postmaster's pid, from postmaster.pid.
    pub fn postmaster_pid(&self) -> Result<u32> {
        let text = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))?;
        Ok(text.lines().next().unwrap_or_default().trim().parse()?)
    }

    /// `psql -c sql`, unaligned tuples only; its stdout.
    pub fn psql(&self, sql: &str) -> Result<String> {
        let output = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-d", "postgres"])
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()?;
        if !output.status.success() {
            return Err(
                format!("psql failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim()).into()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    /// Runs `pgbench -n -M prepared` with `script` for `secs` seconds and `clients`
    /// connections; `vars` are `-D name=value`. Per-transaction latencies come from its
    /// `--log` files; the write bytes cover the whole run, pgbench's backends included.
    pub fn pgbench(&self, script: &str, clients: usize, secs: u64, vars: &[(&str, String)]) -> Result<PgbenchRun> {
        let scratch = self.scratch()?;
        let script_path = scratch.path().join("script.sql");
        std::fs::write(&script_path, script)?;
        let threads = clients.clamp(1, 2);
        let mut cmd = Command::new(self.bin.join("pgbench"));
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-n", "-M", "prepared"])
            .args(["-c", &clients.to_string(), "-j", &threads.to_string(), "-T", &secs.to_string()])
            .arg("-f")
            .arg(&script_path)
            .arg("-l")
            .arg(format!("--log-prefix={}", scratch.path().join("tx").display()));
        for (name, value) in vars {
            cmd.arg("-D").arg(format!("{name}={value}"));
        }
        cmd.arg("postgres").current_dir(scratch.path()).stdin(Stdio::null());
        let sampler = IoSampler::start(self.postmaster_pid()?);
        let output = cmd.output()?;
        let write_bytes = sampler.finish();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            return Err(format!(
                "pgbench failed ({}): {}\n{}",
                output.status,
                stdout.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            )
            .into());
        }
        let field = |prefix: &str| -> Option<f64> {
            stdout.lines().find_map(|l| l.trim().strip_prefix(prefix)).and_then(|rest| {
                rest.trim().trim_start_matches('=').split_whitespace().next().and_then(|v| v.parse().ok())
            })
        };
        let tps = field("tps").ok_or_else(|| format!("no tps in pgbench's output:\n{stdout}"))?;
        let transactions = field("number of transactions actually processed:").unwrap_or(0.0) as u64;
        let failed = field("number of failed transactions:").unwrap_or(0.0) as u64;
        let mut latencies = Vec::new();
        for entry in std::fs::read_dir(scratch.path())?.flatten() {
            if entry.file_name().to_string_lossy().starts_with("tx.") {
                let text = std::fs::read_to_string(entry.path())?;
                // client_id transaction_no time script_no time_epoch time_us: time in µs.
                latencies.extend(text.lines().filter_map(|l| l.split_whitespace().nth(2)?.parse::<u32>().ok()));
            }
        }
        Ok(PgbenchRun { tps, transactions, failed, latencies_us: latencies, write_bytes, stdout })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running {
            let data = self.data_dir();
            let _ = self.run_server_tool(
                "pg_ctl",
                &["-D".as_ref(), data.as_os_str(), "-m".as_ref(), "fast".as_ref(), "-w".as_ref(), "stop".as_ref()],
            );
            self.running = false;
        }
    }
}

#[derive(Debug)]
pub struct PgbenchRun {
    /// pgbench's "tps" (without initial connection time).
    pub tps: f64,
    pub transactions: u64,
    pub failed: u64,
    pub latencies_us: Vec<u32>,
    /// Bytes the postmaster and its children wrote to files over the run (`wchar`).
    pub write_bytes: u64,
    pub stdout: String,
}

/// `write_bytes` of /proc/PID/io: what the process caused to be sent to the block layer.
pub fn write_bytes(pid: u32) -> Option<u64> {
    io_field(pid, "write_bytes:")
}

/// `wchar` of /proc/PID/io: bytes handed to write(2)-family calls, sockets included.
pub fn wchar(pid: u32) -> Option<u64> {
    io_field(pid, "wchar:")
}

fn io_field(pid: u32, name: &str) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok())
}

fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|stat| {
                // The field after the state letter, past the parenthesised command name.
                stat.rfind(')').and_then(|i| stat[i + 2..].split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// Bytes PostgreSQL has passed to write(2)/pwrite(2) so far (`wchar`): the postmaster's
/// counter, which includes every child it has reaped (Linux adds a reaped child's I/O to
/// its parent's), plus each live child's. PostgreSQL answers clients with send(2), which
/// `wchar` does not count, so this is file data: WAL, data pages, segment zero-fill.
/// (`write_bytes` is no use here: on this kernel it charges PostgreSQL ~20× its `wchar`,
/// apparently for dirtying pages of its shared memory.)
fn wchar_total(postmaster: u32) -> u64 {
    let children: u64 = children_of(postmaster).into_iter().filter_map(|pid| io_field(pid, "wchar:")).sum();
    io_field(postmaster, "wchar:").unwrap_or(0) + children
}

/// Counts what a cluster writes between `start` and `finish`; `finish` first waits (up
/// to 5 s) for the backends of closed connections to exit and be reaped.
#[derive(Debug)]
pub struct IoSampler {
    postmaster: u32,
    baseline: u64,
    children: usize,
}

impl IoSampler {
    pub fn start(postmaster: u32) -> Self {
        Self { postmaster, baseline: wchar_total(postmaster), children: children_of(postmaster).len() }
    }

    pub fn finish(self) -> u64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while children_of(self.postmaster).len() > self.children && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        wchar_total(self.postmaster).saturating_sub(self.baseline)
    }
}

/// The filler `rpad` repeats into each row's content, as commitpoint's benches do.
const FILLER: &str = "The change moves the retry loop out of the handler and into the queue consumer; ";

impl Cluster {
    /// An `extractions` table of the same shape as commitpoint's record: a 32-byte identity
    /// as primary key, tenant, source id, schema, content, state, lease, output,
    /// timestamps. `pending_index` adds the partial index a claim needs (`seq` where state
    /// is pending), and a `findings` table.
    pub fn create_extractions(&self, pending_index: bool) -> Result<()> {
        self.psql(
            "CREATE TABLE extractions (
                id bytea PRIMARY KEY CHECK (length(id) = 32),
                seq bigserial NOT NULL,
                tenant text NOT NULL,
                source_id text NOT NULL,
                schema text NOT NULL,
                content text NOT NULL,
                state smallint NOT NULL DEFAULT 0,
                attempt integer NOT NULL DEFAULT 0,
                lease bigint,
                lease_expires_at timestamptz,
                output jsonb,
                created_at timestamptz NOT NULL DEFAULT now(),
                updated_at timestamptz NOT NULL DEFAULT now())",
        )?;
        if pending_index {
            self.add_claim_tables()?;
        }
        Ok(())
    }

    /// What a claim needs beside `extractions`: the partial index of pending rows in
    /// intake order, and the `findings` table a completion writes.
    pub fn add_claim_tables(&self) -> Result<()> {
        self.psql("CREATE INDEX extractions_pending ON extractions (seq) WHERE state = 0")?;
        self.psql(
            "CREATE TABLE findings (
                extraction_id bytea NOT NULL REFERENCES extractions (id),
                ordinal integer NOT NULL,
                body jsonb NOT NULL,
                PRIMARY KEY (extraction_id, ordinal))",
        )?;
        Ok(())
    }

    /// Inserts `n` pending rows (identities `sha256('{prefix}/{i}')`, 100 tenants,
    /// `content_bytes` of content) in chunks, then CHECKPOINT and VACUUM ANALYZE so the
    /// measured run starts from a settled table.
    pub fn preload(&self, n: u64, prefix: &str, content_bytes: usize) -> Result<()> {
        const CHUNK: u64 = 100_000;
        let mut from = 1;
        while from <= n {
            let to = (from + CHUNK - 1).min(n);
            self.psql(&format!(
                "INSERT INTO extractions (id, tenant, source_id, schema, content)
                 SELECT sha256(convert_to('{prefix}/' || g, 'UTF8')), 't' || (g % 100), '{prefix}/' || g,
                        'code-review@1', rpad('{prefix}/' || g || '. ', {content_bytes}, '{FILLER}')
                 FROM generate_series({from}, {to}) g"
            ))?;
            from = to + 1;
        }
        self.psql("CHECKPOINT")?;
        self.psql("VACUUM ANALYZE extractions")?;
        Ok(())
    }

    /// Bytes the cluster writes for a CHECKPOINT now: the data pages a run dirtied, which
    /// PostgreSQL writes after the commit (commitpoint writes them in the commit).
    pub fn checkpoint_bytes(&self) -> Result<u64> {
        let sampler = IoSampler::start(self.postmaster_pid()?);
        self.psql("CHECKPOINT")?;
        Ok(sampler.finish())
    }
}

/// The claim: the River/Oban pattern, returning the ids (hex, into `:ids`) and the
/// content's size (the worker needs the content; it is read, not shipped).
pub const CLAIM: &str = r"\set tok random(1, 9000000000000000000)
WITH claimed AS (
  UPDATE extractions SET state = 1, lease = :tok, lease_expires_at = now() + interval '300 seconds',
         attempt = attempt + 1, updated_at = now()
  WHERE id IN (SELECT id FROM extractions WHERE state = 0 ORDER BY seq LIMIT 10 FOR UPDATE SKIP LOCKED)
  RETURNING id, content)
SELECT coalesce(array_agg(encode(id, 'hex')), '{}') AS ids, coalesce(sum(length(content)), 0) AS bytes FROM claimed
\gset
";

/// One item's completion, `{i}` = 1…10: the fenced completing UPDATE and 2 findings.
pub const COMPLETE: &str = r"BEGIN;
UPDATE extractions SET state = 2, output = :output::jsonb, lease = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = decode((:ids::text[])[{i}], 'hex') AND state = 1 AND lease = :tok;
INSERT INTO findings (extraction_id, ordinal, body)
SELECT decode((:ids::text[])[{i}], 'hex'), 0, :f0::jsonb WHERE (:ids::text[])[{i}] IS NOT NULL;
INSERT INTO findings (extraction_id, ordinal, body)
SELECT decode((:ids::text[])[{i}], 'hex'), 1, :f1::jsonb WHERE (:ids::text[])[{i}] IS NOT NULL;
COMMIT;
";

/// The pgbench script of a worker that claims `limit` rows and completes each in its own
/// transaction with 2 findings (`output`'s first two), and the variables it reads.
pub fn claim_and_complete(limit: usize, output: &serde_json::Value) -> (String, [(&'static str, String); 3]) {
    let mut script = CLAIM.to_string();
    for i in 1..=limit {
        script.push_str(&COMPLETE.replace("{i}", &i.to_string()));
    }
    let findings = output["findings"].as_array().cloned().unwrap_or_default();
    let vars = [
        ("output", output.to_string()),
        ("f0", findings.first().map(serde_json::Value::to_string).unwrap_or_default()),
        ("f1", findings.get(1).map(serde_json::Value::to_string).unwrap_or_default()),
    ];
    (script, vars)
}
