//! Grounding rules: a finding must point at what the source really holds.
//!
//! A schema declares its rules under `x-commitpoint-grounding`, one object per rule, each
//! with a JSON Pointer relative to one finding:
//!
//! * `{"pointer": "/evidence", "rule": "quote"}`: the string appears in the source, whitespace
//!   runs compared as one space (for a diff also on either side with the `+`/`-`/` ` prefixes
//!   taken off, so a quote may span lines);
//! * `{"pointer": "/file", "rule": "path"}`: the value names a file of the source: for a diff
//!   the files its `diff --git` / `--- a/…` / `+++ b/…` headers name (a deleted file by its old
//!   path, a renamed one by its new path), for a source with a file marker
//!   (`x-commitpoint-file-marker`, a regex whose first group is the name, matched against each
//!   line) the files it marks, and otherwise the one file named by the extraction's `source_id`;
//! * `{"pointer": "/line", "rule": "line", "file": "/file"}`: a 1-based line that exists in the
//!   file the finding names at `file` (for a diff: inside one of that file's hunks' new-side
//!   ranges); without `file`, a line of the whole text.
//!
//! A finding without the rule's field is not checked (the schema's `required` says whether it
//! must be there). Everything here is pure: a source is indexed once per answer
//! ([`Grounding::index`]) and every finding is checked against that index.

use std::collections::BTreeMap;

use serde_json::Value;

use super::ValidationIssue;

pub const GROUNDING_KEY: &str = "x-commitpoint-grounding";
pub const FILE_MARKER_KEY: &str = "x-commitpoint-file-marker";
/// A file marker is a line pattern: anything larger is a mistake (and compiles slowly).
const MAX_MARKER_REGEX_BYTES: usize = 64 * 1024;
/// Files a refusal lists, so a re-ask can name the right one without a huge message.
const MAX_LISTED: usize = 10;
/// Characters of an absent quote a refusal repeats.
const MAX_QUOTED_CHARS: usize = 80;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    Quote,
    Path,
    Line,
}

impl RuleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::Quote => "quote",
            RuleKind::Path => "path",
            RuleKind::Line => "line",
        }
    }
}

/// One declared rule: the finding's field it checks and, for `line`, where its file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub pointer: String,
    pub kind: RuleKind,
    pub file: Option<String>,
}

/// A schema's grounding rules and its file marker.
#[derive(Debug, Clone)]
pub struct Grounding {
    rules: Vec<Rule>,
    file_marker: Option<regex::Regex>,
}

/// The text a finding must be grounded in, with the `source_id` it was submitted under.
#[derive(Debug, Clone, Copy)]
pub struct SourceText<'a> {
    pub id: &'a str,
    pub text: &'a str,
}

impl Grounding {
    /// Reads `x-commitpoint-grounding` and `x-commitpoint-file-marker`; `None` without rules.
    /// The error says what is wrong, for the caller to put the file's name before it.
    pub fn parse(rules: Option<&Value>, marker: Option<&Value>) -> Result<Option<Self>, String> {
        let rules = match rules {
            None => Vec::new(),
            Some(Value::Array(items)) => {
                items.iter().enumerate().map(|(i, r)| parse_rule(i, r)).collect::<Result<_, _>>()?
            }
            Some(_) => return Err(format!("`{GROUNDING_KEY}` must be an array of rules such as {EXAMPLE}")),
        };
        let file_marker = marker.map(parse_marker).transpose()?;
        if rules.is_empty() {
            return match file_marker {
                Some(_) => Err(format!(
                    "`{FILE_MARKER_KEY}` is read only by `{GROUNDING_KEY}` rules, and the schema declares none"
                )),
                None => Ok(None),
            };
        }
        Ok(Some(Self { rules, file_marker }))
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Every pointer the rules read, relative to a finding, with what names it.
    pub fn pointers(&self) -> impl Iterator<Item = (&str, String)> {
        self.rules.iter().flat_map(|r| {
            let own = (r.pointer.as_str(), format!("`{GROUNDING_KEY}` rule `{}`", r.kind.as_str()));
            let file = r.file.as_deref().map(|f| (f, format!("`{GROUNDING_KEY}` rule `line`'s `file`")));
            std::iter::once(own).chain(file)
        })
    }

    /// Reads the source once: its files and, for a diff, each file's hunks.
    pub fn index<'a>(&self, source: SourceText<'a>) -> SourceIndex<'a> {
        SourceIndex::build(source, self.file_marker.as_ref())
    }

    /// Checks one finding (at `path` in the output); each broken rule adds an issue. Returns
    /// whether the finding is grounded.
    pub fn check(
        &self,
        index: &SourceIndex<'_>,
        finding: &Value,
        path: &str,
        issues: &mut Vec<ValidationIssue>,
    ) -> bool {
        let before = issues.len();
        for rule in &self.rules {
            let Some(value) = finding.pointer(&rule.pointer) else { continue };
            let problem = match rule.kind {
                RuleKind::Quote => index.check_quote(value),
                RuleKind::Path => index.check_path(value),
                RuleKind::Line => match &rule.file {
                    None => index.check_whole_line(value),
                    Some(file_pointer) => match finding.pointer(file_pointer).and_then(Value::as_str) {
                        None => Some(format!("no file at `{file_pointer}` to find the line in")),
                        // A path rule on the same field has said so already.
                        Some(file) if !index.has_file(file) && self.checks_path(file_pointer) => None,
                        Some(file) => index.check_line(file, value),
                    },
                },
            };
            if let Some(message) = problem {
                issues.push(ValidationIssue {
                    path: format!("{path}{}", rule.pointer),
                    message: format!("ungrounded (rule `{}`): {message}", rule.kind.as_str()),
                });
            }
        }
        issues.len() == before
    }

    fn checks_path(&self, pointer: &str) -> bool {
        self.rules.iter().any(|r| r.kind == RuleKind::Path && r.pointer == pointer)
    }
}

const EXAMPLE: &str = r#"[{"pointer": "/evidence", "rule": "quote"}, {"pointer": "/file", "rule": "path"}, {"pointer": "/line", "rule": "line", "file": "/file"}]"#;

fn parse_rule(index: usize, value: &Value) -> Result<Rule, String> {
    let at = |what: String| format!("`{GROUNDING_KEY}`[{index}]: {what}");
    let Some(object) = value.as_object() else {
        return Err(at(r#"must be an object such as {"pointer": "/file", "rule": "path"}"#.to_string()));
    };
    if let Some(unknown) = object.keys().find(|k| !["pointer", "rule", "file"].contains(&k.as_str())) {
        return Err(at(format!("unknown key `{unknown}` (a rule has `pointer`, `rule` and, for `line`, `file`)")));
    }
    let pointer = |key: &str| match object.get(key) {
        Some(Value::String(p)) if p.starts_with('/') => Ok(Some(p.clone())),
        None => Ok(None),
        Some(_) => Err(at(format!("`{key}` must be a JSON Pointer into a finding, such as \"/file\""))),
    };
    let Some(own) = pointer("pointer")? else {
        return Err(at("`pointer` is missing: the finding's field the rule checks, such as \"/file\"".to_string()));
    };
    let kind = match object.get("rule").and_then(Value::as_str) {
        Some("quote") => RuleKind::Quote,
        Some("path") => RuleKind::Path,
        Some("line") => RuleKind::Line,
        _ => return Err(at("`rule` must be one of \"quote\", \"path\", \"line\"".to_string())),
    };
    let file = pointer("file")?;
    if file.is_some() && kind != RuleKind::Line {
        return Err(at(format!("`file` belongs to a `line` rule, not to `{}`", kind.as_str())));
    }
    Ok(Rule { pointer: own, kind, file })
}

fn parse_marker(value: &Value) -> Result<regex::Regex, String> {
    let Some(pattern) = value.as_str() else {
        return Err(format!("`{FILE_MARKER_KEY}` must be a regex string such as \"^=== (.+) ===$\""));
    };
    let regex = regex::RegexBuilder::new(pattern)
        .size_limit(MAX_MARKER_REGEX_BYTES * 16)
        .build()
        .map_err(|e| format!("`{FILE_MARKER_KEY}` is not a valid regex: {e}"))?;
    if pattern.len() > MAX_MARKER_REGEX_BYTES || regex.captures_len() < 2 {
        return Err(format!("`{FILE_MARKER_KEY}` needs a capture group for the file name, such as \"^=== (.+) ===$\""));
    }
    Ok(regex)
}

/// Which lines of a file a finding may name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lines {
    /// A whole file of this many lines: 1..=n.
    Count(u64),
    /// A file of a diff: the new side of its hunks, inclusive ranges.
    Hunks(Vec<(u64, u64)>),
    /// A file the diff deletes: it has no new side.
    Deleted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Diff,
    Marked,
    Single,
}

/// A source read once: its files and their lines, and its text for quotes.
#[derive(Debug)]
pub struct SourceIndex<'a> {
    source: SourceText<'a>,
    kind: Kind,
    files: BTreeMap<String, Lines>,
    /// A diff's renames, old path → new path, for the message naming the right one.
    renamed: BTreeMap<String, String>,
    /// The texts a quote may be found in, whitespace normalised: the whole source and, for a
    /// diff, each side without the line prefixes.
    haystacks: Vec<String>,
}

impl<'a> SourceIndex<'a> {
    fn build(source: SourceText<'a>, marker: Option<&regex::Regex>) -> Self {
        let mut haystacks = vec![normalize(source.text)];
        if let Some(diff) = parse_diff(source.text) {
            haystacks.push(normalize(&diff.new_side));
            haystacks.push(normalize(&diff.old_side));
            return Self { source, kind: Kind::Diff, files: diff.files, renamed: diff.renamed, haystacks };
        }
        if let Some(files) = marker.and_then(|m| marked_files(source.text, m)) {
            return Self { source, kind: Kind::Marked, files, renamed: BTreeMap::new(), haystacks };
        }
        let files = BTreeMap::from([(source.id.to_string(), Lines::Count(line_count(source.text)))]);
        Self { source, kind: Kind::Single, files, renamed: BTreeMap::new(), haystacks }
    }

    pub fn has_file(&self, name: &str) -> bool {
        self.files.contains_key(name)
    }

    fn check_quote(&self, value: &Value) -> Option<String> {
        let Some(quote) = value.as_str() else {
            return Some("a quote must be a string".to_string());
        };
        let needle = normalize(quote);
        if needle.is_empty() {
            return Some("the quote is empty: quote the source's words".to_string());
        }
        if self.haystacks.iter().any(|h| h.contains(&needle)) {
            return None;
        }
        let shown: String = needle.chars().take(MAX_QUOTED_CHARS).collect();
        let more = if needle.chars().count() > MAX_QUOTED_CHARS { "…" } else { "" };
        Some(format!("{shown:?}{more} does not appear in the source (whitespace ignored); quote it exactly"))
    }

    fn check_path(&self, value: &Value) -> Option<String> {
        let Some(name) = value.as_str() else {
            return Some("a file must be named by a string".to_string());
        };
        if self.files.contains_key(name) {
            return None;
        }
        Some(self.no_such_file(name))
    }

    fn no_such_file(&self, name: &str) -> String {
        if let Some(new) = self.renamed.get(name) {
            return format!("{name:?} is renamed to {new:?} by the diff; name the new path");
        }
        match self.kind {
            Kind::Single => {
                format!("{name:?} is not the source's file: the source is one file, named {:?}", self.source.id)
            }
            Kind::Diff | Kind::Marked => {
                let what = if self.kind == Kind::Diff { "the diff" } else { "the source" };
                format!("{name:?} is not a file in {what}; its files are {}", self.listed())
            }
        }
    }

    fn listed(&self) -> String {
        let mut names: Vec<String> = self.files.keys().take(MAX_LISTED).map(|n| format!("{n:?}")).collect();
        if self.files.len() > MAX_LISTED {
            names.push(format!("and {} more", self.files.len() - MAX_LISTED));
        }
        names.join(", ")
    }

    fn check_line(&self, file: &str, value: &Value) -> Option<String> {
        let line = match line_number(value) {
            Ok(line) => line,
            Err(why) => return Some(why),
        };
        let Some(lines) = self.files.get(file) else {
            return Some(format!("line {line} cannot be checked: {}", self.no_such_file(file)));
        };
        match lines {
            Lines::Count(n) if (1..=*n).contains(&line) => None,
            Lines::Count(n) => Some(format!("{file:?} has {n} lines; line {line} is not one of them")),
            Lines::Hunks(ranges) if ranges.iter().any(|(a, b)| (*a..=*b).contains(&line)) => None,
            Lines::Hunks(ranges) if ranges.is_empty() => {
                Some(format!("the diff changes no lines of {file:?}, so line {line} is not in it"))
            }
            Lines::Hunks(ranges) => {
                let shown: Vec<String> = ranges
                    .iter()
                    .take(MAX_LISTED)
                    .map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
                    .collect();
                let more = if ranges.len() > MAX_LISTED { ", …" } else { "" };
                Some(format!(
                    "line {line} of {file:?} is outside every hunk of the diff (new-side lines {}{more})",
                    shown.join(", ")
                ))
            }
            Lines::Deleted => Some(format!("{file:?} is deleted by the diff: it has no new-side line {line}")),
        }
    }

    fn check_whole_line(&self, value: &Value) -> Option<String> {
        let line = match line_number(value) {
            Ok(line) => line,
            Err(why) => return Some(why),
        };
        let n = line_count(self.source.text);
        (!(1..=n).contains(&line)).then(|| format!("the source has {n} lines; line {line} is not one of them"))
    }
}

/// A 1-based line number: an integer, or a float with no fraction (`10.0` is line 10).
fn line_number(value: &Value) -> Result<u64, String> {
    let integral = value.as_u64().or_else(|| {
        let f = value.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 9.0e15)?;
        // Exact below 2^53.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some(f as u64)
    });
    match integral {
        Some(line) if line >= 1 => Ok(line),
        _ => Err(format!("a line must be an integer of 1 or more, not {value}")),
    }
}

fn line_count(text: &str) -> u64 {
    text.lines().count() as u64
}

/// Whitespace runs (any Unicode whitespace, line breaks included) become one space; the ends
/// are trimmed.
fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// A plain multi-file source: each line the marker matches starts a file named by its first
/// group; the lines after it, up to the next marker, are that file's. `None` when no line
/// matches (the source is then one file).
fn marked_files(text: &str, marker: &regex::Regex) -> Option<BTreeMap<String, Lines>> {
    let mut files = BTreeMap::new();
    let mut current: Option<(String, u64)> = None;
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(name) = marker.captures(line).and_then(|c| c.get(1)).map(|m| m.as_str().trim()) {
            if let Some((done, n)) = current.take() {
                files.insert(done, Lines::Count(n));
            }
            current = Some((name.to_string(), 0));
        } else if let Some((_, n)) = current.as_mut() {
            *n += 1;
        }
    }
    if let Some((done, n)) = current {
        files.insert(done, Lines::Count(n));
    }
    (!files.is_empty()).then_some(files)
}

/// What a unified diff says about its files.
#[derive(Debug, Default)]
struct Diff {
    files: BTreeMap<String, Lines>,
    renamed: BTreeMap<String, String>,
    /// Context and added lines without their prefix; removed and context lines likewise.
    new_side: String,
    old_side: String,
}

/// One file's section of a diff, as its headers say it.
#[derive(Debug, Default)]
struct Section {
    git_old: Option<String>,
    git_new: Option<String>,
    old: Option<String>,
    new: Option<String>,
    rename_from: Option<String>,
    rename_to: Option<String>,
    deleted: bool,
    hunks: Vec<(u64, u64)>,
    /// A `+++` header was read: a further `---`/`+++` pair starts the next file.
    headed: bool,
}

impl Section {
    fn finish(self, diff: &mut Diff) {
        let deleted = self.deleted || (self.new.is_none() && self.headed && self.old.is_some());
        let renamed_from = self.rename_from.clone();
        let name = if deleted {
            self.old.or(self.git_old).or(self.rename_from)
        } else {
            self.new.or(self.rename_to).or(self.git_new).or(self.old)
        };
        let Some(name) = name else { return };
        if let Some(from) = renamed_from.filter(|from| *from != name) {
            diff.renamed.insert(from, name.clone());
        }
        let lines = if deleted { Lines::Deleted } else { Lines::Hunks(self.hunks) };
        diff.files.insert(name, lines);
    }
}

/// Reads `text` as a unified diff (git's or plain `diff -u`); `None` when it names no file.
/// Hunk bodies are consumed by their header's counts, so a removed line that reads
/// `--- x` is never taken for a header.
fn parse_diff(text: &str) -> Option<Diff> {
    let mut diff = Diff::default();
    let mut section: Option<Section> = None;
    let (mut old_left, mut new_left) = (0u64, 0u64);
    let lines: Vec<&str> = text.lines().map(|l| l.strip_suffix('\r').unwrap_or(l)).collect();
    for (i, line) in lines.iter().copied().enumerate() {
        if old_left > 0 || new_left > 0 {
            let (prefix, body) = line.split_at(line.chars().next().map_or(0, char::len_utf8));
            let consumed = match prefix {
                // Some tools drop the space of an empty context line.
                " " | "" => {
                    old_left = old_left.saturating_sub(1);
                    new_left = new_left.saturating_sub(1);
                    push_line(&mut diff.old_side, body);
                    push_line(&mut diff.new_side, body);
                    true
                }
                "-" => {
                    old_left = old_left.saturating_sub(1);
                    push_line(&mut diff.old_side, body);
                    true
                }
                "+" => {
                    new_left = new_left.saturating_sub(1);
                    push_line(&mut diff.new_side, body);
                    true
                }
                "\\" => true,
                _ => {
                    // A hunk shorter than its header said: read the line as a header.
                    (old_left, new_left) = (0, 0);
                    false
                }
            };
            if consumed {
                continue;
            }
        }
        if let Some(rest) = line.strip_prefix("diff --git ") {
            if let Some(done) = section.take() {
                done.finish(&mut diff);
            }
            let (old, new) = git_header_paths(rest);
            section = Some(Section { git_old: old, git_new: new, ..Section::default() });
        } else if let Some(rest) = line.strip_prefix("--- ") {
            if !lines.get(i + 1).is_some_and(|next| next.starts_with("+++ ")) {
                continue;
            }
            // A plain diff has no `diff --git` line: its `---` starts the next file.
            if section.as_ref().is_none_or(|s| s.headed) {
                if let Some(done) = section.take() {
                    done.finish(&mut diff);
                }
                section = Some(Section::default());
            }
            if let Some(s) = section.as_mut() {
                s.old = header_path(rest, "a/");
            }
        } else if let Some(rest) = line.strip_prefix("+++ ") {
            if let Some(s) = section.as_mut() {
                s.new = header_path(rest, "b/");
                s.headed = true;
            }
        } else if let Some(rest) = line.strip_prefix("rename from ") {
            if let Some(s) = section.as_mut() {
                s.rename_from = Some(unquote(rest));
            }
        } else if let Some(rest) = line.strip_prefix("rename to ") {
            if let Some(s) = section.as_mut() {
                s.rename_to = Some(unquote(rest));
            }
        } else if line.starts_with("deleted file mode") {
            if let Some(s) = section.as_mut() {
                s.deleted = true;
            }
        } else if let Some(rest) = line.strip_prefix("@@ ") {
            let (Some(s), Some((old, new))) = (section.as_mut(), hunk_header(rest)) else { continue };
            (old_left, new_left) = (old, new.1);
            if new.1 > 0 {
                s.hunks.push((new.0, new.0 + new.1 - 1));
            }
        }
    }
    if let Some(done) = section.take() {
        done.finish(&mut diff);
    }
    (!diff.files.is_empty()).then_some(diff)
}

fn push_line(side: &mut String, line: &str) {
    side.push_str(line);
    side.push('\n');
}

/// `-a,b +c,d @@ …`: the old side's line count and the new side's (start, count). A count
/// left out is 1.
fn hunk_header(rest: &str) -> Option<(u64, (u64, u64))> {
    let mut parts = rest.split(' ');
    let old = parts.next()?.strip_prefix('-')?;
    let new = parts.next()?.strip_prefix('+')?;
    let range = |r: &str| -> Option<(u64, u64)> {
        match r.split_once(',') {
            Some((start, count)) => Some((start.parse().ok()?, count.parse().ok()?)),
            None => Some((r.parse().ok()?, 1)),
        }
    };
    Some((range(old)?.1, range(new)?))
}

/// The path a `---`/`+++` header names: `None` for `/dev/null`; a tab and what follows (a
/// timestamp) and git's `a/`/`b/` prefix are dropped.
fn header_path(rest: &str, prefix: &str) -> Option<String> {
    let raw = if rest.starts_with('"') { rest } else { rest.split('\t').next().unwrap_or(rest) };
    let path = unquote(raw.trim_end());
    if path == "/dev/null" {
        return None;
    }
    Some(path.strip_prefix(prefix).map_or_else(|| path.clone(), str::to_string))
}

/// `a/old b/new` from a `diff --git` line: quoted paths are read as such, otherwise the line
/// is split where the two halves name the same file, or else at the last ` b/`.
fn git_header_paths(rest: &str) -> (Option<String>, Option<String>) {
    let strip = |p: String, prefix: &str| p.strip_prefix(prefix).map_or_else(|| p.clone(), str::to_string);
    if rest.starts_with('"') || rest.ends_with('"') {
        let (old, new) = split_quoted(rest);
        return (old.map(|p| strip(p, "a/")), new.map(|p| strip(p, "b/")));
    }
    let half = rest.len() / 2;
    if rest.len() % 2 == 1 && rest.is_char_boundary(half) && rest.as_bytes()[half] == b' ' {
        let (old, new) = (&rest[..half], &rest[half + 1..]);
        if old.strip_prefix("a/").is_some_and(|o| Some(o) == new.strip_prefix("b/")) {
            return (Some(strip(old.to_string(), "a/")), Some(strip(new.to_string(), "b/")));
        }
    }
    match rest.rfind(" b/") {
        Some(at) => (Some(strip(rest[..at].to_string(), "a/")), Some(strip(rest[at + 1..].to_string(), "b/"))),
        None => (None, None),
    }
}

/// Two paths, either of them in git's quotes.
fn split_quoted(rest: &str) -> (Option<String>, Option<String>) {
    let (first, tail) = if rest.starts_with('"') {
        match closing_quote(rest) {
            Some(end) => (&rest[..=end], rest[end + 1..].trim_start()),
            None => return (None, None),
        }
    } else {
        match rest.find(" \"") {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => return (None, None),
        }
    };
    (Some(unquote(first)), Some(unquote(tail)))
}

fn closing_quote(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices().skip(1) {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return Some(i),
            _ => escaped = false,
        }
    }
    None
}

/// Git quotes a path with unusual bytes (`core.quotePath`): C escapes, non-ASCII as octal
/// bytes (`"b/caf\303\251.rs"`). Anything else is returned as it is.
fn unquote(text: &str) -> String {
    let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return text.to_string();
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let mut chars = inner.bytes().peekable();
    while let Some(b) = chars.next() {
        if b != b'\\' {
            bytes.push(b);
            continue;
        }
        match chars.next() {
            Some(b'n') => bytes.push(b'\n'),
            Some(b't') => bytes.push(b'\t'),
            Some(b'r') => bytes.push(b'\r'),
            Some(b'a') => bytes.push(0x07),
            Some(b'b') => bytes.push(0x08),
            Some(b'f') => bytes.push(0x0c),
            Some(b'v') => bytes.push(0x0b),
            Some(d @ b'0'..=b'7') => {
                let mut value = u32::from(d - b'0');
                for _ in 0..2 {
                    match chars.peek() {
                        Some(&o @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(o - b'0');
                            chars.next();
                        }
                        _ => break,
                    }
                }
                bytes.push(u8::try_from(value & 0xff).unwrap_or(b'?'));
            }
            Some(other) => bytes.push(other),
            None => bytes.push(b'\\'),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests;
