use serde_json::{Value, json};

use super::*;

/// `git diff` output: a modified file with two hunks (one ending without a newline), a new
/// file, a deleted file, a renamed file with a change, a pure rename, and a file whose
/// quoted name is not ASCII.
const DIFF: &str = "\
diff --git a/src/lib.rs b/src/lib.rs
index 3b18e51..a9c2f0d 100644
--- a/src/lib.rs
+++ b/src/lib.rs
@@ -1,4 +1,5 @@
 use std::io;
+use std::fs;
 
 fn main() {
     let x = 1;
@@ -20,3 +21,4 @@ fn helper() {
     let y = 2;
-    y
+    let z = y.unwrap();
+    z
 }
\\ No newline at end of file
diff --git a/src/new.rs b/src/new.rs
new file mode 100644
index 0000000..e69de29
--- /dev/null
+++ b/src/new.rs
@@ -0,0 +1,3 @@
+pub fn fresh() {
+    todo!()
+}
diff --git a/src/old.rs b/src/old.rs
deleted file mode 100644
index e69de29..0000000
--- a/src/old.rs
+++ /dev/null
@@ -1,2 +0,0 @@
-fn gone() {}
--- a comment that looks like a header
diff --git a/src/before.rs b/src/after.rs
similarity index 90%
rename from src/before.rs
rename to src/after.rs
index 1111111..2222222 100644
--- a/src/before.rs
+++ b/src/after.rs
@@ -7 +7 @@
-    old();
+    new();
diff --git a/docs/a b.md b/docs/c d.md
similarity index 100%
rename from docs/a b.md
rename to docs/c d.md
diff --git \"a/caf\\303\\251.rs\" \"b/caf\\303\\251.rs\"
index 1111111..2222222 100644
--- \"a/caf\\303\\251.rs\"
+++ \"b/caf\\303\\251.rs\"
@@ -3,2 +3,2 @@
 let prix = \"5 €\";
-let taxe = 1;
+let taxe = 2;
";

fn grounding(rules: Value) -> Grounding {
    Grounding::parse(Some(&rules), None).unwrap().unwrap()
}

fn code_review() -> Grounding {
    grounding(json!([{"pointer": "/file", "rule": "path"}, {"pointer": "/line", "rule": "line", "file": "/file"}]))
}

fn issues(g: &Grounding, text: &str, finding: Value) -> Vec<ValidationIssue> {
    let index = g.index(SourceText { id: "review#1", text });
    let mut issues = Vec::new();
    let grounded = g.check(&index, &finding, "/findings/0", &mut issues);
    assert_eq!(grounded, issues.is_empty());
    issues
}

fn at(file: &str, line: Value) -> Value {
    json!({"file": file, "line": line})
}

#[test]
fn diff_files_and_hunks_are_indexed() {
    let index = code_review().index(SourceText { id: "review#1", text: DIFF });
    assert_eq!(index.kind, Kind::Diff);
    let files: Vec<&str> = index.files.keys().map(String::as_str).collect();
    assert_eq!(files, ["café.rs", "docs/c d.md", "src/after.rs", "src/lib.rs", "src/new.rs", "src/old.rs"]);
    assert_eq!(index.files["src/lib.rs"], Lines::Hunks(vec![(1, 5), (21, 24)]));
    assert_eq!(index.files["src/new.rs"], Lines::Hunks(vec![(1, 3)]));
    assert_eq!(index.files["src/old.rs"], Lines::Deleted);
    assert_eq!(index.files["src/after.rs"], Lines::Hunks(vec![(7, 7)]));
    assert_eq!(index.files["docs/c d.md"], Lines::Hunks(vec![]));
    assert_eq!(index.files["café.rs"], Lines::Hunks(vec![(3, 4)]));
    assert_eq!(index.renamed["src/before.rs"], "src/after.rs");
    assert_eq!(index.renamed["docs/a b.md"], "docs/c d.md");
}

#[test]
fn path_rule_takes_the_diffs_files_only() {
    let g = code_review();
    for file in ["src/lib.rs", "src/new.rs", "src/after.rs", "café.rs"] {
        let line = if file == "src/after.rs" { 7 } else { 3 };
        assert_eq!(issues(&g, DIFF, at(file, json!(line))), vec![], "{file}");
    }
    let wrong = issues(&g, DIFF, at("src/main.rs", json!(3)));
    assert_eq!(wrong.len(), 1, "the line rule stays quiet about a file the path rule refused: {wrong:?}");
    assert_eq!(wrong[0].path, "/findings/0/file");
    assert!(wrong[0].message.starts_with("ungrounded (rule `path`): \"src/main.rs\" is not a file in the diff"));
    assert!(wrong[0].message.contains("\"src/lib.rs\""), "lists the files: {}", wrong[0].message);
    let prefixed = issues(&g, DIFF, at("b/src/lib.rs", json!(3)));
    assert_eq!(prefixed[0].path, "/findings/0/file", "a header's prefix is not the path");
    let renamed = issues(&g, DIFF, at("src/before.rs", json!(7)));
    assert!(renamed[0].message.contains("renamed to \"src/after.rs\""), "{renamed:?}");
    let not_text = issues(&g, DIFF, json!({"file": 7, "line": 3}));
    assert!(not_text[0].message.contains("must be named by a string"), "{not_text:?}");
}

#[test]
fn line_rule_takes_the_new_side_of_a_hunk() {
    let g = code_review();
    for line in [1, 5, 21, 24] {
        assert_eq!(issues(&g, DIFF, at("src/lib.rs", json!(line))), vec![], "line {line}");
    }
    assert_eq!(issues(&g, DIFF, at("src/lib.rs", json!(22.0))), vec![], "22.0 is line 22");
    for line in [6, 20, 25, 1000] {
        let refused = issues(&g, DIFF, at("src/lib.rs", json!(line)));
        assert_eq!(refused.len(), 1, "line {line}");
        assert_eq!(refused[0].path, "/findings/0/line");
        assert!(refused[0].message.starts_with("ungrounded (rule `line`)"), "{}", refused[0].message);
        assert!(refused[0].message.contains("outside every hunk"), "{}", refused[0].message);
        assert!(refused[0].message.contains("1-5, 21-24"), "names the ranges: {}", refused[0].message);
    }
    let deleted = issues(&g, DIFF, at("src/old.rs", json!(1)));
    assert_eq!(deleted[0].path, "/findings/0/line", "the deleted file is in the diff, its lines are not");
    assert!(deleted[0].message.contains("deleted by the diff"), "{deleted:?}");
    let pure_rename = issues(&g, DIFF, at("docs/c d.md", json!(1)));
    assert!(pure_rename[0].message.contains("changes no lines"), "{pure_rename:?}");
    for bad in [json!(0), json!(-3), json!(2.5), json!("3")] {
        let refused = issues(&g, DIFF, at("src/lib.rs", bad.clone()));
        assert!(refused[0].message.contains("integer of 1 or more"), "{bad}: {refused:?}");
    }
}

#[test]
fn a_removed_line_that_looks_like_a_header_is_body() {
    // `--- a comment…` is the deleted file's second removed line, not a new file.
    let index = code_review().index(SourceText { id: "x", text: DIFF });
    assert!(!index.files.contains_key("comment that looks like a header"));
    assert!(index.haystacks[2].contains("-- a comment that looks like a header"));
}

#[test]
fn plain_unified_diffs_are_read_too() {
    let plain = "--- lib.c\t2024-01-01 10:00:00.000000000 +0000\n+++ lib.c\t2024-01-02 10:00:00.000000000 +0000\n\
                 @@ -10,2 +10,3 @@\n int a;\n+int b;\n int c;\n--- util.c\n+++ util.c\n@@ -1 +1 @@\n-x\n+y\n";
    let g = code_review();
    let index = g.index(SourceText { id: "x", text: plain });
    assert_eq!(index.files["lib.c"], Lines::Hunks(vec![(10, 12)]));
    assert_eq!(index.files["util.c"], Lines::Hunks(vec![(1, 1)]));
    assert_eq!(issues(&g, plain, at("lib.c", json!(12))), vec![]);
    assert_eq!(issues(&g, plain, at("util.c", json!(2)))[0].path, "/findings/0/line");
}

#[test]
fn crlf_diffs_are_read_like_lf_ones() {
    let crlf = DIFF.replace('\n', "\r\n");
    let index = code_review().index(SourceText { id: "x", text: &crlf });
    assert_eq!(index.files["src/lib.rs"], Lines::Hunks(vec![(1, 5), (21, 24)]));
    assert_eq!(index.files["src/old.rs"], Lines::Deleted);
}

#[test]
fn a_single_file_source_is_named_by_its_source_id() {
    let g = code_review();
    let text = "fn a() {\n    b().unwrap();\n}\n";
    assert_eq!(issues(&g, text, at("review#1", json!(3))), vec![]);
    let past_end = issues(&g, text, at("review#1", json!(4)));
    assert_eq!(past_end[0].path, "/findings/0/line");
    assert!(past_end[0].message.contains("has 3 lines"), "{past_end:?}");
    let other = issues(&g, text, at("src/a.rs", json!(1)));
    assert_eq!(other.len(), 1);
    assert!(other[0].message.contains("the source is one file, named \"review#1\""), "{other:?}");
    let no_text = issues(&g, "", at("review#1", json!(1)));
    assert!(no_text[0].message.contains("has 0 lines"), "{no_text:?}");
}

#[test]
fn a_line_rule_without_a_file_counts_the_whole_text() {
    let g = grounding(json!([{"pointer": "/where/line", "rule": "line"}]));
    let text = "one\ntwo\nthree";
    assert_eq!(issues(&g, text, json!({"where": {"line": 3}})), vec![]);
    let refused = issues(&g, text, json!({"where": {"line": 4}}));
    assert_eq!(refused[0].path, "/findings/0/where/line");
    assert!(refused[0].message.contains("the source has 3 lines"), "{refused:?}");
    assert_eq!(issues(&g, text, json!({"elsewhere": 9})), vec![], "an absent field is not checked");
}

#[test]
fn a_line_rule_alone_names_an_unknown_file() {
    let g = grounding(json!([{"pointer": "/line", "rule": "line", "file": "/file"}]));
    let refused = issues(&g, DIFF, at("nope.rs", json!(1)));
    assert_eq!(refused[0].path, "/findings/0/line");
    assert!(refused[0].message.contains("\"nope.rs\" is not a file in the diff"), "{refused:?}");
    let fileless = issues(&g, DIFF, json!({"line": 1}));
    assert!(fileless[0].message.contains("no file at `/file`"), "{fileless:?}");
}

#[test]
fn marked_files_split_a_plain_source() {
    let g = Grounding::parse(
        Some(&json!([{"pointer": "/file", "rule": "path"}, {"pointer": "/line", "rule": "line", "file": "/file"}])),
        Some(&json!("^=== (.+) ===$")),
    )
    .unwrap()
    .unwrap();
    let text = "preamble\n=== a.py ===\nimport os\nprint(os.name)\n=== docs/b.md ===\n# Title\n";
    let index = g.index(SourceText { id: "bundle", text });
    assert_eq!(index.kind, Kind::Marked);
    assert_eq!(index.files["a.py"], Lines::Count(2));
    assert_eq!(index.files["docs/b.md"], Lines::Count(1));
    assert_eq!(issues(&g, text, at("a.py", json!(2))), vec![]);
    assert_eq!(issues(&g, text, at("docs/b.md", json!(2)))[0].path, "/findings/0/line");
    let outside = issues(&g, text, at("bundle", json!(1)));
    assert!(outside[0].message.contains("not a file in the source"), "{outside:?}");
    // Without a marked line the source is one file again.
    assert_eq!(issues(&g, "x\ny\n", at("review#1", json!(2))), vec![]);
}

#[test]
fn quotes_compare_with_whitespace_normalised() {
    let g = grounding(json!([{"pointer": "/evidence", "rule": "quote"}]));
    let text = "The  customer\twas charged twice\non 3 May.\u{00a0}Refund  requested — «vite».";
    for quote in [
        "customer was charged twice on 3 May.",
        "  The customer\n\n was  charged ",
        "Refund requested — «vite»",
        "May. Refund",
    ] {
        assert_eq!(issues(&g, text, json!({"evidence": quote})), vec![], "{quote:?}");
    }
    let absent = issues(&g, text, json!({"evidence": "charged three times"}));
    assert_eq!(absent[0].path, "/findings/0/evidence");
    assert!(absent[0].message.starts_with("ungrounded (rule `quote`): \"charged three times\" does not appear"));
    assert!(issues(&g, text, json!({"evidence": "  \n"}))[0].message.contains("empty"));
    assert!(issues(&g, text, json!({"evidence": ["x"]}))[0].message.contains("must be a string"));
    let long = "x".repeat(500);
    let cut = issues(&g, text, json!({"evidence": long}));
    assert!(cut[0].message.len() < 300, "the message repeats only the quote's start");
}

#[test]
fn quotes_in_a_diff_may_span_its_lines() {
    let g = grounding(json!([{"pointer": "/q", "rule": "quote"}]));
    // New side across an added and a context line, and the removed side.
    assert_eq!(issues(&g, DIFF, json!({"q": "let z = y.unwrap(); z }"})), vec![]);
    assert_eq!(issues(&g, DIFF, json!({"q": "let y = 2; y }"})), vec![]);
    assert_eq!(issues(&g, DIFF, json!({"q": "let prix = \"5 €\"; let taxe = 2;"})), vec![]);
    assert_eq!(issues(&g, DIFF, json!({"q": "+    let z"})), vec![], "the raw text counts too");
    assert_eq!(issues(&g, DIFF, json!({"q": "let z = y.expect()"}))[0].path, "/findings/0/q");
}

#[test]
fn declarations_are_checked() {
    let bad = [
        (json!({"pointer": "/file"}), "`rule` must be one of"),
        (json!([{"rule": "path"}]), "`pointer` is missing"),
        (json!([{"pointer": "file", "rule": "path"}]), "must be a JSON Pointer"),
        (json!([{"pointer": "/file", "rule": "exists"}]), "`rule` must be one of"),
        (json!([{"pointer": "/file", "rule": "path", "file": "/x"}]), "`file` belongs to a `line` rule"),
        (json!([{"pointer": "/file", "rule": "path", "mode": "strict"}]), "unknown key `mode`"),
        (json!(["/file"]), "must be an object"),
    ];
    for (rules, expected) in bad {
        let rules = if rules.is_array() { rules } else { json!([rules]) };
        let err = Grounding::parse(Some(&rules), None).unwrap_err();
        assert!(err.contains(expected), "{rules}: {err}");
    }
    assert!(Grounding::parse(Some(&json!("path")), None).unwrap_err().contains("must be an array"));
    assert!(Grounding::parse(None, None).unwrap().is_none());
    assert!(Grounding::parse(Some(&json!([])), None).unwrap().is_none());
    let rules = json!([{"pointer": "/f", "rule": "path"}]);
    for (marker, expected) in [
        (json!("^=== .+ ===$"), "needs a capture group"),
        (json!("^(unclosed"), "not a valid regex"),
        (json!(3), "must be a regex string"),
    ] {
        let err = Grounding::parse(Some(&rules), Some(&marker)).unwrap_err();
        assert!(err.contains(expected), "{marker}: {err}");
    }
    let lonely = Grounding::parse(None, Some(&json!("^(.+)$"))).unwrap_err();
    assert!(lonely.contains("declares none"), "{lonely}");
}

#[test]
fn unquoting_reads_gits_escapes() {
    assert_eq!(unquote("\"b/caf\\303\\251.rs\""), "b/café.rs");
    assert_eq!(unquote("\"a\\tb\\\"c\\\\\""), "a\tb\"c\\");
    assert_eq!(unquote("plain name"), "plain name");
    assert_eq!(git_header_paths("a/x y b/x y"), (Some("x y".into()), Some("x y".into())));
    assert_eq!(git_header_paths("a/one b/two"), (Some("one".into()), Some("two".into())));
}
