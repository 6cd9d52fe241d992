//! A string for a simple `pattern`: literals, `.`, `\d` `\w` `\s` (and their negations),
//! character classes, groups with alternatives (the first is taken), anchors and the
//! quantifiers `? * + {n} {n,} {n,m}` (the fewest repetitions allowed). Anything else
//! (look-arounds, back-references) gives up. Whatever it makes is checked with the
//! validator's own regex engine before it is used.

use serde_json::{Value, json};

/// A string the pattern probably matches, or `None` for a construct outside the subset.
pub(super) fn generate(pattern: &str) -> Option<String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut parser = Parser { chars: &chars, at: 0 };
    let out = parser.alternatives()?;
    (parser.at == chars.len()).then_some(out)
}

/// Whether `text` matches `pattern` as JSON Schema's `pattern` means it (unanchored).
pub(super) fn matches(pattern: &str, text: &str) -> bool {
    jsonschema::draft202012::new(&json!({"type": "string", "pattern": pattern}))
        .is_ok_and(|validator| validator.is_valid(&Value::String(text.to_string())))
}

struct Parser<'a> {
    chars: &'a [char],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += 1;
        Some(c)
    }

    /// `a|b|c` up to a closing `)` or the end: the first alternative's string.
    fn alternatives(&mut self) -> Option<String> {
        let first = self.sequence()?;
        while self.peek() == Some('|') {
            self.at += 1;
            self.sequence()?;
        }
        Some(first)
    }

    fn sequence(&mut self) -> Option<String> {
        let mut out = String::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            let (min, _) = self.quantifier()?;
            for _ in 0..min {
                out.push_str(&atom);
            }
        }
        Some(out)
    }

    fn atom(&mut self) -> Option<String> {
        match self.next()? {
            '^' | '$' => Some(String::new()),
            '.' => Some("a".to_string()),
            '\\' => self.escape().map(String::from),
            '[' => self.class().map(String::from),
            '(' => {
                if self.peek() == Some('?') {
                    self.at += 1;
                    if self.next()? != ':' {
                        return None;
                    }
                }
                let inner = self.alternatives()?;
                (self.next()? == ')').then_some(inner)
            }
            '*' | '+' | '?' | '{' | ')' => None,
            c => Some(c.to_string()),
        }
    }

    /// After a backslash: a class shorthand or an escaped literal.
    fn escape(&mut self) -> Option<char> {
        let c = self.next()?;
        Some(match c {
            'd' => '1',
            'w' | 'D' | 'S' => 'a',
            's' => ' ',
            'W' => '-',
            'b' | 'B' | 'A' | 'z' | 'Z' | 'p' | 'P' | 'k' | '1'..='9' => return None,
            'n' => '\n',
            't' => '\t',
            other => other,
        })
    }

    /// `[...]` just after `[`: its first member, or for a negated class a common
    /// character it does not exclude.
    fn class(&mut self) -> Option<char> {
        let negated = self.peek() == Some('^');
        if negated {
            self.at += 1;
        }
        let mut members: Vec<(char, char)> = Vec::new();
        let mut first = true;
        loop {
            let c = self.next()?;
            if c == ']' && !first {
                break;
            }
            first = false;
            let low = if c == '\\' { self.escape()? } else { c };
            if self.peek() == Some('-') && self.chars.get(self.at + 1).is_some_and(|n| *n != ']') {
                self.at += 1;
                let end = self.next()?;
                let high = if end == '\\' { self.escape()? } else { end };
                members.push((low, high));
            } else {
                members.push((low, low));
            }
        }
        if negated {
            return ['a', 'x', '0', '_', ' '].into_iter().find(|c| !members.iter().any(|(l, h)| (*l..=*h).contains(c)));
        }
        members.first().map(|(low, _)| *low)
    }

    /// `(min, max)` repetitions of the atom just read; a lazy or possessive suffix is skipped.
    fn quantifier(&mut self) -> Option<(usize, Option<usize>)> {
        let bounds = match self.peek() {
            Some('?') => (0, Some(1)),
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('{') => {
                let close = self.chars[self.at..].iter().position(|c| *c == '}')? + self.at;
                let body: String = self.chars[self.at + 1..close].iter().collect();
                let (min, max) = match body.split_once(',') {
                    Some((min, max)) => (min.trim().parse().ok()?, max.trim().parse().ok()),
                    None => {
                        let n = body.trim().parse().ok()?;
                        (n, Some(n))
                    }
                };
                self.at = close;
                (min, max)
            }
            _ => return Some((1, Some(1))),
        };
        self.at += 1;
        if matches!(self.peek(), Some('?' | '+')) {
            self.at += 1;
        }
        Some(bounds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_patterns_get_a_matching_string() {
        for pattern in [
            "^[A-Z]{3}-[0-9]+$",
            r"^\d{4}-\d{2}-\d{2}$",
            "^(low|medium|high)$",
            r"^[a-z][a-z0-9_]*$",
            r"^CVE-\d{4}-\d{4,7}$",
            r"^(?:src|lib)/[\w./-]+\.rs$",
            "^[^@]+@[^@]+$",
            "x?y+z{2,3}",
        ] {
            let made = generate(pattern).unwrap_or_else(|| panic!("{pattern}: no string"));
            assert!(matches(pattern, &made), "{pattern}: {made:?}");
        }
    }

    #[test]
    fn constructs_outside_the_subset_give_up() {
        assert_eq!(generate(r"(a)\1"), None);
        assert_eq!(generate("(?=a)a"), None);
        assert!(!matches("^a$", "b"));
    }
}
