//! The token files of `[access]`, one holder per line: a tenant's name and token, or a
//! worker's name, token and the tenants and schemas it may take work of. Blank lines and
//! `#` comments are ignored. Errors name the file and the line, never a token.

use std::path::PathBuf;
use std::sync::Arc;

use super::{LoadError, MIN_TOKEN_LEN, Token, Worker};
use crate::domain::secret::KeySource;
use crate::store::WorkScope;

/// `<tenant> <token>` per line.
pub(super) fn tenant_tokens(source: &KeySource, admin: Option<&Token>) -> Result<Vec<(String, Token)>, LoadError> {
    let taken: Vec<(String, &Token)> = admin.iter().map(|t| ("the admin token".to_string(), *t)).collect();
    read_lines(source, &taken, "tenant", |tenant, rest| {
        if let Some(extra) = rest.first() {
            return Err(format!("expected `<tenant> <token>`, found {extra:?} after the token"));
        }
        tenant_name(tenant)?;
        Ok(tenant.to_string())
    })
}

/// `<worker> <token> [tenants=a,b] [schemas=x@1,y@2]` per line: without `tenants=` the
/// worker takes every tenant's work, without `schemas=` every schema's.
pub(super) fn worker_tokens(
    source: &KeySource,
    taken: &[(String, &Token)],
) -> Result<Vec<(Arc<Worker>, Token)>, LoadError> {
    read_lines(source, taken, "worker", |name, rest| {
        if name.chars().any(char::is_control) || name.len() > 256 {
            return Err(format!("worker name {name:?} must be 1-256 characters without control characters"));
        }
        let mut scope = WorkScope::default();
        for field in rest {
            let (key, list) = field.split_once('=').ok_or_else(|| {
                format!("expected `tenants=a,b` or `schemas=name@version,…` after the token, found {field:?}")
            })?;
            let names: Vec<String> = list.split(',').map(str::to_string).collect();
            if names.iter().any(String::is_empty) {
                return Err(format!("{key}= lists an empty name"));
            }
            let slot = match key {
                "tenants" => {
                    names.iter().try_for_each(|t| tenant_name(t))?;
                    &mut scope.tenants
                }
                "schemas" => {
                    if let Some(bad) = names.iter().find(|s| !s.contains('@')) {
                        return Err(format!("schema {bad:?} needs its version, as in `code-review@1`"));
                    }
                    &mut scope.schemas
                }
                other => return Err(format!("unknown field {other:?}: a worker line takes `tenants=` and `schemas=`")),
            };
            if slot.replace(names).is_some() {
                return Err(format!("{key}= is given twice"));
            }
        }
        Ok(Arc::new(Worker { name: name.to_string(), scope }))
    })
}

fn tenant_name(tenant: &str) -> Result<(), String> {
    if crate::service::is_tenant_name(tenant) {
        Ok(())
    } else {
        Err(format!("tenant {tenant:?} can never match an extraction: tenants are 1-128 characters of [A-Za-z0-9._-]"))
    }
}

/// Reads `<name> <token> <rest…>` lines, each holder made by `holder`. A token must be
/// long enough and belong to no one else: not to anyone in `taken` (the admin, the
/// tenants) nor to an earlier line.
fn read_lines<H>(
    source: &KeySource,
    taken: &[(String, &Token)],
    kind: &str,
    holder: impl Fn(&str, &[&str]) -> Result<H, String>,
) -> Result<Vec<(H, Token)>, LoadError> {
    let text = source.load_secret()?;
    let refuse = |n: usize, reason: String| LoadError::Refused {
        path: PathBuf::from(source.to_string()),
        reason: format!("line {n}: {reason}"),
    };
    let mut out: Vec<(H, Token, String)> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let n = index + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, token, rest @ ..] = fields.as_slice() else {
            return Err(refuse(n, format!("expected `<{kind}> <token>`")));
        };
        let made = holder(name, rest).map_err(|reason| refuse(n, reason))?;
        let token = Token::new(token);
        let whose = format!("the token of {kind} {name:?}");
        if token.0.len() < MIN_TOKEN_LEN {
            return Err(refuse(n, format!("{whose} is shorter than {MIN_TOKEN_LEN} characters")));
        }
        if let Some((other, _)) = taken.iter().find(|(_, t)| t.matches(&token.0)) {
            return Err(refuse(n, format!("{whose} is {other}")));
        }
        if let Some((_, _, first)) = out.iter().find(|(_, t, _)| t.matches(&token.0)) {
            return Err(refuse(n, format!("{whose} is already on {first}")));
        }
        out.push((made, token, format!("line {n} ({kind} {name:?})")));
    }
    Ok(out.into_iter().map(|(holder, token, _)| (holder, token)).collect())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn source(dir: &tempfile::TempDir, text: &str) -> KeySource {
        let path = dir.path().join("workers");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        KeySource::File(path)
    }

    #[test]
    fn worker_lines_carry_their_scope() {
        let dir = tempfile::tempdir().unwrap();
        let text = "# workers\ntriage worker-token-0001 tenants=acme,globex\nall worker-token-0002\n\
                    reviews worker-token-0003 schemas=code-review@1 tenants=acme\n";
        let workers = worker_tokens(&source(&dir, text), &[]).unwrap();
        let scopes: Vec<(&str, &WorkScope)> = workers.iter().map(|(w, _)| (w.name.as_str(), &w.scope)).collect();
        assert_eq!(scopes[0].1.tenants.as_deref(), Some(&["acme".to_string(), "globex".to_string()][..]));
        assert_eq!(scopes[0].1.schemas, None);
        assert_eq!(scopes[1], ("all", &WorkScope::default()));
        assert_eq!(scopes[2].1.schemas.as_deref(), Some(&["code-review@1".to_string()][..]));
        assert!(scopes[2].1.covers("acme", "code-review@1") && !scopes[2].1.covers("globex", "code-review@1"));
    }

    #[test]
    fn bad_worker_lines_are_refused_by_line_without_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let admin = Token::new("admin-token-00001");
        let acme = Token::new("tenant-token-0001");
        let taken = [("the admin token".to_string(), &admin), ("the token of tenant \"acme\"".to_string(), &acme)];
        let refused = [
            ("w worker-token-0001 teams=a\n", "line 1: unknown field \"teams\""),
            ("w worker-token-0001 acme\n", "line 1: expected `tenants=a,b`"),
            ("w worker-token-0001 tenants=ac/me\n", "line 1: tenant \"ac/me\" can never match"),
            ("w worker-token-0001 tenants=a,,b\n", "line 1: tenants= lists an empty name"),
            ("w worker-token-0001 schemas=code-review\n", "needs its version"),
            ("w worker-token-0001 tenants=a tenants=b\n", "tenants= is given twice"),
            ("w short-token\n", "line 1: the token of worker \"w\" is shorter than 16"),
            ("w admin-token-00001\n", "line 1: the token of worker \"w\" is the admin token"),
            ("w tenant-token-0001\n", "is the token of tenant \"acme\""),
            ("a worker-token-0001\n\nb worker-token-0001\n", "line 3: the token of worker \"b\" is already on line 1"),
            ("lonely\n", "line 1: expected `<worker> <token>`"),
        ];
        for (text, want) in refused {
            let message = worker_tokens(&source(&dir, text), &taken).unwrap_err().to_string();
            assert!(message.contains(want), "{text:?}: {message}");
            assert!(!message.contains("token-000"), "the token is never printed: {message}");
        }
    }
}
