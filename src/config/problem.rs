//! A config problem: the key path and what is wrong with it; every one is reported in
//! one run.

/// One bad key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

/// Every problem found in one config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<Problem>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "invalid config ({} problem(s)):", self.0.len())?;
        for p in &self.0 {
            writeln!(f, "  {}: {}", p.path, p.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
