//! The schema registry: which JSON Schemas outputs must satisfy, and which fields
//! identify a finding.
//!
//! A schema is named `name@version`. The identifying fields are JSON Pointers
//! (relative to one finding) listed under `x-commitpoint-identity`; the findings
//! array is found at `x-commitpoint-findings` (default `/findings`). Identity never
//! includes free prose, so a reworded summary is the same finding. `grounding.rs` checks
//! findings against the source they came from (`x-commitpoint-grounding`); every
//! `x-commitpoint-*` key is documented in docs/OPERATIONS.md ("Schema keys").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

mod fields;
pub mod grounding;
mod reach;
mod view;

pub use grounding::{Grounding, SourceText};
pub use view::{Dialect, Inexpressible, View};

pub const BUILTIN_CODE_REVIEW: &str = "code-review@1";
const IDENTITY_KEY: &str = "x-commitpoint-identity";
const FINDINGS_KEY: &str = "x-commitpoint-findings";
const INSTRUCTIONS_KEY: &str = "x-commitpoint-instructions";
const REASK_KEY: &str = "x-commitpoint-reask";
/// Every `x-commitpoint-*` key a schema may carry; any other is refused at start.
const KNOWN_KEYS: [&str; 6] =
    [IDENTITY_KEY, FINDINGS_KEY, INSTRUCTIONS_KEY, REASK_KEY, grounding::GROUNDING_KEY, grounding::FILE_MARKER_KEY];
/// Re-asks an invalid answer gets unless the schema says otherwise.
pub const DEFAULT_REASK_LIMIT: u32 = 1;
const DEFAULT_FINDINGS_POINTER: &str = "/findings";
/// Enough errors to fix an output; an adversarial output must not produce a huge response.
pub const MAX_REPORTED_ISSUES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown schema {0:?}: register it with --schema-dir (file `<name>@<version>.json`)")]
    Unknown(String),
    #[error("schema name {0:?} must look like `name@version` (name of [a-z0-9._-], version a positive integer)")]
    BadName(String),
    #[error("{path}: cannot read schema file")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{path}: schema {schema} cannot be sent to provider {provider} ({dialect}) {source}")]
    Inexpressible {
        path: PathBuf,
        schema: String,
        provider: String,
        dialect: &'static str,
        #[source]
        source: Box<Inexpressible>,
    },
}

/// One reason an output does not satisfy its schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ValidationIssue {
    /// JSON Pointer into the output.
    pub path: String,
    pub message: String,
}

/// A finding that passed validation, with the canonical JSON of its identifying fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedFinding {
    pub canonical_identity: String,
    pub body: Value,
}

pub struct Schema {
    name: String,
    /// Where the document came from, for error messages naming the file.
    origin: PathBuf,
    document: Value,
    /// Per provider dialect: the view sent, or why none can be.
    views: BTreeMap<Dialect, Result<View, Inexpressible>>,
    validator: jsonschema::Validator,
    identity_pointers: Vec<String>,
    findings_pointer: String,
    grounding: Option<Grounding>,
    reask_limit: u32,
}

/// What grounding made of an output's findings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroundingReport {
    /// One per broken rule, with the finding's path.
    pub issues: Vec<ValidationIssue>,
    /// Findings that broke at least one rule.
    pub ungrounded: usize,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema")
            .field("name", &self.name)
            .field("identity_pointers", &self.identity_pointers)
            .finish_non_exhaustive()
    }
}

impl Schema {
    /// Compiles a schema document; `origin` names it in error messages.
    pub fn compile(name: &str, document: &Value, origin: &Path) -> Result<Self, Error> {
        check_name(name)?;
        let invalid = |reason: String| Error::Invalid { path: origin.to_path_buf(), reason };
        if let Some(unknown) = document
            .as_object()
            .and_then(|o| o.keys().find(|k| k.starts_with("x-commitpoint-") && !KNOWN_KEYS.contains(&k.as_str())))
        {
            return Err(invalid(format!(
                "unknown key `{unknown}` (a schema may carry {}; see docs/OPERATIONS.md, \"Schema keys\")",
                KNOWN_KEYS.map(|k| format!("`{k}`")).join(", ")
            )));
        }
        let identity_pointers = parse_pointer_list(document.get(IDENTITY_KEY)).ok_or_else(|| {
            invalid(format!(
                "`{IDENTITY_KEY}` must be a non-empty array of JSON Pointers such as [\"/rule\", \"/file\"]"
            ))
        })?;
        let findings_pointer = match document.get(FINDINGS_KEY) {
            None => DEFAULT_FINDINGS_POINTER.to_string(),
            Some(Value::String(p)) if p.is_empty() || p.starts_with('/') => p.clone(),
            Some(_) => {
                return Err(invalid(format!("`{FINDINGS_KEY}` must be a JSON Pointer string")));
            }
        };
        let grounding =
            Grounding::parse(document.get(grounding::GROUNDING_KEY), document.get(grounding::FILE_MARKER_KEY))
                .map_err(&invalid)?;
        let reask_limit = match document.get(REASK_KEY) {
            None => DEFAULT_REASK_LIMIT,
            Some(v) => v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                invalid(format!(
                    "`{REASK_KEY}` must be an integer of 0 or more (re-asks per answer), such as 2; not {v}"
                ))
            })?,
        };
        let validator = jsonschema::draft202012::new(document)
            .map_err(|e| invalid(format!("not a valid JSON Schema 2020-12 document: {e}")))?;
        check_reach(document, &findings_pointer, &identity_pointers, grounding.as_ref()).map_err(&invalid)?;
        let views = Dialect::ALL.into_iter().map(|d| (d, view::derive(document, d))).collect();
        Ok(Self {
            name: name.to_string(),
            origin: origin.to_path_buf(),
            document: document.clone(),
            views,
            validator,
            identity_pointers,
            findings_pointer,
            grounding,
            reask_limit,
        })
    }

    /// How many times an invalid answer is asked again (`x-commitpoint-reask`, default 1).
    pub fn reask_limit(&self) -> u32 {
        self.reask_limit
    }

    /// The registered JSON Schema document, as a worker is shown it.
    pub fn document(&self) -> &Value {
        &self.document
    }

    /// The grounding rules, if the schema declares any: only then does judging an output
    /// need its source.
    pub fn grounding(&self) -> Option<&Grounding> {
        self.grounding.as_ref()
    }

    /// Checks every finding of `output` against the source it was extracted from
    /// (`x-commitpoint-grounding`). Nothing to report for a schema without rules or an
    /// output without a findings array (validation says so).
    pub fn ground(&self, output: &Value, source: SourceText<'_>) -> GroundingReport {
        let mut report = GroundingReport::default();
        let (Some(grounding), Some(Value::Array(items))) = (&self.grounding, output.pointer(&self.findings_pointer))
        else {
            return report;
        };
        let index = grounding.index(source);
        for (i, item) in items.iter().enumerate() {
            let path = format!("{}/{i}", self.findings_pointer);
            if !grounding.check(&index, item, &path, &mut report.issues) {
                report.ungrounded += 1;
            }
        }
        report.issues.truncate(MAX_REPORTED_ISSUES);
        report
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The JSON pointers of the fields that identify a finding (revisions of a source
    /// under two versions of a schema are comparable only where these are the same).
    pub fn identity_pointers(&self) -> &[String] {
        &self.identity_pointers
    }

    /// The schema as a provider of `dialect` is sent it, or why it cannot be (see
    /// `view`). The registered document stays the authority for validation.
    pub fn view(&self, dialect: Dialect) -> Result<&View, Error> {
        match self.views.get(&dialect) {
            Some(Ok(view)) => Ok(view),
            Some(Err(why)) => Err(self.inexpressible(dialect, dialect.as_str(), why.clone())),
            None => Err(Error::Invalid { path: self.origin.clone(), reason: "no view derived".to_string() }),
        }
    }

    /// The view's document. Adapters check [`Schema::view`] before building requests, and
    /// start-up refuses a schema a configured provider cannot take, so the registered
    /// document returned for an inexpressible view is never sent.
    pub fn provider_schema(&self, dialect: Dialect) -> &Value {
        match self.views.get(&dialect) {
            Some(Ok(view)) => &view.document,
            _ => &self.document,
        }
    }

    /// Reads a provider's answer as the registered schema means it: the `null`s strict
    /// mode forced in place of optional properties are removed.
    pub fn normalize_provider_answer(&self, answer: &mut Value) {
        view::strip_optional_nulls(&self.document, answer);
    }

    fn inexpressible(&self, dialect: Dialect, provider: &str, source: Inexpressible) -> Error {
        let source = Box::new(source);
        Error::Inexpressible {
            path: self.origin.clone(),
            schema: self.name.clone(),
            provider: provider.to_string(),
            dialect: dialect.as_str(),
            source,
        }
    }

    /// What the model is asked to do, from `x-commitpoint-instructions` or a default.
    pub fn instructions(&self) -> String {
        self.document.get(INSTRUCTIONS_KEY).and_then(Value::as_str).map_or_else(
            || {
                format!(
                    "Extract structured findings from the source below. Answer with JSON only, \
                     satisfying the JSON Schema `{}`. Report only what the source shows.",
                    self.name
                )
            },
            str::to_string,
        )
    }

    /// Validates a model output and extracts its findings with their identities.
    /// What `output` holds besides its findings array (`None`: not an object).
    pub fn output_fields(&self, output: &Value) -> Option<serde_json::Map<String, Value>> {
        fields::beside_findings(output, &self.findings_pointer)
    }

    pub fn validate(&self, output: &Value) -> Result<Vec<ValidatedFinding>, Vec<ValidationIssue>> {
        let issues: Vec<ValidationIssue> = self
            .validator
            .iter_errors(output)
            .take(MAX_REPORTED_ISSUES)
            .map(|e| ValidationIssue { path: e.instance_path().to_string(), message: e.to_string() })
            .collect();
        if !issues.is_empty() {
            return Err(issues);
        }
        let Some(Value::Array(items)) = output.pointer(&self.findings_pointer) else {
            return Err(vec![ValidationIssue {
                path: self.findings_pointer.clone(),
                message: "the output has no findings array at this pointer".to_string(),
            }]);
        };
        let mut findings = Vec::with_capacity(items.len());
        let mut issues = Vec::new();
        for (index, item) in items.iter().enumerate() {
            match self.finding_identity(item) {
                Ok(canonical_identity) => findings.push(ValidatedFinding { canonical_identity, body: item.clone() }),
                Err(pointer) => issues.push(ValidationIssue {
                    path: format!("{}/{index}{pointer}", self.findings_pointer),
                    message: "identifying field is missing".to_string(),
                }),
            }
        }
        if issues.is_empty() { Ok(findings) } else { Err(issues) }
    }

    /// Canonical JSON of the identifying fields, as an array in declared order.
    /// serde_json sorts object keys, and numbers are normalised, so the same value always
    /// has the same text: `10`, `10.0` and `1e1` are one line number.
    fn finding_identity(&self, finding: &Value) -> Result<String, String> {
        let mut values = Vec::with_capacity(self.identity_pointers.len());
        for pointer in &self.identity_pointers {
            match finding.pointer(pointer) {
                Some(v) => values.push(canonical(v)),
                None => return Err(pointer.clone()),
            }
        }
        Ok(Value::Array(values).to_string())
    }
}

/// Integral floats become integers (JSON Schema treats `10.0` as the integer 10); other
/// values are kept, recursively.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            let integral = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15);
            // Exact for |f| < 2^53, so the cast below loses nothing.
            #[allow(clippy::cast_possible_truncation)]
            integral.map_or_else(|| value.clone(), |f| Value::from(f as i64))
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), canonical(v))).collect()),
        other => other.clone(),
    }
}

/// Refuses pointers no accepted output can ever match: the findings array, and the
/// identifying and grounded fields of a finding.
fn check_reach(
    document: &Value,
    findings: &str,
    identity: &[String],
    grounding: Option<&Grounding>,
) -> Result<(), String> {
    let never = |key: &str, pointer: &str, why: String| {
        format!("`{key}` pointer {pointer:?} can never match an output this schema accepts: {why}")
    };
    let array = reach::resolve(document, document, findings).map_err(|why| never(FINDINGS_KEY, findings, why))?;
    let Some(array) = array else { return Ok(()) };
    let item = reach::items(document, array).map_err(|why| never(FINDINGS_KEY, findings, why))?;
    let Some(item) = item else { return Ok(()) };
    let relative = |why: String| format!("(in a finding) {why}");
    for pointer in identity {
        reach::resolve(document, item, pointer).map_err(|why| never(IDENTITY_KEY, pointer, relative(why)))?;
    }
    for (pointer, what) in grounding.into_iter().flat_map(Grounding::pointers) {
        reach::resolve(document, item, pointer).map_err(|why| {
            format!("{what} pointer {pointer:?} can never match an output this schema accepts: {}", relative(why))
        })?;
    }
    Ok(())
}

fn parse_pointer_list(value: Option<&Value>) -> Option<Vec<String>> {
    let items = value?.as_array()?;
    let pointers: Vec<String> =
        items.iter().filter_map(|v| v.as_str().filter(|p| p.starts_with('/')).map(str::to_string)).collect();
    (!pointers.is_empty() && pointers.len() == items.len()).then_some(pointers)
}

fn check_name(name: &str) -> Result<(), Error> {
    let bad = || Error::BadName(name.to_string());
    let (base, version) = name.split_once('@').ok_or_else(bad)?;
    let base_ok = !base.is_empty()
        && base.len() <= 128
        && base.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    let version_ok = version.parse::<u32>().is_ok_and(|v| v > 0) && !version.starts_with('0');
    if base_ok && version_ok { Ok(()) } else { Err(bad()) }
}

/// All schemas known to this process, immutable after start.
#[derive(Debug, Clone)]
pub struct Registry {
    schemas: Arc<BTreeMap<String, Arc<Schema>>>,
}

impl Registry {
    /// The built-in schemas plus every `name@version.json` in `dir`.
    pub fn load(dir: Option<&Path>) -> Result<Self, Error> {
        let mut schemas = BTreeMap::new();
        let builtin = Schema::compile(BUILTIN_CODE_REVIEW, &code_review_v1(), Path::new("<built-in code-review@1>"))?;
        schemas.insert(BUILTIN_CODE_REVIEW.to_string(), Arc::new(builtin));
        if let Some(dir) = dir {
            for schema in load_dir(dir)? {
                schemas.insert(schema.name.clone(), Arc::new(schema));
            }
        }
        Ok(Self { schemas: Arc::new(schemas) })
    }

    pub fn builtin() -> Self {
        // The built-in document is a constant; failing to compile it is a build defect
        // caught by the unit tests, so fall back to an empty registry rather than panic.
        Self::load(None).unwrap_or_else(|_| Self { schemas: Arc::new(BTreeMap::new()) })
    }

    pub fn get(&self, name: &str) -> Result<Arc<Schema>, Error> {
        self.schemas.get(name).cloned().ok_or_else(|| Error::Unknown(name.to_string()))
    }

    /// What a committed output (its raw JSON) says besides its findings, as an object;
    /// `None` when its schema is not loaded or the text is not a JSON object.
    pub fn output_fields(&self, schema: &str, output_json: &str) -> Option<Value> {
        let output: Value = serde_json::from_str(output_json).ok()?;
        self.get(schema).ok()?.output_fields(&output).map(Value::Object)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.schemas.keys().map(String::as_str)
    }

    /// Refuses the first schema a configured provider could not be sent, naming the file,
    /// the JSON Pointer and the keyword. `providers` are (name, dialect) pairs.
    pub fn check_providers(&self, providers: &[(String, Dialect)]) -> Result<(), Error> {
        for schema in self.schemas.values() {
            for (provider, dialect) in providers {
                if let Some(Err(why)) = schema.views.get(dialect) {
                    return Err(schema.inexpressible(*dialect, provider, why.clone()));
                }
            }
        }
        Ok(())
    }

    /// Per schema and provider, whether the schema is sent as registered or how it was
    /// adapted (what `config check` prints).
    pub fn describe_views(&self, providers: &[(String, Dialect)]) -> String {
        let mut text = String::new();
        for schema in self.schemas.values() {
            for (provider, dialect) in providers {
                let line = match schema.views.get(dialect) {
                    Some(Ok(view)) if view.adaptations.is_empty() => "used as is".to_string(),
                    Some(Ok(view)) => format!("adapted:\n#     {}", view.adaptations.join("\n#     ")),
                    Some(Err(why)) => format!("REFUSED: {why}"),
                    None => "no view".to_string(),
                };
                text.push_str(&format!("# schema {} -> {provider} ({}): {line}\n", schema.name, dialect.as_str()));
            }
        }
        text
    }
}

fn load_dir(dir: &Path) -> Result<Vec<Schema>, Error> {
    let read_err = |source| Error::Read { path: dir.to_path_buf(), source };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    paths.iter().map(|path| load_file(path)).collect()
}

/// A schema is a few KiB; anything near this is a mistake, not a schema.
const MAX_SCHEMA_FILE_BYTES: u64 = 1024 * 1024;

fn load_file(path: &Path) -> Result<Schema, Error> {
    let name = path.file_stem().and_then(|s| s.to_str()).ok_or_else(|| Error::BadName(path.display().to_string()))?;
    if name == BUILTIN_CODE_REVIEW {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            reason: format!("would replace the built-in {BUILTIN_CODE_REVIEW}; give it another name or version"),
        });
    }
    let text = read_bounded(path)?;
    let document: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Invalid { path: path.to_path_buf(), reason: format!("not valid JSON: {e}") })?;
    Schema::compile(name, &document, path)
}

/// Reads a schema file only if it is a regular file of sane size. The type is checked
/// before opening (following symlinks): opening a FIFO blocks until a writer appears,
/// and a device such as `/dev/zero` never ends. The read is bounded too, in case the
/// file grows or is swapped between the check and the read.
fn read_bounded(path: &Path) -> Result<String, Error> {
    use std::io::Read;
    let read_err = |source| Error::Read { path: path.to_path_buf(), source };
    let invalid = |reason: String| Error::Invalid { path: path.to_path_buf(), reason };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        return Err(invalid("not a regular file (a FIFO, device or directory?)".to_string()));
    }
    let too_big = || invalid(format!("larger than {MAX_SCHEMA_FILE_BYTES} bytes; is this really a schema?"));
    if meta.len() > MAX_SCHEMA_FILE_BYTES {
        return Err(too_big());
    }
    let file = std::fs::File::open(path).map_err(read_err)?;
    // The type is checked again on the open file: the path may have been swapped since.
    if !file.metadata().map_err(read_err)?.is_file() {
        return Err(invalid("not a regular file (a FIFO, device or directory?)".to_string()));
    }
    let mut text = String::new();
    file.take(MAX_SCHEMA_FILE_BYTES + 1).read_to_string(&mut text).map_err(read_err)?;
    if text.len() as u64 > MAX_SCHEMA_FILE_BYTES {
        return Err(too_big());
    }
    Ok(text)
}

fn code_review_v1() -> Value {
    serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "code-review@1",
        "type": "object",
        "required": ["findings"],
        "additionalProperties": false,
        "properties": {
            "findings": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["rule", "severity", "file", "line", "summary"],
                    "additionalProperties": false,
                    "properties": {
                        "rule": {"type": "string", "minLength": 1},
                        "severity": {"enum": ["low", "medium", "high", "critical"]},
                        "file": {"type": "string", "minLength": 1},
                        "line": {"type": "integer", "minimum": 1},
                        "summary": {"type": "string"}
                    }
                }
            }
        },
        IDENTITY_KEY: ["/rule", "/file", "/line"],
        grounding::GROUNDING_KEY: [
            {"pointer": "/file", "rule": "path"},
            {"pointer": "/line", "rule": "line", "file": "/file"}
        ],
        INSTRUCTIONS_KEY: "You review a source file or diff. Report each problem as a finding: a short rule id, \
            a severity (low, medium, high, critical), the file (the source_id given; for a diff, the changed file's \
            path as its +++ b/ header names it), the 1-based line (for a diff, a line of the new side inside one of \
            its hunks), and a one-sentence summary. Answer with JSON only; an empty findings array when nothing is \
            wrong."
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn finding(rule: &str, line: i64, summary: &str) -> Value {
        json!({"rule": rule, "severity": "high", "file": "src/a.rs", "line": line, "summary": summary})
    }

    #[test]
    fn builtin_accepts_valid_output_and_derives_identity() {
        let reg = Registry::builtin();
        let schema = reg.get(BUILTIN_CODE_REVIEW).unwrap();
        let found = schema.validate(&json!({"findings": [finding("R1", 3, "x")]})).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].canonical_identity, r#"["R1","src/a.rs",3]"#);
    }

    #[test]
    fn reworded_summary_keeps_the_identity() {
        let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
        let a = schema.validate(&json!({"findings": [finding("R1", 3, "one")]})).unwrap();
        let b = schema.validate(&json!({"findings": [finding("R1", 3, "two")]})).unwrap();
        assert_eq!(a[0].canonical_identity, b[0].canonical_identity);
    }

    #[test]
    fn builtin_rejects_bad_outputs_with_paths() {
        let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
        let bad_line = schema.validate(&json!({"findings": [finding("R1", 0, "x")]}));
        assert_eq!(bad_line.unwrap_err()[0].path, "/findings/0/line");
        let mut wrong_enum = finding("R1", 1, "x");
        wrong_enum["severity"] = json!("urgent");
        assert!(schema.validate(&json!({"findings": [wrong_enum]})).is_err());
        assert!(schema.validate(&json!({"items": []})).is_err());
        assert!(schema.validate(&json!("text")).is_err());
    }

    #[test]
    fn number_spellings_share_an_identity() {
        let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
        let ids: Vec<String> = ["10", "10.0", "1e1"]
            .iter()
            .map(|line| {
                let output: Value = serde_json::from_str(&format!(
                    r#"{{"findings":[{{"rule":"R","severity":"low","file":"f","line":{line},"summary":"s"}}]}}"#
                ))
                .unwrap();
                schema.validate(&output).unwrap()[0].canonical_identity.clone()
            })
            .collect();
        assert_eq!(ids, vec![r#"["R","f",10]"#; 3]);
        assert_eq!(canonical(&json!(2.5)), json!(2.5));
    }

    #[test]
    fn unknown_schema_is_an_error() {
        let err = Registry::builtin().get("nope@1").unwrap_err();
        assert!(matches!(err, Error::Unknown(_)));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("code-review@1").is_ok());
        assert!(check_name("a.b_c@12").is_ok());
        for bad in ["nover", "@1", "x@0", "x@01", "X@1", "x@1.0", "x y@1"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn directory_schemas_need_identity_pointers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("ticket@2.json"),
            json!({"type": "object", "x-commitpoint-identity": ["/category"]}).to_string(),
        )
        .unwrap();
        let reg = Registry::load(Some(dir.path())).unwrap();
        let schema = reg.get("ticket@2").unwrap();
        let found = schema.validate(&json!({"findings": [{"category": "billing", "text": "…"}]})).unwrap();
        assert_eq!(found[0].canonical_identity, r#"["billing"]"#);
        let missing = schema.validate(&json!({"findings": [{"text": "…"}]}));
        assert_eq!(missing.unwrap_err()[0].path, "/findings/0/category");

        std::fs::write(dir.path().join("bad@1.json"), json!({"type": "object"}).to_string()).unwrap();
        assert!(matches!(Registry::load(Some(dir.path())), Err(Error::Invalid { .. })));
    }

    fn refusal(document: Value) -> String {
        match Schema::compile("t@1", &document, Path::new("/schemas/t@1.json")) {
            Err(e @ Error::Invalid { .. }) => e.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// A finding schema that has exactly `rule`, `file`, `line` and `quote`.
    fn closed(extra: Value) -> Value {
        let mut document = json!({
            "type": "object", "additionalProperties": false, "required": ["findings"],
            "properties": {"findings": {"type": "array", "items": {
                "type": "object", "additionalProperties": false,
                "properties": {"rule": {"type": "string"}, "file": {"type": "string"},
                    "line": {"type": "integer"}, "quote": {"type": "string"}}
            }}},
            "x-commitpoint-identity": ["/rule"]
        });
        for (k, v) in extra.as_object().unwrap() {
            document[k] = v.clone();
        }
        document
    }

    #[test]
    fn unknown_keys_are_refused_naming_key_and_file() {
        let text = refusal(closed(json!({"x-commitpoint-foo": 1})));
        assert!(text.starts_with("/schemas/t@1.json: unknown key `x-commitpoint-foo`"), "{text}");
        assert!(text.contains("`x-commitpoint-grounding`"), "lists the known keys: {text}");
        // A misspelt known key is unknown too; other extension keys are not ours.
        assert!(refusal(closed(json!({"x-commitpoint-identities": ["/rule"]}))).contains("x-commitpoint-identities"));
        assert!(Schema::compile("t@1", &closed(json!({"x-other": 1})), Path::new("t")).is_ok());
    }

    #[test]
    fn pointers_that_can_never_match_are_refused() {
        let identity = refusal(closed(json!({"x-commitpoint-identity": ["/rule", "/path"]})));
        assert!(identity.contains("`x-commitpoint-identity` pointer \"/path\" can never match"), "{identity}");
        assert!(identity.contains("has no property \"path\""), "{identity}");
        let findings = refusal(closed(json!({"x-commitpoint-findings": "/results"})));
        assert!(findings.contains("`x-commitpoint-findings` pointer \"/results\" can never match"), "{findings}");
        let through_a_number = refusal(closed(json!({"x-commitpoint-identity": ["/line/n"]})));
        assert!(through_a_number.contains("/line cannot hold \"n\""), "{through_a_number}");
        let grounded = refusal(closed(json!({"x-commitpoint-grounding": [{"pointer": "/evidence", "rule": "quote"}]})));
        assert!(grounded.contains("rule `quote` pointer \"/evidence\" can never match"), "{grounded}");
        let file = refusal(closed(json!({"x-commitpoint-grounding": [
            {"pointer": "/line", "rule": "line", "file": "/path"}]})));
        assert!(file.contains("`file` pointer \"/path\""), "{file}");
        // Open schemas may hold anything: accepted.
        for open in [
            json!({"type": "object", "x-commitpoint-identity": ["/anything"]}),
            json!({"type": "object", "properties": {"findings": {"type": "array"}}, "x-commitpoint-identity": ["/x"],
                "x-commitpoint-grounding": [{"pointer": "/q", "rule": "quote"}]}),
        ] {
            assert!(Schema::compile("t@1", &open, Path::new("t")).is_ok(), "{open}");
        }
        assert!(Registry::builtin().get(BUILTIN_CODE_REVIEW).is_ok(), "the built-in's pointers all match");
    }

    #[test]
    fn reask_is_a_count_of_zero_or_more() {
        let compile = |extra: Value| Schema::compile("t@1", &closed(extra), Path::new("t"));
        assert_eq!(compile(json!({})).unwrap().reask_limit(), DEFAULT_REASK_LIMIT);
        assert_eq!(DEFAULT_REASK_LIMIT, 1);
        assert_eq!(compile(json!({"x-commitpoint-reask": 0})).unwrap().reask_limit(), 0);
        assert_eq!(compile(json!({"x-commitpoint-reask": 3})).unwrap().reask_limit(), 3);
        for bad in [json!("2"), json!(1.5), json!(-1), json!(null), json!(1e12)] {
            let text = refusal(closed(json!({"x-commitpoint-reask": bad})));
            assert!(text.contains("`x-commitpoint-reask` must be an integer of 0 or more"), "{text}");
        }
        assert_eq!(Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap().reask_limit(), 1);
    }

    #[test]
    fn grounding_declarations_are_refused_with_the_file() {
        let text = refusal(closed(json!({"x-commitpoint-grounding": [{"pointer": "/file", "rule": "exists"}]})));
        assert!(text.starts_with("/schemas/t@1.json: `x-commitpoint-grounding`[0]: `rule` must be one of"), "{text}");
        let marker = refusal(closed(json!({"x-commitpoint-file-marker": "^== (.+)$"})));
        assert!(marker.contains("declares none"), "{marker}");
    }

    #[test]
    fn builtin_findings_are_grounded_in_the_diff() {
        let schema = Registry::builtin().get(BUILTIN_CODE_REVIEW).unwrap();
        assert_eq!(schema.grounding().map(|g| g.rules().len()), Some(2));
        let diff = "diff --git a/src/a.rs b/src/a.rs\n--- a/src/a.rs\n+++ b/src/a.rs\n@@ -1,2 +1,3 @@\n fn a() {\n+    x.unwrap();\n }\n";
        let source = SourceText { id: "pr#7", text: diff };
        let grounded = json!({"findings": [finding("R1", 2, "x")]});
        assert_eq!(schema.ground(&grounded, source), GroundingReport::default());
        let mut elsewhere = finding("R2", 2, "y");
        elsewhere["file"] = json!("src/b.rs");
        let output = json!({"findings": [finding("R1", 2, "x"), elsewhere, finding("R3", 9, "z")]});
        let report = schema.ground(&output, source);
        assert_eq!(report.ungrounded, 2);
        let paths: Vec<&str> = report.issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(paths, ["/findings/1/file", "/findings/2/line"]);
        assert!(report.issues[0].message.contains("rule `path`"));
        assert!(report.issues[1].message.contains("rule `line`"));
        // A single file is named by its source id.
        let single = SourceText { id: "src/a.rs", text: "fn a() {\n    x.unwrap();\n}\n" };
        assert_eq!(schema.ground(&grounded, single).ungrounded, 0);
    }
}
