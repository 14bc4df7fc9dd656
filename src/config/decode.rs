//! Typed decoding of one config table that reports every bad key, not just the first:
//! serde stops at the first error, so each bad key is noted with its path, taken out,
//! and the table decoded again.

use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;

use super::problem::Problem;

/// More than this many bad keys in one table are not worth listing one by one.
const MAX_PER_TABLE: usize = 32;

/// Decodes `value`; every bad key becomes a problem under `path`. The result (with bad
/// keys dropped, so defaults apply) lets later checks find further problems in one run.
pub fn decode<T: DeserializeOwned>(path: &str, value: &toml::Value) -> (Option<T>, Vec<Problem>) {
    let mut value = value.clone();
    let mut problems = Vec::new();
    for _ in 0..MAX_PER_TABLE {
        let err = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(t) => return (Some(t), problems),
            Err(e) => e,
        };
        let mut keys = key_path(err.path());
        let message = err.inner().message().trim().to_owned();
        if let Some(unknown) = quoted_after(&message, "unknown field `")
            && keys.last() != Some(&unknown)
        {
            keys.push(unknown);
        }
        let at = join(path, &keys);
        problems.push(Problem {
            path: at,
            message: friendly(&message),
        });
        if message.starts_with("missing field") || !remove(&mut value, &keys) {
            return (None, problems);
        }
    }
    (None, problems)
}

/// The table keys along an error's path (array positions drop out: the whole array goes).
fn key_path(path: &serde_path_to_error::Path) -> Vec<String> {
    let mut keys = Vec::new();
    for segment in path.iter() {
        match segment {
            Segment::Map { key } => keys.push(key.clone()),
            Segment::Seq { .. } | Segment::Enum { .. } | Segment::Unknown => break,
        }
    }
    keys
}

fn join(path: &str, keys: &[String]) -> String {
    let mut out = path.to_owned();
    for k in keys {
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(k);
    }
    out
}

/// Takes the key at `keys` out of the table, so decoding can go on past it.
fn remove(value: &mut toml::Value, keys: &[String]) -> bool {
    let Some((last, parents)) = keys.split_last() else {
        return false;
    };
    let mut table = value;
    for k in parents {
        match table.get_mut(k.as_str()) {
            Some(inner) => table = inner,
            None => return false,
        }
    }
    table
        .as_table_mut()
        .is_some_and(|t| t.remove(last.as_str()).is_some())
}

fn quoted_after(message: &str, prefix: &str) -> Option<String> {
    let rest = message.split_once(prefix)?.1;
    Some(rest.split('`').next()?.to_owned())
}

/// serde's words in an operator's: `expected a whole number, got "three"`.
fn friendly(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (name, expected) = rest.split_once("`, expected ").unwrap_or((rest, ""));
        let name = name.trim_end_matches('`');
        let known: Vec<&str> = expected
            .trim_start_matches("one of ")
            .split(", ")
            .map(|k| k.trim_matches('`'))
            .filter(|k| !k.is_empty())
            .collect();
        let hint = closest(name, &known)
            .map(|k| format!(" (did you mean `{k}`?)"))
            .unwrap_or_default();
        return format!("unknown key{hint}; known keys: {}", known.join(", "));
    }
    if let Some(rest) = message.strip_prefix("invalid type: ")
        && let Some((got, expected)) = rest.split_once(", expected ")
    {
        return format!("expected {}, got {}", plain_type(expected), got_value(got));
    }
    message.to_owned()
}

fn plain_type(expected: &str) -> &str {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" | "i32" | "i64" => "a whole number",
        "a boolean" => "true or false",
        other => other,
    }
}

/// `string "three"` → `"three"`; `integer `5`` → `5`.
fn got_value(got: &str) -> String {
    let value = got.split_once(' ').map_or(got, |(_, v)| v);
    value.trim_matches('`').to_owned()
}

/// The known key nearest to a misspelt one, if it is near enough to be a typo.
pub(super) fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (distance(name, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance, for typo hints only.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_words_become_an_operators() {
        assert_eq!(
            friendly("invalid type: string \"three\", expected u32"),
            "expected a whole number, got \"three\""
        );
        assert_eq!(
            friendly("unknown field `credentail`, expected one of `id`, `credential`, `match`"),
            "unknown key (did you mean `credential`?); known keys: id, credential, match"
        );
        assert_eq!(distance("fsnc", "fsync"), 1);
    }
}
