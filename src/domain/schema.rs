//! The schema registry: which JSON Schemas outputs must satisfy, and which fields
//! identify a finding.
//!
//! A schema is named `name@version`. The identifying fields are JSON Pointers
//! (relative to one finding) listed under `x-commitpoint-identity`; the findings
//! array is found at `x-commitpoint-findings` (default `/findings`). Identity never
//! includes free prose, so a reworded summary is the same finding.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

mod view;

pub use view::{Dialect, Inexpressible, View};

pub const BUILTIN_CODE_REVIEW: &str = "code-review@1";
const IDENTITY_KEY: &str = "x-commitpoint-identity";
const FINDINGS_KEY: &str = "x-commitpoint-findings";
const INSTRUCTIONS_KEY: &str = "x-commitpoint-instructions";
const DEFAULT_FINDINGS_POINTER: &str = "/findings";
/// Enough errors to fix an output; an adversarial output must not produce a huge response.
const MAX_REPORTED_ISSUES: usize = 32;

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
        let validator = jsonschema::draft202012::new(document)
            .map_err(|e| invalid(format!("not a valid JSON Schema 2020-12 document: {e}")))?;
        let views = Dialect::ALL.into_iter().map(|d| (d, view::derive(document, d))).collect();
        Ok(Self {
            name: name.to_string(),
            origin: origin.to_path_buf(),
            document: document.clone(),
            views,
            validator,
            identity_pointers,
            findings_pointer,
        })
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
        INSTRUCTIONS_KEY: "You review a source file or diff. Report each problem as a finding: a short rule id, \
            a severity (low, medium, high, critical), the file (the source_id given), the 1-based line, and a \
            one-sentence summary. Answer with JSON only; an empty findings array when nothing is wrong."
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
}
