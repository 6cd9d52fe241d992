//! `commitpoint export`: a tenant's committed extractions from a running server, as the
//! server streams them (JSON lines) or as CSV with one row per finding. Written to
//! `FILE.partial` (mode 0600, never through a link planted there) and renamed once
//! complete, so FILE is never a torn export.
//!
//! CSV cells that a spreadsheet would run as a formula (OWASP "CSV injection": a first
//! character of `=`, `+`, `-`, `@`, TAB or CR) get a `'` in front, since the text comes
//! from sources and model answers, not from the operator; `--csv-raw` writes them as is.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};

use super::EXIT_PROBLEMS;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Format {
    /// One JSON object per committed extraction, exactly as `GET /v1/export` sends it.
    Jsonl,
    /// One row per finding, with a header row.
    Csv,
}

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    #[arg(long)]
    tenant: String,
    /// Only extractions of this schema (`name@version`).
    #[arg(long)]
    schema: Option<String>,
    /// Committed at or after (a date like 2026-11-01, or RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Committed before (exclusive).
    #[arg(long)]
    until: Option<String>,
    #[arg(long, value_enum, default_value = "jsonl")]
    format: Format,
    /// CSV only: write cells exactly as stored, without the `'` that keeps a spreadsheet
    /// from running a cell that starts like a formula.
    #[arg(long)]
    csv_raw: bool,
    /// The file to write (replaced only once the export is complete).
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    admin: super::AdminUrl,
}

/// The columns before a finding's own fields: where it comes from, then its key.
const FIXED_COLUMNS: [&str; 6] = ["extraction_id", "finding_key", "tenant", "source_id", "schema", "committed_at"];
/// Holds, as a JSON object, the fields of a finding that the header (taken from the first
/// finding) has no column for, and the output's own fields that have none (named
/// `output.<field>`).
const OTHER_COLUMN: &str = "other_fields";
/// The prefix of the columns of the output's fields beside its findings (`output_fields`).
const OUTPUT_PREFIX: &str = "output.";

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let base = args.admin.resolve();
    let mut query = vec![("tenant", args.tenant.as_str())];
    for (key, value) in [("schema", &args.schema), ("since", &args.since), ("until", &args.until)] {
        if let Some(v) = value {
            query.push((key, v));
        }
    }
    let response = args
        .admin
        .client()?
        .get(format!("{base}/v1/export"))
        .query(&query)
        .send()
        .await
        .with_context(|| format!("cannot reach the server at {base}"))?;
    let status = response.status();
    if !status.is_success() {
        let body: Value = response.json().await.unwrap_or(Value::Null);
        eprintln!("commitpoint: the server refused: {status}: {}", body["error"]["message"].as_str().unwrap_or("?"));
        return Ok(ExitCode::from(EXIT_PROBLEMS));
    }
    let partial = crate::domain::private_file::partial_path(&args.out);
    let file = crate::domain::private_file::replace(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let cells = if args.csv_raw { Cells::Raw } else { Cells::Escaped };
    let mut sink = Sink::new(BufWriter::new(file), args.format, cells);
    let written = copy(response, &mut sink, &bar).await;
    bar.finish_and_clear();
    let finished = written.and_then(|()| sink.finish(&partial));
    if let Err(e) = finished {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &args.out)
        .with_context(|| format!("cannot move the export to {}", args.out.display()))?;
    let dir = args.out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).context("cannot sync the export's directory")?;
    eprintln!("{}: {} extractions, {} findings", args.out.display(), sink.extractions, sink.findings);
    Ok(ExitCode::SUCCESS)
}

async fn copy(response: reqwest::Response, sink: &mut Sink, bar: &ProgressBar) -> anyhow::Result<()> {
    let mut body = response.bytes_stream();
    let mut line = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("the export broke off before its end (see the server log)")?;
        let mut rest = &chunk[..];
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            line.extend_from_slice(&rest[..end]);
            sink.line(&line)?;
            line.clear();
            rest = &rest[end + 1..];
        }
        line.extend_from_slice(rest);
        bar.set_message(format!("{} extractions, {} findings", sink.extractions, sink.findings));
    }
    if !line.is_empty() {
        bail!("the export ended inside a line: it was cut short");
    }
    Ok(())
}

/// Whether CSV cells that look like formulas are defused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cells {
    Escaped,
    Raw,
}

struct Sink {
    out: BufWriter<std::fs::File>,
    format: Format,
    cells: Cells,
    /// The finding fields that have a column, once the first finding fixed them.
    columns: Option<Vec<String>>,
    /// The output fields (beside the findings) that have a column, fixed with `columns`
    /// by the first extraction that has a finding.
    output_columns: Vec<String>,
    extractions: u64,
    findings: u64,
}

impl Sink {
    fn new(out: BufWriter<std::fs::File>, format: Format, cells: Cells) -> Self {
        Self { out, format, cells, columns: None, output_columns: Vec::new(), extractions: 0, findings: 0 }
    }

    fn line(&mut self, line: &[u8]) -> anyhow::Result<()> {
        let parsed: Value = serde_json::from_slice(line).context("the server sent a line that is not JSON")?;
        let findings = parsed["findings"].as_array().map_or(&[][..], Vec::as_slice);
        self.extractions += 1;
        self.findings += findings.len() as u64;
        if self.format == Format::Jsonl {
            self.out.write_all(line)?;
            self.out.write_all(b"\n")?;
            return Ok(());
        }
        let output = parsed["output_fields"].as_object().cloned().unwrap_or_default();
        for finding in findings {
            let Some(fields) = finding.as_object() else { continue };
            if self.columns.is_none() {
                let own = fields.keys().filter(|k| *k != "finding_key").cloned().collect::<Vec<_>>();
                self.output_columns = output.keys().cloned().collect();
                self.header(&own)?;
                self.columns = Some(own);
            }
            let columns = self.columns.as_deref().unwrap_or_default();
            let mut row: Vec<String> = FIXED_COLUMNS
                .iter()
                .map(|c| if *c == "finding_key" { cell(&finding[*c]) } else { cell(&parsed[*c]) })
                .collect();
            row.extend(columns.iter().map(|c| cell(&fields.get(c).cloned().unwrap_or(Value::Null))));
            row.extend(self.output_columns.iter().map(|c| cell(&output.get(c).cloned().unwrap_or(Value::Null))));
            let mut others: Map<String, Value> = fields
                .iter()
                .filter(|(k, _)| *k != "finding_key" && !columns.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (k, v) in output.iter().filter(|(k, _)| !self.output_columns.contains(*k)) {
                others.insert(format!("{OUTPUT_PREFIX}{k}"), v.clone());
            }
            row.push(if others.is_empty() { String::new() } else { Value::Object(others).to_string() });
            if self.cells == Cells::Escaped {
                row = row.into_iter().map(defuse).collect();
            }
            write_row(&mut self.out, &row)?;
        }
        Ok(())
    }

    fn header(&mut self, own: &[String]) -> anyhow::Result<()> {
        let mut names: Vec<String> = FIXED_COLUMNS.iter().map(|c| c.to_string()).collect();
        names.extend(own.iter().cloned());
        names.extend(self.output_columns.iter().map(|c| format!("{OUTPUT_PREFIX}{c}")));
        names.push(OTHER_COLUMN.to_string());
        if self.cells == Cells::Escaped {
            names = names.into_iter().map(defuse).collect();
        }
        write_row(&mut self.out, &names)
    }

    /// Writes the header of an export without findings, then makes the file durable.
    fn finish(&mut self, path: &Path) -> anyhow::Result<()> {
        if self.format == Format::Csv && self.columns.is_none() {
            self.header(&[])?;
        }
        self.out.flush().with_context(|| format!("cannot write {}", path.display()))?;
        self.out.get_ref().sync_all().with_context(|| format!("cannot sync {}", path.display()))
    }
}

/// Text as is, null as empty, anything else as its JSON.
fn cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// OWASP's advice for CSV injection: a cell a spreadsheet would read as a formula gets a
/// leading `'`, which spreadsheets show as text and do not evaluate. A negative number is
/// defused too (`-3` becomes `'-3`); the findings' numbers are line numbers, never negative.
fn defuse(cell: String) -> String {
    if cell.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{cell}") } else { cell }
}

/// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
fn write_row(out: &mut impl Write, fields: &[String]) -> anyhow::Result<()> {
    let row: Vec<String> = fields
        .iter()
        .map(|f| if f.contains([',', '"', '\n', '\r']) { format!("\"{}\"", f.replace('"', "\"\"")) } else { f.clone() })
        .collect();
    out.write_all(row.join(",").as_bytes())?;
    out.write_all(b"\r\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_with_separators_are_quoted() {
        let mut out = Vec::new();
        write_row(&mut out, &["a".into(), "b,c".into(), "say \"hi\"".into(), String::new()]).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "a,\"b,c\",\"say \"\"hi\"\"\",\r\n");
    }

    #[test]
    fn cells_that_start_like_formulas_get_a_quote() {
        for cell in ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx"] {
            assert_eq!(defuse(cell.to_string()), format!("'{cell}"));
        }
        for cell in ["", "a=1", "1", "'x", " =1"] {
            assert_eq!(defuse(cell.to_string()), cell);
        }
    }

    #[test]
    fn the_outputs_own_fields_get_columns_fixed_by_the_first_row() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("out.csv");
        let file = std::fs::File::create(&path).expect("create");
        let mut sink = Sink::new(BufWriter::new(file), Format::Csv, Cells::Escaped);
        let line = |id: &str, output: Value| {
            serde_json::json!({"extraction_id": id, "tenant": "acme", "source_id": "s", "schema": "triage@1",
                "committed_at": "2026-12-06T10:00:00Z", "output_fields": output,
                "findings": [{"finding_key": "k", "rule": "crash"}]})
            .to_string()
        };
        sink.line(line("e1", serde_json::json!({"language": "en"})).as_bytes()).expect("first line");
        sink.line(line("e2", serde_json::json!({"language": "de", "score": 3})).as_bytes()).expect("second line");
        sink.line(line("e3", Value::Null).as_bytes()).expect("a line whose raw result retention dropped");
        sink.finish(&path).expect("finish");
        let text = std::fs::read_to_string(&path).expect("read");
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(
            rows[0],
            "extraction_id,finding_key,tenant,source_id,schema,committed_at,rule,output.language,other_fields"
        );
        assert!(rows[1].starts_with("e1,k,") && rows[1].ends_with(",crash,en,"), "{text}");
        assert!(rows[2].ends_with(",crash,de,\"{\"\"output.score\"\":3}\""), "{text}");
        assert!(rows[3].ends_with(",crash,,"), "{text}");
    }
}
