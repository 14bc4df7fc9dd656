//! Durations ("5s", "5m", "24h", "7d", "250ms") and sizes ("16MiB", "8MB", 1024).

use std::time::Duration;

use serde::Deserialize;

/// A size or duration as written: a number or a string with a unit.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Quantity {
    Number(u64),
    Text(String),
}

/// Parses a duration; a bare number means seconds.
pub fn parse_duration(q: &Quantity) -> Result<Duration, String> {
    let text = match q {
        Quantity::Number(n) => return Ok(Duration::from_secs(*n)),
        Quantity::Text(t) => t.trim(),
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a duration such as \"5s\", \"5m\", \"24h\""))?;
    let ms = match unit.trim() {
        "ms" => n,
        "" | "s" => n.saturating_mul(1000),
        "m" => n.saturating_mul(60_000),
        "h" => n.saturating_mul(3_600_000),
        "d" => n.saturating_mul(86_400_000),
        other => {
            return Err(format!(
                "unknown duration unit `{other}` (use ms, s, m, h, d)"
            ));
        }
    };
    Ok(Duration::from_millis(ms))
}

/// Parses a size in bytes; a bare number means bytes.
pub fn parse_size(q: &Quantity) -> Result<u64, String> {
    let text = match q {
        Quantity::Number(n) => return Ok(*n),
        Quantity::Text(t) => t.trim(),
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size such as \"16MiB\""))?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use B, KiB, MiB, GiB, TiB)"
            ));
        }
    };
    Ok(n.saturating_mul(factor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Quantity {
        Quantity::Text(s.into())
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration(&t("5s")), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration(&t("5m")), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration(&t("24h")), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration(&t("7d")), Ok(Duration::from_secs(604_800)));
        assert_eq!(parse_duration(&t("250ms")), Ok(Duration::from_millis(250)));
        assert_eq!(
            parse_duration(&Quantity::Number(3)),
            Ok(Duration::from_secs(3))
        );
        assert!(parse_duration(&t("5 parsecs")).is_err());
        assert!(parse_duration(&t("s")).is_err());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size(&t("16MiB")), Ok(16 << 20));
        assert_eq!(parse_size(&t("8MB")), Ok(8_000_000));
        assert_eq!(parse_size(&Quantity::Number(10)), Ok(10));
        assert!(parse_size(&t("lots")).is_err());
        assert!(parse_size(&t("3 furlongs")).is_err());
    }
}

/// `rate_limit = "10/s"` (or `/m`, `/h`): so many per interval (SPEC §5.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub per: std::time::Duration,
}

pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let bad = || format!("`{text}` is not a rate: write N/s, N/m or N/h (N at least 1)");
    let (n, unit) = text.trim().split_once('/').ok_or_else(bad)?;
    let count: u32 = n.trim().parse().map_err(|_| bad())?;
    let per = match unit.trim() {
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        _ => return Err(bad()),
    };
    match count {
        0 => Err(bad()),
        count => Ok(Rate { count, per }),
    }
}
