//! The guard pipeline's configuration: policy by tool-name glob, a per-run budget and a rate
//! limit. Budgets are counted in the checkpoint; the rate limit is counted in memory, per
//! registry, i.e. per runner process.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use arbor_shared::status::FieldViolation;
use globset::{Glob, GlobMatcher};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    #[default]
    Allow,
    Deny,
    /// Suspend for an approval before the call runs.
    Ask,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "allow" => Self::Allow,
            "deny" => Self::Deny,
            "ask" => Self::Ask,
            _ => return None,
        })
    }
}

/// Server-level guard settings (a `[guards]` TOML table). Without rules every tool is allowed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardConfig {
    /// First matching rule wins; a node's own `policy` overrides them all.
    #[serde(default)]
    pub rules: Vec<GuardRule>,
    /// Tool calls one run may make (admitted calls, whatever their outcome).
    #[serde(default)]
    pub budget_per_run: Option<u32>,
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardRule {
    /// Glob over tool names, e.g. `ledger.*`.
    pub tool: String,
    pub policy: Policy,
}

/// At most `calls` calls of one tool per sliding `window_ms`, per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub calls: u32,
    pub window_ms: u64,
}

impl GuardConfig {
    pub fn validate(&self) -> Result<(), Vec<FieldViolation>> {
        let mut out = Vec::new();
        for (i, rule) in self.rules.iter().enumerate() {
            if let Err(e) = Glob::new(&rule.tool) {
                out.push(FieldViolation::new(
                    format!("rules[{i}].tool"),
                    e.to_string(),
                ));
            }
        }
        if let Some(rate) = self.rate_limit
            && (rate.calls == 0 || rate.window_ms == 0)
        {
            out.push(FieldViolation::new(
                "rate_limit",
                "calls and window_ms must be positive",
            ));
        }
        if out.is_empty() { Ok(()) } else { Err(out) }
    }
}

/// Compiled guard configuration plus the in-memory rate-limit windows.
pub(crate) struct Guards {
    config: GuardConfig,
    /// `None` matcher: the glob did not compile, so the rule matches everything with Deny.
    rules: Vec<(Option<GlobMatcher>, Policy)>,
    windows: Mutex<HashMap<String, VecDeque<u64>>>,
}

impl Guards {
    pub fn new(config: GuardConfig) -> Self {
        let rules = config
            .rules
            .iter()
            .map(|r| match Glob::new(&r.tool) {
                Ok(glob) => (Some(glob.compile_matcher()), r.policy),
                Err(_) => (None, Policy::Deny),
            })
            .collect();
        Self {
            config,
            rules,
            windows: Mutex::new(HashMap::new()),
        }
    }

    pub fn config(&self) -> &GuardConfig {
        &self.config
    }

    pub fn policy_for(&self, tool: &str) -> Policy {
        self.rules
            .iter()
            .find(|(m, _)| m.as_ref().is_none_or(|m| m.is_match(tool)))
            .map_or(Policy::Allow, |(_, p)| *p)
    }

    pub fn budget_per_run(&self) -> Option<u32> {
        self.config.budget_per_run
    }

    /// Counts a call against the rate limit. When the window is full, nothing is counted and the
    /// answer is when its oldest call leaves it (the earliest time a call can be admitted).
    pub fn admit(&self, tool: &str, now_ms: u64) -> Result<(), u64> {
        let Some(limit) = self.config.rate_limit else {
            return Ok(());
        };
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let window = windows.entry(tool.to_string()).or_default();
        while window
            .front()
            .is_some_and(|&t| t.saturating_add(limit.window_ms) <= now_ms)
        {
            window.pop_front();
        }
        if window.len() >= limit.calls as usize {
            let oldest = window.front().copied().unwrap_or(now_ms);
            return Err(oldest.saturating_add(limit.window_ms).max(now_ms));
        }
        window.push_back(now_ms);
        Ok(())
    }
}
